import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.translator_fixtures import number_pairs

pytestmark = pytest.mark.tf_only


def _sequence_log_prob(translator, text, tokens):
    """Log-probability of `tokens` + <end> under teacher forcing (`call`)."""
    import tensorflow as tf

    vocabulary = translator.target_vocabulary
    ids = [vocabulary.index(t) for t in tokens] + [3]  # 3 = <end>
    source_ids, _ = translator.source_text.encode(tf.constant([text]))
    decoder_inputs = np.array([[2] + ids[:-1]], "int32")  # 2 = <start>
    logits = keras.ops.convert_to_numpy(translator((source_ids, decoder_inputs)))[0]
    logits[:, [0, 2]] = -np.inf  # <pad> and <start> are never emitted
    log_probs = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    return float(sum(log_probs[i, token] for i, token in enumerate(ids)))


def test_import_keras_attention_registers_translators_lazily():
    code = (
        "import sys, keras, keras_attention\n"
        "for name in ('Seq2SeqTranslator', 'TransformerTranslator'):\n"
        "    assert keras.saving.get_registered_object(\n"
        "        'keras_attention>' + name) is not None, name\n"
        "from keras_attention.models import Translation, DecodingStep\n"
        "heavy = {'tensorflow_text', 'bokeh', 'ipywidgets', 'anywidget'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
        "from keras_attention.models import Seq2SeqTranslator\n"
        "Seq2SeqTranslator.from_texts(['a'], ['b'], units=2, embedding_dim=2)\n"
        "assert 'tensorflow_text' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_training_learns_the_task(trained_translator):
    pairs = number_pairs(100, seed=99)
    results = trained_translator.translate([s for s, _ in pairs])
    accuracy = np.mean([r.text == t for r, (_, t) in zip(results, pairs, strict=True)])
    assert accuracy > 0.9


def test_step_decoder_matches_teacher_forced_call(trained_translator):
    """decode_step, fed the same tokens, gives the logits of the full call."""
    import tensorflow as tf

    translator = trained_translator
    source_ids, _ = translator.source_text.encode(tf.constant(["two four six"]))
    decoder_inputs = np.array([[2, 5, 8, 9]], "int32")
    full_logits, full_weights = translator(
        (source_ids, decoder_inputs), return_attention_scores=True
    )
    encoder_outputs, source_mask, states = translator.encode(source_ids)
    for step in range(decoder_inputs.shape[1]):
        logits, states, weights, _ = translator.decode_step(
            tf.constant(decoder_inputs[:, step]),
            states,
            encoder_outputs,
            source_mask,
        )
        np.testing.assert_allclose(logits, full_logits[:, step], atol=1e-5)
        np.testing.assert_allclose(weights, full_weights[:, step], atol=1e-6)


def test_greedy_equals_beam_search_with_width_one(trained_translator):
    texts = [s for s, _ in number_pairs(12, seed=5)] + ["nine nine", "seven"]
    greedy = trained_translator.translate(texts, _method="greedy")
    beam = trained_translator.translate(texts, _method="beam")
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b.tokens
        assert g.score == pytest.approx(b.score, abs=1e-5)
        np.testing.assert_allclose(g.alignment, b.alignment, atol=1e-6)


def test_scores_are_the_log_probability_of_the_output(trained_translator):
    texts = ["three one four", "one five nine two six"]
    for beam_width in (1, 3):
        for text, result in zip(
            texts, trained_translator.translate(texts, beam_width=beam_width), strict=True
        ):
            expected = _sequence_log_prob(trained_translator, text, result.tokens)
            assert result.score == pytest.approx(expected, abs=1e-4)


def test_beam_never_scores_worse_than_greedy(trained_translator):
    texts = [s for s, _ in number_pairs(30, seed=11)]
    # A half-trained model has real choices to make.
    greedy = trained_translator.translate(texts, max_length=4)
    for beam_width in (2, 4):
        beam = trained_translator.translate(texts, beam_width=beam_width, max_length=4)
        for g, b in zip(greedy, beam, strict=True):
            assert b.score >= g.score - 1e-5


def test_length_penalty_ranks_by_normalized_score(trained_translator):
    text = "one two three"
    plain = trained_translator.translate([text], beam_width=3)[0]
    penalized = trained_translator.translate([text], beam_width=3, length_penalty=1.0)[0]
    log_prob = _sequence_log_prob(trained_translator, text, penalized.tokens)
    assert penalized.score == pytest.approx(log_prob / (len(penalized.tokens) + 1), abs=1e-4)
    assert plain.score == pytest.approx(
        _sequence_log_prob(trained_translator, text, plain.tokens), abs=1e-4
    )


def test_alignment_rows_are_attention_distributions(trained_translator):
    result = trained_translator.translate("eight three three")[0]
    assert result.source_tokens == ["eight", "three", "three"]
    assert result.alignment.shape == (len(result.tokens), 3)
    np.testing.assert_allclose(result.alignment.sum(axis=1), 1.0, atol=1e-5)
    # Word i of a monotone one-to-one task attends mostly to source word i.
    assert list(result.alignment.argmax(axis=1)) == [0, 1, 2]


def test_session_reproduces_translate(trained_translator):
    for text in ["three one four", "seven", "two two two two two"]:
        expected = trained_translator.translate([text])[0]
        session = trained_translator.decoding_session(text, top_k=3)
        assert session.source_tokens == expected.source_tokens
        history = session.run()
        assert session.done and history[-1].done
        assert session.output_tokens == expected.tokens
        assert history[-1].token == "<end>"
        for i, token in enumerate(expected.tokens):
            assert history[i].index == i and history[i].token == token
            np.testing.assert_allclose(history[i].attention, expected.alignment[i], atol=1e-5)


def test_session_text_glues_wordpiece_as_translate_does():
    from keras_attention.models import Seq2SeqTranslator

    texts = ["le chat noir", "les chats noirs", "la souris grise", "les souris grises"]
    keras.utils.set_random_seed(0)
    translator = Seq2SeqTranslator.from_texts(
        texts,
        texts,
        source_split="wordpiece",
        target_split="wordpiece",
        units=8,
        embedding_dim=4,
        max_source_length=8,
        max_target_length=6,
    )
    session = translator.decoding_session("les chats")
    session.step(force_token="chat")
    session.step(force_token="##s")
    assert session.output_tokens == ["chat", "##s"]
    assert session.output_text == "chats"
    # Untrained, greedy: whatever it emits, the session's text is translate()'s.
    for text in texts:
        session = translator.decoding_session(text)
        session.run()
        assert session.output_text == translator.translate(text)[0].text


def test_session_step_reports_candidates_and_scores(trained_translator):
    session = trained_translator.decoding_session("five six", top_k=4)
    step = session.step()
    probabilities = [p for _, p in step.candidates]
    assert len(step.candidates) == 4
    assert probabilities == sorted(probabilities, reverse=True)
    assert step.candidates[0] == (step.token, pytest.approx(step.probability))
    assert 0.0 < sum(probabilities) <= 1.0 + 1e-6
    assert step.attention.shape == step.scores.shape == (2,)
    # The attention is the softmax of the exposed scores.
    softmax = np.exp(step.scores - step.scores.max())
    np.testing.assert_allclose(step.attention, softmax / softmax.sum(), atol=1e-5)
    assert trained_translator.supports_decoding_session is True


def test_forcing_a_token_changes_what_follows(trained_translator):
    session = trained_translator.decoding_session("three one four")
    natural = [s.token for s in session.run()]
    session.reset()
    assert session.history == [] and not session.done
    forced = session.step(force_token="9")
    assert forced.token == "9" and forced.token_id == trained_translator.target_vocabulary.index(
        "9"
    )
    assert forced.candidates[0][0] == natural[0]  # candidates ignore forcing
    following = session.step()
    session.reset()
    session.step()
    unforced_following = session.step()
    assert not np.allclose(
        [p for _, p in following.candidates],
        [p for _, p in unforced_following.candidates],
    )
    # Forcing by id works the same way.
    session.reset()
    assert session.step(force_token=forced.token_id).token == "9"


def test_session_errors(trained_translator):
    session = trained_translator.decoding_session("one")
    with pytest.raises(ValueError, match="force_token"):
        session.step(force_token="not-a-token")
    with pytest.raises(ValueError, match="force_token"):
        session.step(force_token=10_000)
    with pytest.raises(TypeError, match="force_token"):
        session.step(force_token=1.5)
    session.run()
    with pytest.raises(RuntimeError, match="reset"):
        session.step()
    with pytest.raises(ValueError, match="top_k"):
        trained_translator.decoding_session("one", top_k=0)
    with pytest.raises(TypeError, match="text"):
        trained_translator.decoding_session(["one"])


def test_session_stops_at_max_target_length(trained_translator):
    session = trained_translator.decoding_session("one")
    for _ in range(trained_translator.max_target_length):
        step = session.step(force_token="1")
    assert step.done and session.done
    assert len(session.output_tokens) == trained_translator.max_target_length


def test_bad_input_is_handled(trained_translator):
    translator = trained_translator
    empty, unknown = translator.translate(["", "one bonjour three"])
    assert empty.text == "" and empty.tokens == [] and empty.score == 0.0
    assert empty.alignment.shape == (0, 0)
    assert unknown.source_tokens == ["one", "bonjour", "three"]
    assert unknown.alignment.shape[1] == 3
    assert translator.translate([]) == []
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="beam_width"):
            translator.translate(["one"], beam_width=bad)
    for bad in (0, -3, 2.0):
        with pytest.raises(ValueError, match="max_length"):
            translator.translate(["one"], max_length=bad)
    with pytest.raises(ValueError, match="length_penalty"):
        translator.translate(["one"], length_penalty=float("nan"))
    with pytest.raises(TypeError, match="texts"):
        translator.translate([1, 2])


