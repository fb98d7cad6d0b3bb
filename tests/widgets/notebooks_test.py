"""Every example notebook runs top to bottom (nbclient, a real kernel), quietly, from the
files it ships."""

import glob
import os
import re
import shutil
import time

import nbformat
import numpy as np
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
        "induction_heads.ipynb",
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
    induction = os.path.basename(path) == "induction_heads.ipynb"
    if induction:  # the test's own last cell: what the claim is recomputed from
        notebook.cells.append(nbformat.v4.new_code_cell(SAVE_INDUCTION_MODEL))
    # Run where a user runs it: beside the files the notebooks ship (their training cells'
    # results, pretrained/); training them again is tests/examples/seed_alignment_test.py's.
    shutil.copytree(os.path.join(os.path.dirname(path), "pretrained"), tmp_path / "pretrained")
    shipped = {f.name: f.stat().st_mtime_ns for f in (tmp_path / "pretrained").iterdir()}
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        # Stopped at once when done: a graceful exit (TensorFlow's teardown) added 2-3 s a
        # notebook, and every file the checks read was written while the cells ran.
        shutdown_kernel="immediate",
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
    if induction:
        assert_induction_claims(notebook, tmp_path / "induction_check.npz")
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


# Appended to induction_heads.ipynb: its trained weights and held-out sequences, saved.
SAVE_INDUCTION_MODEL = """
np.savez("induction_check.npz", held_out=held_out,
         **{v.path.replace("/", "__"): keras.ops.convert_to_numpy(v) for v in model.weights})
"""
# An even spread over the keys a query sees scores about 0.1; the notebook's threshold
# may not claim less than three times that.
LEAST_INDUCTION_THRESHOLD = 0.3


def assert_induction_claims(notebook, saved):
    """The induction notebook's printed numbers, recomputed from its trained weights by a
    float64 NumPy forward pass (not the layers' code, not `capture_attention`), with each
    earlier occurrence found by searching the tokens (not from the repeat length the data
    generator drew): every printed score within rounding of the recomputed one, the best
    induction head above the printed threshold, and the repeated letters' loss far below
    the others'."""
    printed = "".join(
        output.get("text", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("name") == "stdout"
    )
    print(printed)
    table = re.findall(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", printed, re.M)
    best = re.search(
        r"best induction head: layer (\d+), head (\d+), score ([\d.]+) > threshold ([\d.]+)",
        printed,
    )
    losses = re.search(r"gives away: ([\d.]+) nats; on the others: ([\d.]+)", printed)
    assert table and best and losses, printed
    data = np.load(saved)
    weights = {key.replace("__", "/"): data[key].astype("float64") for key in data.files}
    sequences = data["held_out"]
    attention, logits = induction_reference(weights, sequences[:, :-1])
    induction, previous = induction_scores(attention, sequences[:, :-1])
    for layer, head, previous_printed, induction_printed in table:
        layer, head = int(layer), int(head)
        assert abs(previous[layer, head] - float(previous_printed)) <= 0.006, (layer, head)
        assert abs(induction[layer, head] - float(induction_printed)) <= 0.006, (layer, head)
    assert len(table) == induction.size, table
    best_layer, best_head, _, threshold = best.groups()
    threshold = float(threshold)
    assert threshold >= LEAST_INDUCTION_THRESHOLD, threshold
    assert (int(best_layer), int(best_head)) == np.unravel_index(
        induction.argmax(), induction.shape
    )
    assert induction.max() > threshold, induction
    # The loss on the letters the repeat gives away (found again by search: a letter whose
    # previous letter occurred before) and on the others.
    targets = sequences[:, 1:]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    loss = -np.take_along_axis(log_probabilities, targets[..., None], axis=-1)[..., 0]
    given_away = earlier_occurrences(sequences[:, :-1]) >= 0
    repeated, others = loss[given_away].mean(), loss[~given_away].mean()
    assert abs(repeated - float(losses.group(1))) <= 0.002, (repeated, losses.group(1))
    assert abs(others - float(losses.group(2))) <= 0.002, (others, losses.group(2))
    assert repeated < 0.1 * others, (repeated, others)


def earlier_occurrences(tokens):
    """`(B, T)`: the position of each token's earlier occurrence, or -1."""
    found = np.full(tokens.shape, -1)
    for b, sequence in enumerate(tokens):
        for q in range(len(sequence)):
            matches = np.flatnonzero(sequence[:q] == sequence[q])
            if matches.size:
                found[b, q] = matches[-1]
    return found


def induction_scores(attention, tokens):
    """Per layer and head: the mean weight from each query with an earlier occurrence to the
    key after it (induction), and from each query to the one before (previous token)."""
    earlier = earlier_occurrences(tokens)
    batch, query = np.nonzero(earlier >= 0)
    key = earlier[batch, query] + 1
    induction = np.stack([w[batch, :, query, key].mean(axis=0) for w in attention])
    positions = np.arange(1, tokens.shape[1])
    previous = np.stack([w[:, :, positions, positions - 1].mean(axis=(0, 2)) for w in attention])
    return induction, previous


def induction_reference(weights, tokens):
    """The notebook's model in float64 NumPy: token + position embeddings, two pre-norm causal
    attention layers added to the stream, a final norm and the logits. Returns each layer's
    weights `(B, heads, T, T)` and the logits."""

    def norm(x, name, epsilon=1e-3):  # Keras LayerNormalization's default epsilon
        mean, variance = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(variance + epsilon) * weights[f"{name}/gamma"] + weights[
            f"{name}/beta"
        ]

    length = tokens.shape[1]
    stream = weights["token_embedding/embeddings"][tokens]
    stream = stream + weights["position_embedding/embeddings"][:length]
    causal = np.tril(np.ones((length, length), bool))
    attention = []
    for layer in range(2):
        x = norm(stream, f"norm_{layer}")

        def project(part, x=x, layer=layer):  # (B, T, heads, dim)
            name = f"attention_{layer}/{part}"
            return (
                np.einsum("btd,dhk->bthk", x, weights[f"{name}/kernel"]) + weights[f"{name}/bias"]
            )

        query, key, value = project("query"), project("key"), project("value")
        scores = np.einsum("bqhk,bvhk->bhqv", query, key) / np.sqrt(query.shape[-1])
        scores = np.where(causal, scores, -np.inf)
        w = np.exp(scores - scores.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        attention.append(w)
        heads = np.einsum("bhqv,bvhk->bqhk", w, value)
        output = weights[f"attention_{layer}/attention_output/kernel"]
        stream = stream + np.einsum("bqhk,hkd->bqd", heads, output)
        stream = stream + weights[f"attention_{layer}/attention_output/bias"]
    logits = norm(stream, "final_norm") @ weights["logits/kernel"] + weights["logits/bias"]
    return attention, logits


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
