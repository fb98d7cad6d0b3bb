"""`CausalDecodingSession`: a causal LM decoded one token at a time (#52).

The KerasHub model is a tiny Gemma with a SentencePiece vocabulary trained
here, its even block local with a window of 3 keys (so its cache is a 3-slot
ring that wraps during the prompt) and our attention swapped in. The
references are KerasHub's own model with the same weights (its `generate`,
greedy and seeded, and its full stacked cache) and our layers' uncached call
over the whole context (every row at once, no cache).
"""

import keras
import numpy as np
import pytest

from keras_attention.interchange import keras_hub_models as conversion
from keras_attention.layers import MultiHeadAttention
from keras_attention.models import causal_decoding
from tests import causal_lms

keras_hub = pytest.importorskip("keras_hub")
pytest.importorskip("sentencepiece")

MAX_LENGTH, WINDOW = 16, 3
# "keras" decodes to max_length; the longer prompt stops early on <eos>.
PROMPTS = ["keras", "one two three four"]


@pytest.fixture(scope="module")
def models():
    """KerasHub's own model, and the same weights with our attention."""
    theirs = causal_lms.gemma_causal_lm(0, MAX_LENGTH, sliding_window=WINDOW)
    ours = causal_lms.gemma_causal_lm(0, MAX_LENGTH, sliding_window=WINDOW)
    conversion.replace_keras_hub_attention(ours)
    return theirs, ours


def _uncached_rows(lm, token_ids):
    """Every attention layer's weights `(heads, L, L)` from one uncached call."""
    layers = [layer.attention for layer in conversion._swapped_layers(lm.backbone)]
    with causal_decoding._recording(layers) as recorded:
        lm.backbone(
            {"token_ids": token_ids[None], "padding_mask": np.ones((1, len(token_ids)), bool)}
        )
    return [calls[-1][0] for calls in recorded]


def test_each_swapped_layer_has_a_path_of_its_own(models):
    """`capture_attention` and head masks key layers by path: the two blocks'
    swapped layers once shared one (`attention_keras_attention`), so a
    capture kept only the last layer's weights."""
    from keras_attention import analysis
    from keras_attention.layers import capture_attention

    _, ours = models
    inputs = {"token_ids": np.ones((1, 5), "int32"), "padding_mask": np.ones((1, 5), bool)}
    with capture_attention(ours.backbone) as captured:
        ours.backbone(inputs)
    assert len(captured.scores) == 2 and all(len(w) == 1 for w in captured.scores.values())
    assert len(analysis.head_layers(ours.backbone)) == 2


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_steps_give_keras_hubs_generate_and_each_rows_weights(models, prompt):
    theirs, ours = models
    session = causal_decoding.CausalDecodingSession(ours, prompt, max_length=MAX_LENGTH, top_k=3)
    history = session.run()
    assert session.output_text == theirs.generate(prompt, max_length=MAX_LENGTH)
    assert history[-1].done and all(not step.done for step in history[:-1])
    context = session.token_ids
    full = _uncached_rows(ours, context)
    ring_wrapped = False
    for step in history:
        index = session.prompt_length + step.index  # the query token sits at index - 1
        assert step.context_tokens == [
            ours.preprocessor.tokenizer.id_to_token(int(i)) for i in context[:index]
        ]
        for layer, rows in enumerate(full):
            np.testing.assert_allclose(step.attention[layer], rows[:, index - 1, :index], atol=2e-6)
        ring_wrapped |= index > WINDOW
        # The top candidates are the most likely tokens, best first, the greedy one first.
        probabilities = [p for _, p in step.candidates]
        assert probabilities == sorted(probabilities, reverse=True)
        assert step.candidates[0][0] == step.token and not step.forced
    assert ring_wrapped


@pytest.fixture(scope="module")
def with_sinks():
    """Ours with 2 sink slots pinned beside layer 0's window (StreamingLLM)."""
    ours = causal_lms.gemma_causal_lm(0, MAX_LENGTH, sliding_window=WINDOW)
    conversion.replace_keras_hub_attention(ours)
    conversion._swapped_layers(ours.backbone)[0].attention.sink_tokens = SINKS
    return ours


SINKS = 2


@pytest.mark.parametrize("sinks", [0, SINKS])
def test_the_cache_view_says_what_each_slot_of_each_cache_holds(models, with_sinks, sinks):
    """At every step, each slot's keys and values are KerasHub's own cache
    at the position the view names (sink slots: the first positions)."""
    theirs, ours = models
    ours = with_sinks if sinks else ours
    session = causal_decoding.CausalDecodingSession(ours, PROMPTS[0], max_length=MAX_LENGTH)
    seen = set()
    while not session.done:
        step = session.step()
        index = session.prompt_length + step.index
        # KerasHub's prefill of the context, padded to one shape (JAX compiles once).
        padded = np.pad(session.token_ids, (0, MAX_LENGTH - index))[None]
        _, reference = theirs._build_cache(padded)  # (1, layers, 2, L, kv, dim)
        reference = np.asarray(reference)[0]
        for layer, (view, cache) in enumerate(
            zip(step.caches, session.cache_contents(), strict=True)
        ):
            assert view.positions[view.written_slot] == index - 1
            # Every position the layer still reads, each in one slot (the
            # slots past them hold the prefill's padding, which the causal
            # rule hides).
            held = view.positions[view.positions >= 0]
            window = index if view.window is None else min(index, view.window)
            pinned = list(range(min(view.sink_tokens, max(index - window, 0))))
            assert sorted(held) == pinned + list(range(index - window, index))
            assert view.sink_tokens == (sinks if layer == 0 else 0)
            # With sinks, layer 0's output (so layer 1's keys) is no longer KerasHub's.
            for slot, position in enumerate(view.positions):
                if position >= 0 and not (sinks and layer):
                    np.testing.assert_allclose(
                        cache[:, slot], reference[layer, :, position], atol=2e-5
                    )
            seen.add((layer, len(view.positions), view.window))
    # Layer 0 is a ring of 3 slots (and the sinks'); layer 1 keeps every position.
    assert seen == {(0, WINDOW + sinks, WINDOW), (1, MAX_LENGTH, None)}
    if sinks:  # generation with the sinks is still its own generate's
        assert session.output_text == ours.generate(PROMPTS[0], max_length=MAX_LENGTH)


