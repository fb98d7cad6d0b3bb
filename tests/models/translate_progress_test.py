"""`translate(verbose=..., batch_size=...)`: progress the Keras way, same results."""

import keras
import numpy as np
import pytest

from tests.translator_fixtures import number_pairs

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def translator():
    from keras_attention.models import Seq2SeqTranslator

    keras.utils.set_random_seed(3)
    sources, targets = zip(*number_pairs(50), strict=True)
    return Seq2SeqTranslator.from_texts(
        sources,
        targets,
        source_split="whitespace",
        target_split="whitespace",
        max_source_length=6,
        max_target_length=7,
        embedding_dim=8,
        units=8,
        seed=3,
    )


TEXTS = [source for source, _ in number_pairs(7, seed=5)]


def test_batches_give_the_results_of_one_call(translator):
    whole = translator.translate(TEXTS, beam_width=2, verbose=0)
    batched = translator.translate(TEXTS, beam_width=2, batch_size=3, verbose=0)
    assert [t.text for t in batched] == [t.text for t in whole]
    for one, other in zip(batched, whole, strict=True):
        assert one.tokens == other.tokens and one.source_tokens == other.source_tokens
        np.testing.assert_allclose(one.score, other.score, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(one.alignment, other.alignment, atol=1e-6)


def test_progress_bar_counts_batches(translator, capsys):
    translator.translate(TEXTS, batch_size=3, verbose=1)
    out = capsys.readouterr().out
    assert "3/3" in out and "/batch" in out, out


def test_verbose_zero_and_auto_on_one_batch_print_nothing(translator, capsys):
    translator.translate(TEXTS, batch_size=3, verbose=0)
    translator.translate(TEXTS, verbose="auto")  # one batch of 256
    assert capsys.readouterr().out == ""
    translator.translate(TEXTS, batch_size=2)  # "auto" over 4 batches: a bar
    assert "4/4" in capsys.readouterr().out


def test_verbose_two_prints_one_line_at_the_end(translator, capsys):
    translator.translate(TEXTS, batch_size=3, verbose=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1 and "/batch" in lines[0], lines


@pytest.mark.parametrize(
    "argument, value", [("batch_size", 0), ("batch_size", 2.5), ("verbose", 3), ("verbose", True)]
)
def test_bad_arguments_are_refused_before_decoding(translator, argument, value):
    with pytest.raises(ValueError, match=f"Seq2SeqTranslator.translate.*{argument}={value!r}"):
        translator.translate(TEXTS, **{argument: value})
