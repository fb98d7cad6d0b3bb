import importlib.util
import os
import random
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "phrase_translation.py")


def _load_example():
    spec = importlib.util.spec_from_file_location("phrase_translation", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grammar_reorders_adjectives_and_expands_entarte():
    example = _load_example()
    rng = random.Random(0)
    pairs = [example.sentence(rng) for _ in range(500)]
    reordered = [(f, e) for f, e in pairs if "noir" in f.split()]
    assert reordered
    for french, english in reordered:
        words = french.split()
        # French: noun then adjective; English: adjective then noun.
        noun = words[words.index("noir") - 1]
        english_words = english.split()
        assert english_words[english_words.index("black") + 1] == example.NOUNS[noun][0]
    pies = [(f, e) for f, e in pairs if f.endswith("a m' entarté")]
    assert pies and all(e.endswith("hit me with a pie") for _, e in pies)


def test_held_out_phrases_are_not_trained_on():
    example = _load_example()
    train, test = example.make_pairs(500, 50, seed=1)
    assert not {f for f, _ in train} & {f for f, _ in test}


@pytest.mark.tf_only
@pytest.mark.slow
def test_phrase_example_runs_on_reduced_sizes(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            EXAMPLE,
            "--train-size",
            "200",
            "--test-size",
            "10",
            "--epochs",
            "1",
            "--num-layers",
            "1",
            "--num-heads",
            "2",
            "--hidden-dim",
            "8",
            "--split",
            "wordpiece",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "held-out exact match:" in result.stdout
    assert "il a m' entarté\" -> " in result.stdout
    assert (tmp_path / "alignment.html").exists()
    assert "OK, servable by TF Serving" in result.stdout
    assert "FastWordpieceTokenizeWithOffsets" in result.stdout
    assert (tmp_path / "saved_model" / "saved_model.pb").exists()
    assert "translated again by the SavedModel" in result.stdout