def test_a_seeded_sampler_draws_what_generate_draws_and_reset_draws_it_again(models):
    theirs, ours = models
    sampler = dict(k=4, seed=5, temperature=3.0)  # hot enough to pass over the best token
    theirs.compile(sampler=keras_hub.samplers.TopKSampler(**sampler))
    try:
        expected = theirs.generate("keras", max_length=MAX_LENGTH)
    finally:
        theirs.compile(sampler="greedy")
    session = causal_decoding.CausalDecodingSession(
        ours, "keras", max_length=MAX_LENGTH, sampler=keras_hub.samplers.TopKSampler(**sampler)
    )
    session.run()
    assert session.output_text == expected
    assert any(s.sampled and s.token != s.candidates[0][0] for s in session.history)
    session.reset()
    assert session.history == [] and session.output_text == "keras"
    session.run()
    assert session.output_text == expected


def test_a_forced_token_is_decoded_from(models):
    _, ours = models
    session = causal_decoding.CausalDecodingSession(ours, "keras", max_length=MAX_LENGTH)
    greedy = [s.token_id for s in session.run()]
    session.reset()
    session.step()
    forced = session.step(force_token=session.history[-1].candidates[1][0])
    assert forced.forced and forced.token_id != greedy[1]
    after = session.step()
    # The next step attends the forced token at its position.
    assert after.context_tokens[-1] == forced.token
    replay = causal_decoding.CausalDecodingSession(ours, "keras", max_length=MAX_LENGTH)
    replay.step(force_token=greedy[0])
    assert not replay.history[-1].forced  # the model's own pick, given again
    replay.step(force_token=forced.token_id)
    assert replay.step().token_id == after.token_id


def _plain_model(vocabulary_size=12, layers=2):
    keras.utils.set_random_seed(1)
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocabulary_size, 8)(ids)
    for _ in range(layers):
        x = x + MultiHeadAttention(num_heads=2, key_dim=4)(x, x, use_causal_mask=True)
    return keras.Model(ids, keras.layers.Dense(vocabulary_size)(x))


def test_a_keras_model_of_our_layers_steps_greedily_with_rollout():
    model = _plain_model(layers=1)
    vocabulary = [f"w{i}" for i in range(12)]
    session = causal_decoding.CausalDecodingSession(
        model, "w1 w5 w2", max_length=7, vocabulary=vocabulary
    )
    history = session.run()
    assert len(history) == 4 and session.output_text.split()[:3] == ["w1", "w5", "w2"]
    ids = session.token_ids[None]
    logits = np.asarray(model(ids))[0]
    embedded = model.layers[1](ids)
    _, weights = model.layers[2](
        embedded, embedded, use_causal_mask=True, return_attention_scores=True
    )
    for step in history:
        index = 3 + step.index
        assert step.token_id == int(np.argmax(logits[index - 1]))
        np.testing.assert_allclose(
            step.attention[0], np.asarray(weights)[0, :, index - 1, :index], atol=1e-6
        )
        # One layer's rollout: half its mean head row, half the query token itself.
        expected = 0.5 * step.attention[0].mean(axis=0)
        expected[-1] += 0.5
        np.testing.assert_allclose(step.rollout, expected, atol=1e-6)
        assert step.caches is None


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(max_length=0), ValueError, "max_length=0"),
        (dict(prompt=3), TypeError, "prompt=3"),
        (dict(sampler="nucleus-ish"), ValueError, "sampler='nucleus-ish'"),
        (dict(sampler=object()), TypeError, "sampler=<object"),
        (dict(max_length=2, prompt="one two three four"), ValueError, "max_length=2"),
        (dict(rollout="yes"), TypeError, "rollout='yes'"),
    ],
)
def test_bad_arguments_name_the_session_and_the_value(models, arguments, error, message):
    arguments = {"prompt": "keras", "max_length": MAX_LENGTH, **arguments}
    with pytest.raises(error, match="CausalDecodingSession") as caught:
        causal_decoding.CausalDecodingSession(models[1], arguments.pop("prompt"), **arguments)
    assert message in str(caught.value)


def test_models_it_cannot_step_are_refused_by_name(models):
    theirs, _ = models
    with pytest.raises(TypeError, match="replace_keras_hub_attention"):
        causal_decoding.CausalDecodingSession(theirs, "keras", max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match="vocabulary=None"):
        causal_decoding.CausalDecodingSession(_plain_model(), "w1", max_length=4)
    session = causal_decoding.CausalDecodingSession(models[1], "keras", max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match="force_token='no such piece'"):
        session.step(force_token="no such piece")
    with pytest.raises(ValueError, match="force_token=999"):
        session.step(force_token=999)