def test_max_length_limits_output(trained_translator):
    result = trained_translator.translate(["one two three four five"], max_length=2)[0]
    assert len(result.tokens) == 2
    assert result.alignment.shape == (2, 5)


def test_overlong_input_keeps_its_first_tokens(trained_translator):
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    result = trained_translator.translate(" ".join(words))[0]
    assert result.source_tokens == words[: trained_translator.max_source_length]


def test_unknown_tokens_map_to_unk(trained_translator):
    import tensorflow as tf

    ids, tokens = trained_translator.source_text.encode(tf.constant(["one bonjour"]))
    vocabulary = trained_translator.source_vocabulary
    assert list(ids.numpy()[0][:2]) == [vocabulary.index("one"), 1]


def test_every_attention_mechanism_decodes():
    from keras_attention import LowRankAttention
    from keras_attention import LuongAttention
    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.models.seq2seq_translator import ATTENTION_NAMES

    instance = LowRankAttention(rank=3)
    expected_types = {
        "additive": "AdditiveAttention",
        "luong": "LuongAttention",
        "general": "LuongAttention",
        "concat": "LuongAttention",
        "low_rank": "LowRankAttention",
    }
    for attention in (*ATTENTION_NAMES, instance):
        translator = Seq2SeqTranslator.from_texts(
            ["ab", "ba"],
            ["x", "y"],
            units=8,
            embedding_dim=4,
            max_source_length=5,
            max_target_length=3,
            attention=attention,
        )
        if attention is instance:
            assert translator.attention is instance
        else:
            assert type(translator.attention).__name__ == expected_types[attention]
        result = translator.translate(["ab"], beam_width=2)[0]
        assert result.alignment.shape == (len(result.tokens), 2)
        np.testing.assert_allclose(result.alignment.sum(axis=1), 1.0, atol=1e-5)
    assert isinstance(
        Seq2SeqTranslator.from_texts(["ab"], ["x"], units=8, attention="general").attention,
        LuongAttention,
    )


