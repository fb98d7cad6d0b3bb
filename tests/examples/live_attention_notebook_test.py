"""The LiveAttention notebook can be watched: its training lasts seconds with many redraws,
and the sub-diagonal it promises forms during them, not before the first (#42: the fit
lasted ~1.8 s with 4 updates). Its cells run in-process, read from the notebook."""

import contextlib
import io
import json
import os

import numpy as np
import pytest

NOTEBOOK = os.path.join(
    os.path.dirname(__file__), "..", "..", "examples", "notebooks", "live_attention.ipynb"
)


@pytest.mark.tf_only
def test_the_notebooks_training_shows_the_sub_diagonal_forming():
    with open(NOTEBOOK, encoding="utf-8") as handle:
        cells = [
            "".join(c["source"]) for c in json.load(handle)["cells"] if c["cell_type"] == "code"
        ]
    # The model, the widget and the fit (not the set-up cell's display, nor the error demo).
    model_cell, widget_cell, fit_cell = (
        next(c for c in cells if marker in c)
        for marker in ("keras.Model(", "LiveAttention(model, probe", "model.fit(")
    )
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for cell in (model_cell, widget_cell, fit_cell):
            exec(compile(cell, "live_attention.ipynb", "exec"), namespace)
    live = namespace["live"]
    assert live.updates >= 15, live.updates
    previous = [
        float(np.diagonal(matrices["self_attention"], offset=-1, axis1=-2, axis2=-1).mean())
        for _, matrices in live.frames
    ]
    # Weak at first, strong at the end, and seen on the way: some redraw halfway there.
    assert previous[0] < 0.4 and previous[-1] > 0.9, np.round(previous, 2)
    assert any(0.4 <= value <= 0.85 for value in previous), np.round(previous, 2)
