"""Hostile inputs to the translators (issue 11): clear errors, one Unicode rule."""

import keras
import pytest

pytestmark = pytest.mark.tf_only

SOURCES = ["one two", "three four five", "six"]
TARGETS = ["1 2", "3 4 5", "6"]


def _seq2seq():
    from keras_attention.models import Seq2SeqTranslator

    return Seq2SeqTranslator.from_texts(
        SOURCES, TARGETS, source_split="whitespace", target_split="whitespace",
        max_source_length=6, max_target_length=4, embedding_dim=8, units=8, seed=0,
    )


def _transformer():
    from keras_attention.models import TransformerTranslator

    return TransformerTranslator.from_texts(
        SOURCES, TARGETS, max_source_length=6, max_target_length=4, num_layers=1,
        num_heads=2, hidden_dim=8, intermediate_dim=8, seed=0,
    )


@pytest.fixture(scope="module", params=["Seq2SeqTranslator", "TransformerTranslator"])
def translator(request):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    return {"Seq2SeqTranslator": _seq2seq, "TransformerTranslator": _transformer}[
        request.param
    ]()


@pytest.mark.parametrize("texts", [None, 123, 4.5, [b"one", 7]])
def test_translate_rejects_non_text_naming_the_translator(translator, texts):
    name = type(translator).__name__
    with pytest.raises(TypeError, match=rf"^{name}\.translate: `texts` .*Received"):
        translator.translate(texts)


def test_invalid_unicode_reads_as_replacement_characters(translator):
    # A lone surrogate (str) and bytes that are not UTF-8: one U+FFFD per
    # invalid code unit, never a UnicodeEncodeError/UnicodeDecodeError.
    surrogate, = translator.translate("one \ud800 two")
    invalid, = translator.translate(b"one \xff two")
    assert surrogate.source_tokens == ["one", "\ufffd", "two"]
    assert invalid.source_tokens == ["one", "\ufffd", "two"]
    assert isinstance(surrogate.text, str) and isinstance(invalid.text, str)
    session = translator.decoding_session("one \ud800")
    assert session.source_tokens == ["one", "\ufffd"]


def test_both_translators_read_invalid_unicode_alike():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    texts = ["six \udc80", b"one \xc3\x28 two"]
    tokens = [[t.source_tokens for t in make().translate(texts)]
              for make in (_seq2seq, _transformer)]
    assert tokens[0] == tokens[1] == [["six", "\ufffd"], ["one", "\ufffd(", "two"]]


def test_decoding_session_errors_name_the_translator(translator):
    name = type(translator).__name__
    with pytest.raises(TypeError, match=rf"^{name}\.decoding_session: `text`.*None"):
        translator.decoding_session(None)
    with pytest.raises(ValueError, match=rf"^{name}\.decoding_session: `top_k`.*0"):
        translator.decoding_session("one", top_k=0)


def test_make_dataset_errors_name_the_translator(translator):
    name = type(translator).__name__
    with pytest.raises(TypeError, match=rf"^{name}\.make_dataset: `source_texts`"):
        translator.make_dataset(None, ["1"])


def test_serving_outputs_on_an_empty_batch_are_empty(translator):
    import tensorflow as tf

    outputs = translator.serving_outputs(
        tf.constant([], tf.string), 1, 4, tf.constant(0.0)
    )
    for value in outputs.values():
        assert value.shape[0] == 0


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(dropout=1.5), ValueError, r"^TransformerTranslator: `dropout`.*1.5"),
        (dict(seed="x"), TypeError, r"^TransformerTranslator: `seed`.*'x'"),
        (dict(attention="bogus"), TypeError, r"^TransformerTranslator: `attention`"),
        (dict(source_split="bogus"), ValueError,
         r"^TransformerTranslator: `source_split`.*'bogus'"),
    ],
)
def test_transformer_translator_errors_name_it(kwargs, error, pattern):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import TransformerTranslator

    vocabulary = ["<pad>", "<unk>", "<start>", "<end>", "one"]
    with pytest.raises(error, match=pattern):
        TransformerTranslator(vocabulary, vocabulary, num_layers=1, num_heads=2,
                              hidden_dim=8, intermediate_dim=8, **kwargs)


def test_reserved_vocabulary_errors_name_the_translator():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import Seq2SeqTranslator

    with pytest.raises(ValueError, match=r"^Seq2SeqTranslator: `target_vocabulary`"):
        Seq2SeqTranslator(["<pad>", "<unk>", "<start>", "<end>"], ["a", "b"])