def test_lstm_translator_with_concat_attention_trains():
    from keras_attention.models import Seq2SeqTranslator

    sources, targets = ["ab", "ba", "aab"], ["x", "y", "xxy"]
    translator = Seq2SeqTranslator.from_texts(
        sources,
        targets,
        units=8,
        embedding_dim=4,
        max_source_length=5,
        max_target_length=4,
        attention="concat",
        rnn="lstm",
    )
    translator.compile(optimizer=keras.optimizers.Adam(0.05))
    history = translator.fit(translator.make_dataset(sources, targets, 3), epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    tokens = [s.token for s in translator.decoding_session("ab").run()]
    expected = translator.translate("ab")[0].tokens
    # The session ends with <end>, or without it at max_target_length.
    assert tokens[: len(expected)] == expected
    assert tokens[len(expected) :] in ([], ["<end>"])


def test_config_round_trip_gives_the_same_translations(trained_translator):
    from keras_attention.models import Seq2SeqTranslator

    config = trained_translator.get_config()
    clone = Seq2SeqTranslator.from_config(config)
    clone.set_weights(trained_translator.get_weights())
    texts = ["four four two", "nine"]
    for a, b in zip(clone.translate(texts), trained_translator.translate(texts), strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.alignment, b.alignment, atol=1e-6)


def test_constructor_errors():
    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.models.text_processing import build_vocabulary

    vocabulary = build_vocabulary(["ab"])
    with pytest.raises(ValueError, match="attention"):
        Seq2SeqTranslator(vocabulary, vocabulary, attention="bilinear")
    with pytest.raises(ValueError, match="units"):
        Seq2SeqTranslator(vocabulary, vocabulary, units=7)
    with pytest.raises(ValueError, match="rnn"):
        Seq2SeqTranslator(vocabulary, vocabulary, rnn="transformer")
    with pytest.raises(ValueError, match="max_source_length"):
        Seq2SeqTranslator(vocabulary, vocabulary, max_source_length=0)
    with pytest.raises(ValueError, match="reserved"):
        Seq2SeqTranslator(["a", "b"], vocabulary)
    with pytest.raises(ValueError, match="as many"):
        Seq2SeqTranslator.from_texts(["a", "b"], ["c"])


@pytest.mark.parametrize(
    "module_name",
    [
        "keras_attention.models.seq2seq_translator",
        "keras_attention.models.alignment_chart",
    ],
)
def test_docstring_examples(module_name):
    import doctest
    import importlib

    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= (
        1 if module_name.endswith("translator") else 0
    )
