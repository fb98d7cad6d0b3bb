"""Every example notebook runs top to bottom (nbclient, a real kernel)."""

import glob
import os

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "examples", "notebooks", "*.ipynb")))


def test_there_is_a_notebook_per_component():
    names = {os.path.basename(path) for path in NOTEBOOKS}
    assert {"decoding_stepper.ipynb", "live_attention.ipynb", "attention_explorer.ipynb",
            "figures.ipynb", "attention_walkthrough.ipynb"} <= names


@pytest.mark.slow
@pytest.mark.tf_only
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [output for cell in notebook.cells for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    assert not errors
    # Widgets were displayed (the component notebooks end in a widget).
    if "walkthrough" not in path and "figures" not in path:
        mimes = {key for cell in notebook.cells for output in cell.get("outputs", [])
                 for key in output.get("data", {})}
        assert "application/vnd.jupyter.widget-view+json" in mimes
