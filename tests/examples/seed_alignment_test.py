"""The seed lecture's example, as the notebooks train it, aligns as the lecture draws it.

"il a m' entarté" -> "he hit me with a pie": "he" comes from "il", "me" from
"m'", "hit" and "pie" from "entarté". The stepper and walkthrough notebooks
train the same toy translator in one cell; this test runs that cell's code
(read from the notebook, so the notebook and the test cannot drift apart)
and checks the argmax of each output token's attention row.
"""

import json
import os

import numpy as np
import pytest

NOTEBOOKS = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "notebooks")
SEED = "il a m' entarté"
# output token -> the source token its attention row peaks at, as in the lecture
EXPECTED = {"he": "il", "hit": "entarté", "me": "m'", "pie": "entarté"}


def training_cell(notebook):
    with open(os.path.join(NOTEBOOKS, notebook), encoding="utf-8") as handle:
        cells = json.load(handle)["cells"]
    found = [
        "".join(cell["source"]) for cell in cells
        if cell["cell_type"] == "code" and "Seq2SeqTranslator.from_texts" in "".join(cell["source"])
    ]
    assert len(found) == 1, f"{notebook}: expected one Seq2SeqTranslator training cell, found {len(found)}"
    return found[0]


def test_both_notebooks_train_the_same_translator():
    assert training_cell("decoding_stepper.ipynb") == training_cell("attention_walkthrough.ipynb")


@pytest.mark.tf_only
def test_the_notebooks_translator_aligns_the_seed_example_as_the_lecture_does():
    namespace = {}
    code = training_cell("decoding_stepper.ipynb").replace("print(", "(lambda *a, **k: None)(")
    exec(compile(code, "decoding_stepper.ipynb: training cell", "exec"), namespace)
    translator = namespace["translator"]
    result = translator.translate([SEED])[0]
    assert result.text == "he hit me with a pie"
    alignment = np.asarray(result.alignment)
    source = list(result.source_tokens)
    peaks = {token: source[int(np.argmax(alignment[i]))] for i, token in enumerate(result.tokens)}
    assert {token: peaks[token] for token in EXPECTED} == EXPECTED, np.round(alignment, 2)
