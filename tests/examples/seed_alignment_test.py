"""The seed lecture's example, as the notebooks train it, aligns as the lecture draws it.

"il a m' entarté" -> "he hit me with a pie": "he" comes from "il", "me" from
"m'", "hit" and "pie" from "entarté". The stepper and walkthrough notebooks
train the same toy translator in one cell; these tests run that cell's code
(read from the notebook, so the notebook and the test cannot drift apart)
and check the argmax of each output token's attention row: once training
from scratch, once loading the cell's saved result that ships beside the
notebooks (what Voila and a first run show).
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
        "".join(cell["source"])
        for cell in cells
        if cell["cell_type"] == "code" and "Seq2SeqTranslator.from_texts" in "".join(cell["source"])
    ]
    assert len(found) == 1, (
        f"{notebook}: expected one Seq2SeqTranslator training cell, found {len(found)}"
    )
    return found[0]


def test_both_notebooks_train_the_same_translator():
    assert training_cell("decoding_stepper.ipynb") == training_cell("attention_walkthrough.ipynb")


def run_training_cell(directory, monkeypatch):
    monkeypatch.chdir(directory)
    namespace = {"os": os}
    code = training_cell("decoding_stepper.ipynb").replace("print(", "(lambda *a, **k: None)(")
    exec(compile(code, "decoding_stepper.ipynb: training cell", "exec"), namespace)
    return namespace["translator"]


def assert_seed_alignment(translator):
    result = translator.translate([SEED])[0]
    assert result.text == "he hit me with a pie"
    alignment = np.asarray(result.alignment)
    source = list(result.source_tokens)
    peaks = {token: source[int(np.argmax(alignment[i]))] for i, token in enumerate(result.tokens)}
    assert {token: peaks[token] for token in EXPECTED} == EXPECTED, np.round(alignment, 2)


@pytest.mark.tf_only
def test_the_notebooks_translator_aligns_the_seed_example_as_the_lecture_does(
    tmp_path, monkeypatch
):
    translator = run_training_cell(tmp_path, monkeypatch)  # no saved file here: trains
    assert_seed_alignment(translator)
    assert (tmp_path / "pretrained" / "seed_seq2seq.keras").exists()


@pytest.mark.tf_only
def test_the_shipped_translator_is_the_cells_result_and_aligns_the_seed_example(monkeypatch):
    from keras_attention.models import Seq2SeqTranslator

    def no_training(*args, **kwargs):
        raise AssertionError("the notebook trained although its saved translator ships beside it")

    monkeypatch.setattr(Seq2SeqTranslator, "fit", no_training)
    translator = run_training_cell(NOTEBOOKS, monkeypatch)
    assert isinstance(translator, Seq2SeqTranslator)
    assert_seed_alignment(translator)


@pytest.mark.tf_only
def test_the_stepper_notebook_ends_showing_the_greedy_translation(monkeypatch):
    """Run All (and Voila, where no one clicks) shows the stepper as its code cells leave
    it: the cells that force a candidate and step back must end at the greedy translation,
    or the first picture a reader sees is a forced, wrong one ("he hit you", #42)."""
    import contextlib
    import io

    monkeypatch.chdir(NOTEBOOKS)
    with open("decoding_stepper.ipynb", encoding="utf-8") as handle:
        cells = json.load(handle)["cells"]
    namespace = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for cell in cells:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and "TransformerTranslator" not in source:
                exec(compile(source, "decoding_stepper.ipynb", "exec"), namespace)
    stepper = namespace["stepper"]
    tokens = ["he", "hit", "me", "with", "a", "pie", "<end>"]
    assert [s.token for s in stepper.history] == tokens and stepper.position == len(tokens)
    assert stepper.heatmap_source.data["y_token"][:: len(stepper.source_tokens)] == tokens
    assert "(forced)" not in stepper.candidate_figure.title.text
    source = stepper.source_tokens
    peaks = {s.token: source[int(np.argmax(s.attention))] for s in stepper.history}
    assert {token: peaks[token] for token in EXPECTED} == EXPECTED
