"""Every example notebook runs top to bottom (nbclient, a real kernel), quietly, from the
files it ships."""

import glob
import os
import re
import shutil
import time

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "examples", "notebooks", "*.ipynb")))
# Notebooks of Bokeh figures, not widgets: how many axes their figures have at least, for the
# legibility check.
FIGURE_NOTEBOOKS = {
    "attention_walkthrough.ipynb": 20,
    "figures.ipynb": 20,
    "rollout_and_head_importance.ipynb": 4,
}


def test_there_is_a_notebook_per_component():
    names = {os.path.basename(path) for path in NOTEBOOKS}
    assert {
        "decoding_stepper.ipynb",
        "live_attention.ipynb",
        "attention_explorer.ipynb",
        "figures.ipynb",
        "attention_walkthrough.ipynb",
        "rollout_and_head_importance.ipynb",
    } <= names


@pytest.mark.slow
@pytest.mark.tf_only
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    # The notebooks quiet TensorFlow themselves; nothing from the test's environment helps.
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    notebook = nbformat.read(path, as_version=4)
    # Run where a user runs it: beside the files the notebooks ship (their training cells'
    # results, pretrained/); training them again is tests/examples/seed_alignment_test.py's.
    shutil.copytree(os.path.join(os.path.dirname(path), "pretrained"), tmp_path / "pretrained")
    shipped = {f.name: f.stat().st_mtime_ns for f in (tmp_path / "pretrained").iterdir()}
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.perf_counter()
    client.execute()  # kernel start included
    seconds = time.perf_counter() - start
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    errors = [output for output in outputs if output.get("output_type") == "error"]
    assert not errors
    # ... and loaded them rather than training again.
    assert {f.name: f.stat().st_mtime_ns for f in (tmp_path / "pretrained").iterdir()} == shipped
    # BokehJS is stored once in the saved notebook (Bokeh's loader alone stores it twice).
    from bokeh.resources import INLINE

    bokehjs = INLINE.js_raw[0][5000:5200]
    copies = sum(
        "".join(value).count(bokehjs)
        for output in outputs
        for value in output.get("data", {}).values()
        if isinstance(value, (str, list))
    )
    assert copies == 1, f"BokehJS is stored {copies} times"
    # No block of TensorFlow start-up log lines (absl "I0000 ..." / "E0000 ...").
    stderr = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    for marker in ("absl::InitializeLog", "I0000 ", "E0000 ", "W0000 ", "cuda", "oneDNN"):
        assert marker not in stderr, stderr[:2000]
    # How long it took is reported, not asserted (a timed test measures the machine and its
    # neighbours); what made the notebooks slow -- training again -- is the check above.
    print(f"{os.path.basename(path)}: {seconds:.1f} s, load {os.getloadavg()[0]:.1f}")
    if "rollout_and_head_importance" in path:
        assert_analysis_claims(notebook)
        assert "application/vnd.jupyter.widget-view+json" in mimes_of(notebook)  # the explorer
    name = os.path.basename(path)
    if name in FIGURE_NOTEBOOKS:
        assert_figures_legible(notebook, tmp_path, FIGURE_NOTEBOOKS[name])
    else:  # widgets were displayed (the component notebooks end in a widget)
        assert "application/vnd.jupyter.widget-view+json" in mimes_of(notebook)


def mimes_of(notebook):
    return {
        key
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        for key in output.get("data", {})
    }


def assert_analysis_claims(notebook):
    """The analysis notebook's claims, read back from what it printed (its cells assert them
    too; this keeps them checked if a cell's `assert` goes): rollout's top token is the
    keyword in at least 90% of the examples, masking the k = 1, 2, 3 most important heads
    raises the loss more than masking k random ones does on average, and the explorer's
    grid, given the same data, masks the top head to the same (higher) loss."""
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("name") == "stdout"
    )
    print(printed)
    rollout = re.search(r"rollout finds the keyword in (\d+)%", printed)
    masking = re.findall(r"k=(\d): the most important masked ([\d.]+); random: ([\d.]+)", printed)
    assert rollout and len(masking) == 3, printed
    assert int(rollout.group(1)) >= 90, printed
    for _, most_important, random_mean in masking:
        assert float(most_important) > float(random_mean), printed
    explorer = re.search(r"explorer: .* masked: loss ([\d.]+) -> ([\d.]+)", printed)
    assert explorer, printed
    unmasked, masked = (float(v) for v in explorer.groups())
    assert masked == float(masking[0][1]) and masked > unmasked, printed


def assert_figures_legible(notebook, tmp_path, minimum_axes):
    """The executed notebook's Bokeh figures, opened in chromium at 1280 px (BokehJS is
    inline in its outputs): no two tick labels overlap and no title or label is cut."""
    from keras_attention.widgets.export import CHROMIUM_ARGS
    from keras_attention.widgets.export import find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium installed (run .ci/install-browser.sh)")
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    from tests.widgets import text_boxes

    page_path = tmp_path / "notebook.html"
    page_path.write_text(HTMLExporter().from_notebook_node(notebook)[0], encoding="utf-8")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(page_path.as_uri())
            text_boxes.wait_until_drawn(page)
            text_boxes.assert_legible(page, minimum_axes=minimum_axes)
        finally:
            browser.close()
