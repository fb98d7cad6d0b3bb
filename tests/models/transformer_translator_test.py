import numpy as np
import pytest

from tests.translator_fixtures import number_pairs

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def transformer(trained_transformer):
    return trained_transformer


def test_cached_steps_match_the_teacher_forced_call(transformer):
    import tensorflow as tf

    source_ids, _ = transformer.source_text.encode(tf.constant(["two four six"]))
    decoder_inputs = np.array([[2, 6, 9, 5, 3]], "int32")
    logits, cross = transformer((source_ids, decoder_inputs), return_attention_scores=True)
    context, states = transformer._start_decoding(source_ids, 5)
    for step in range(5):
        step_logits, states, weights, _ = transformer._decode_step(
            tf.constant(decoder_inputs[:, step]), states, context, tf.constant(step)
        )
        np.testing.assert_allclose(step_logits, logits[:, step], atol=1e-4)
        np.testing.assert_allclose(weights, cross[:, :, :, step], atol=1e-5)


def test_translations_carry_per_layer_and_head_alignments(transformer):
    texts = [s for s, _ in number_pairs(10, seed=7)]
    greedy = transformer.translate(texts, _method="greedy")
    beam_one = transformer.translate(texts, _method="beam")
    assert any(g.tokens for g in greedy)
    for text, g, b in zip(texts, greedy, beam_one, strict=True):
        assert g.tokens == b.tokens
        np.testing.assert_allclose(g.alignment, b.alignment, atol=1e-5)
        assert g.alignment.shape == (2, 2, len(g.tokens), len(text.split()))
        np.testing.assert_allclose(g.alignment.sum(-1), 1.0, atol=1e-5)
    beam = transformer.translate(texts, beam_width=3)
    for g, b in zip(greedy, beam, strict=True):
        assert b.score >= g.score - 1e-5


def test_session_reproduces_translate(transformer):
    text = "three one four"
    expected = transformer.translate(text)[0]
    session = transformer.decoding_session(text)
    history = session.run()
    assert session.output_tokens == expected.tokens
    for i in range(len(expected.tokens)):
        assert history[i].attention.shape == (2, 2, 3)
        np.testing.assert_allclose(history[i].attention, expected.alignment[:, :, i], atol=1e-5)
    # The cross-attention scores before softmax: what each step's weights are the softmax of.
    scores = history[0].scores
    assert scores.shape == (2, 2, 3)
    softmax = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(
        softmax / softmax.sum(-1, keepdims=True), history[0].attention, atol=1e-5
    )
    assert session.values.shape[:3] == (2, 2, 3)  # (layers, heads, T_in, head_dim)
    session.reset()
    assert session.step(force_token="7").token == "7"


def test_config_and_errors():
    from keras_attention.models import TransformerTranslator

    translator = TransformerTranslator.from_texts(
        ["a b"], ["c"], num_layers=1, num_heads=2, hidden_dim=4, intermediate_dim=8
    )
    assert translator.source_text.split == "whitespace"
    clone = TransformerTranslator.from_config(translator.get_config())
    clone.set_weights(translator.get_weights())
    assert clone.translate("a b")[0].tokens == translator.translate("a b")[0].tokens
    with pytest.raises(ValueError, match="multiple of `num_heads`"):
        TransformerTranslator.from_texts(["a"], ["b"], num_heads=3, hidden_dim=8)
    with pytest.raises(ValueError, match="num_layers"):
        TransformerTranslator.from_texts(["a"], ["b"], num_layers=0)
