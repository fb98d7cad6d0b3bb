import keras
import numpy as np
import pytest

from translator_fixtures import number_pairs

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def transformer():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import TransformerTranslator

    keras.utils.set_random_seed(2)
    sources, targets = zip(*number_pairs(800, seed=3))
    translator = TransformerTranslator.from_texts(
        sources, targets, max_source_length=6, max_target_length=7,
        num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, seed=2,
    )
    translator.compile(optimizer=keras.optimizers.Adam(5e-3))
    translator.fit(translator.make_dataset(sources, targets, 32, seed=2),
                   epochs=3, verbose=0)
    return translator


def test_cached_steps_match_the_teacher_forced_call(transformer):
    import tensorflow as tf

    source_ids, _ = transformer.source_text.encode(tf.constant(["two four six"]))
    decoder_inputs = np.array([[2, 6, 9, 5, 3]], "int32")
    logits, cross = transformer((source_ids, decoder_inputs),
                                return_attention_scores=True)
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
    for text, g, b in zip(texts, greedy, beam_one):
        assert g.tokens == b.tokens
        np.testing.assert_allclose(g.alignment, b.alignment, atol=1e-5)
        assert g.alignment.shape == (2, 2, len(g.tokens), len(text.split()))
        np.testing.assert_allclose(g.alignment.sum(-1), 1.0, atol=1e-5)
    beam = transformer.translate(texts, beam_width=3)
    for g, b in zip(greedy, beam):
        assert b.score >= g.score - 1e-5


def test_session_reproduces_translate(transformer):
    text = "three one four"
    expected = transformer.translate(text)[0]
    session = transformer.decoding_session(text)
    history = session.run()
    assert session.output_tokens == expected.tokens
    for i in range(len(expected.tokens)):
        assert history[i].attention.shape == (2, 2, 3)
        np.testing.assert_allclose(history[i].attention,
                                   expected.alignment[:, :, i], atol=1e-5)
    assert history[0].scores is None
    session.reset()
    assert session.step(force_token="7").token == "7"


def test_export_serves_the_same_translations(transformer, tmp_path):
    from keras_attention.export import export_translator
    from keras_attention.export.check import graph_ops
    from keras_attention.export.check import read_saved_model
    from keras_attention.export.check import run_in_serving_process

    path = str(tmp_path / "transformer")
    export_translator(transformer, path)
    counts, must_compile = graph_ops(read_saved_model(path).meta_graphs[0])
    assert not must_compile
    texts = ["three one four", "", "nine nine"]
    result, outputs = run_in_serving_process(
        path, ops=sorted(counts), feed={"text": np.array(texts, dtype=object)}
    )
    assert result["loaded"], result.get("load_error")
    assert "unregistered" not in result["op_sources"].values()
    assert all("error" not in entry for entry in result["warmup"])
    expected = transformer.translate(texts)
    assert [t.decode() for t in outputs["translation"]] == [e.text for e in expected]
    # Served alignment is (B, T_out, layers, heads, T_in).
    rows = len(expected[0].tokens)
    np.testing.assert_allclose(
        np.transpose(outputs["alignment"][0, :rows, :, :, :3], (1, 2, 0, 3)),
        expected[0].alignment, atol=1e-5,
    )


def test_config_and_errors():
    from keras_attention.models import TransformerTranslator

    translator = TransformerTranslator.from_texts(
        ["a b"], ["c"], num_layers=1, num_heads=2, hidden_dim=4,
        intermediate_dim=8)
    assert translator.source_text.split == "whitespace"
    clone = TransformerTranslator.from_config(translator.get_config())
    clone.set_weights(translator.get_weights())
    assert clone.translate("a b")[0].tokens == translator.translate("a b")[0].tokens
    with pytest.raises(ValueError, match="multiple of `num_heads`"):
        TransformerTranslator.from_texts(["a"], ["b"], num_heads=3, hidden_dim=8)
    with pytest.raises(ValueError, match="num_layers"):
        TransformerTranslator.from_texts(["a"], ["b"], num_layers=0)
