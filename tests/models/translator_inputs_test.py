"""Hostile inputs to the translators (issue 11): clear errors, one Unicode rule."""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

SOURCES = ["one two", "three four five", "six"]
TARGETS = ["1 2", "3 4 5", "6"]


def _seq2seq():
    from keras_attention.models import Seq2SeqTranslator

    return Seq2SeqTranslator.from_texts(
        SOURCES,
        TARGETS,
        source_split="whitespace",
        target_split="whitespace",
        max_source_length=6,
        max_target_length=4,
        embedding_dim=8,
        units=8,
        seed=0,
    )


def _transformer():
    from keras_attention.models import TransformerTranslator

    return TransformerTranslator.from_texts(
        SOURCES,
        TARGETS,
        max_source_length=6,
        max_target_length=4,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=8,
        seed=0,
    )


@pytest.fixture(scope="module", params=["Seq2SeqTranslator", "TransformerTranslator"])
def translator(request):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    return {"Seq2SeqTranslator": _seq2seq, "TransformerTranslator": _transformer}[request.param]()


@pytest.mark.parametrize("texts", [None, 123, 4.5, [b"one", 7]])
def test_translate_rejects_non_text_naming_the_translator(translator, texts):
    name = type(translator).__name__
    with pytest.raises(TypeError, match=rf"^{name}\.translate: `texts` .*Received"):
        translator.translate(texts)


@pytest.mark.parametrize("text", ["\ud800", "one \udc80 two", b"one \xff two"])
def test_text_that_is_not_valid_unicode_is_refused_naming_texts(translator, text):
    # A lone surrogate has no UTF-8 encoding and bytes that are not UTF-8
    # are no text: refused alike on both translators, never tokenized.
    name = type(translator).__name__
    with pytest.raises(
        ValueError,
        match=rf"^{name}\.translate: `texts` must be "
        r"valid Unicode.*position",
    ):
        translator.translate([text])
    with pytest.raises(
        ValueError,
        match=rf"^{name}\.decoding_session: `text` "
        "must be valid Unicode",
    ):
        translator.decoding_session(text if isinstance(text, str) else "\ud800")
    with pytest.raises(ValueError, match=rf"^{name}\.from_texts: `source_texts`"):
        type(translator).from_texts([text], ["1"])


def test_decoding_arguments_accept_numpy_scalars_as_python_numbers(translator):
    import numpy as np

    plain = translator.translate(["one two"], beam_width=2, max_length=3, length_penalty=0.5)[0]
    numpy = translator.translate(
        ["one two"], beam_width=np.int64(2), max_length=np.array(3), length_penalty=np.float32(0.5)
    )[0]
    assert numpy.tokens == plain.tokens
    assert numpy.score == pytest.approx(plain.score)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (
            dict(beam_width=2**40),
            r"`beam_width` must be at most \d+ .*int32.*"
            r"beam_width=1099511627776",
        ),
        (dict(beam_width=0), r"`beam_width` must be a positive integer.*beam_width=0"),
        (dict(beam_width=2.0), r"`beam_width`.*beam_width=2.0"),
        (dict(max_length=2**31), r"`max_length` must be at most 2147483647"),
        (dict(length_penalty=float("nan")), r"`length_penalty` must be a finite"),
        (dict(length_penalty="1"), r"`length_penalty`.*'1'"),
        (dict(batch_size=np.float32(2)), r"`batch_size`"),
    ],
)
def test_decoding_limits_are_stated_and_checked_before_tracing(translator, kwargs, pattern):
    name = type(translator).__name__
    compiled = dict(translator._decode_functions.functions)
    with pytest.raises(ValueError, match=rf"^{name}\.translate: {pattern}"):
        translator.translate(["one"], **kwargs)
    # Refused before anything was traced for the call.
    assert translator._decode_functions.functions == compiled


def test_the_widest_beam_is_indexable_in_int32(translator):
    widest = translator.max_beam_width()
    assert widest * len(translator.target_vocabulary) <= 2**31 - 1
    assert (widest + 1) * len(translator.target_vocabulary) > 2**31 - 1


@pytest.mark.parametrize("token", ["<pad>", "<start>", 0, 2, np.int64(2)])
def test_forcing_a_token_the_decoder_never_emits_is_refused(translator, token):
    session = translator.decoding_session("one two")
    with pytest.raises(
        ValueError,
        match=r"^DecodingSession\.step: `force_token` "
        r"must be a token the decoder can emit",
    ):
        session.step(force_token=token)
    assert session.history == []
    assert session.step(force_token=np.int64(3)).token == "<end>"


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_session_of_a_text_without_tokens_reproduces_translate(translator, text):
    expected = translator.translate([text])[0]
    session = translator.decoding_session(text)
    assert session.source_tokens == expected.source_tokens
    if expected.source_tokens:  # a character translator reads spaces
        session.run()
    assert session.done and session.output_tokens == expected.tokens
    assert session.output_text == expected.text
    if not expected.source_tokens:
        assert expected.text == "" and session.history == []
        with pytest.raises(RuntimeError, match="no tokens"):
            session.step()


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

    outputs = translator.serving_outputs(tf.constant([], tf.string), 1, 4, tf.constant(0.0))
    for value in outputs.values():
        assert value.shape[0] == 0


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(dropout=1.5), ValueError, r"^TransformerTranslator: `dropout`.*1.5"),
        (dict(seed="x"), TypeError, r"^TransformerTranslator: `seed`.*'x'"),
        (dict(attention="bogus"), TypeError, r"^TransformerTranslator: `attention`"),
        (
            dict(source_split="bogus"),
            ValueError,
            r"^TransformerTranslator: `source_split`.*'bogus'",
        ),
    ],
)
def test_transformer_translator_errors_name_it(kwargs, error, pattern):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import TransformerTranslator

    vocabulary = ["<pad>", "<unk>", "<start>", "<end>", "one"]
    with pytest.raises(error, match=pattern):
        TransformerTranslator(
            vocabulary,
            vocabulary,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=8,
            **kwargs,
        )


def test_reserved_vocabulary_errors_name_the_translator():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import Seq2SeqTranslator

    with pytest.raises(ValueError, match=r"^Seq2SeqTranslator: `target_vocabulary`"):
        Seq2SeqTranslator(["<pad>", "<unk>", "<start>", "<end>"], ["a", "b"])
