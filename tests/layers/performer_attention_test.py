import math

import keras
import numpy as np
import pytest

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import PerformerAttention
from keras_attention.layers import RedrawFeatures
from keras_attention.layers import capture_attention
from keras_attention.ops import favor
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test
from tests.testing import to_numpy


def _weights(layer):
    return [keras.ops.convert_to_numpy(w) for w in layer.trainable_weights]


def numpy_performer(layer, query, key_mask=None, causal=False):
    """The layer's forward pass written out in NumPy (float64, no stabiliser)."""
    wq, bq, wk, bk, wv, bv, wo, bo = [w.astype(np.float64) for w in _weights(layer)]
    projection = keras.ops.convert_to_numpy(layer.projection).astype(np.float64)
    x = query.astype(np.float64)
    q = np.einsum("btc,chd->bhtd", x, wq) + bq.transpose(0, 1)[None, :, None, :]
    k = np.einsum("btc,chd->bhtd", x, wk) + bk[None, :, None, :]
    v = np.einsum("btc,chd->bhtd", x, wv) + bv[None, :, None, :]

    def phi(z):
        z = z * z.shape[-1] ** -0.25
        return np.exp(z @ projection.T - (z**2).sum(-1, keepdims=True) / 2) / math.sqrt(
            projection.shape[0]
        )

    a = phi(q) @ phi(k).transpose(0, 1, 3, 2)
    t = query.shape[1]
    allowed = np.ones((query.shape[0], 1, t, t), bool)
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
    if causal:
        allowed &= np.tril(np.ones((t, t), bool))
    a = a * allowed
    weights = a / a.sum(-1, keepdims=True)
    heads = weights @ v  # (B, H, T, Dv)
    out = np.einsum("bhtd,hdo->bto", heads, wo) + bo
    if key_mask is not None:
        out = out * key_mask[:, :, None]  # self-attention: padded rows are zero
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy_forward_pass_with_padding(causal):
    query = random_inputs((2, 19, 8), seed=1) * 0.5
    key_mask = np.arange(19)[None, :] < np.array([[19], [12]])
    layer = PerformerAttention(2, 4, num_features=16, causal=causal, seed=0, chunk_size=5)
    output = layer(query, query_mask=key_mask)
    expected = numpy_performer(layer, query, key_mask, causal)
    np.testing.assert_allclose(to_numpy(output), expected, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [1, 3])
def test_lengths_below_the_feature_count_match_numpy(length, causal):
    # 1 and 3 tokens, 16 random features, chunks of 5.
    query = random_inputs((2, length, 8), seed=1) * 0.5
    key_mask = np.arange(length)[None, :] < np.array([[length], [max(length - 1, 1)]])
    layer = PerformerAttention(2, 4, num_features=16, causal=causal, seed=0, chunk_size=5)
    output = layer(query, query_mask=key_mask)
    expected = numpy_performer(layer, query, key_mask, causal)
    assert tuple(output.shape) == (2, length, 8)
    np.testing.assert_allclose(to_numpy(output), expected, rtol=2e-3, atol=2e-4)


def test_approximates_exact_attention_with_the_same_weights():
    keras.utils.set_random_seed(0)  # the exact layer's initial weights
    query = random_inputs((1, 12, 8), seed=1) * 0.5
    exact = MultiHeadAttention(2, 4, memory_efficient=False)
    expected = to_numpy(exact(query))
    errors = {}
    for num_features in (2, 4096):
        layer = PerformerAttention(2, 4, num_features=num_features, seed=0)
        layer(query)
        for mine, theirs in zip(layer.trainable_weights, exact.trainable_weights, strict=True):
            mine.assign(theirs)
        errors[num_features] = np.abs(to_numpy(layer(query)) - expected).max()
    assert errors[4096] < 0.02 and errors[2] > 5 * errors[4096]


def test_trainable_weights_are_those_of_multi_head_attention():
    query, value = random_inputs((1, 9, 8)), random_inputs((1, 11, 6), seed=2)
    performer = PerformerAttention(2, 4, num_key_value_heads=1, output_shape=5, seed=0)
    exact = MultiHeadAttention(2, 4, num_key_value_heads=1, output_shape=5)
    performer(query, value)
    exact(query, value)

    def strip(w):
        return w.path.split("/", 1)[1]

    assert [strip(w) for w in performer.trainable_weights] == [
        strip(w) for w in exact.trainable_weights
    ]
    assert [w.shape for w in performer.trainable_weights] == [
        w.shape for w in exact.trainable_weights
    ]
    assert [strip(w) for w in performer.non_trainable_weights] == ["projection", "redraws"]
    exact.set_weights(_weights(performer))  # same shapes, same order


def test_projection_is_drawn_from_the_seed_and_redrawn_deterministically():
    query = random_inputs((1, 6, 8))
    layer = PerformerAttention(2, 4, num_features=8, orthogonal=False, seed=7)
    before = layer(query)
    np.testing.assert_allclose(
        to_numpy(layer.projection),
        favor.random_projection(8, 4, orthogonal=False, seed=(7, 0)),
    )
    layer.redraw_features()
    np.testing.assert_allclose(
        to_numpy(layer.projection),
        favor.random_projection(8, 4, orthogonal=False, seed=(7, 1)),
    )
    assert not np.allclose(to_numpy(layer(query)), to_numpy(before))


def test_redraw_callback_redraws_during_fit_and_the_projection_is_saved(tmp_path):
    model = keras.Sequential(
        [
            keras.Input((6, 8)),
            PerformerAttention(2, 4, num_features=8, seed=3, name="performer"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x, y = random_inputs((8, 6, 8)), random_inputs((8, 6, 1), seed=1)
    model.fit(
        x, y, batch_size=2, epochs=1, verbose=0, callbacks=[RedrawFeatures(every_n_steps=2)]
    )  # 4 steps, 2 redraws
    layer = model.get_layer("performer")
    expected = favor.random_projection(8, 4, seed=(3, 2))
    np.testing.assert_allclose(to_numpy(layer.projection), expected)
    path = str(tmp_path / "performer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded.get_layer("performer").projection), expected)
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))


def test_redraw_count_is_saved_so_a_loaded_layer_redraws_onwards(tmp_path):
    # Redraw twice, save, load, redraw again: the features of the third draw,
    # (seed, 3), as an unsaved layer redrawn three times has them.
    query = random_inputs((1, 6, 8))
    layer = PerformerAttention(2, 4, num_features=8, seed=11, name="performer")
    model = keras.Sequential([keras.Input((6, 8)), layer])
    layer.redraw_features()
    layer.redraw_features()
    path = str(tmp_path / "redrawn.keras")
    model.save(path)
    loaded = keras.saving.load_model(path).get_layer("performer")
    assert int(to_numpy(loaded.redraws)) == 2
    loaded.redraw_features()
    unsaved = PerformerAttention(2, 4, num_features=8, seed=11)
    unsaved(query)
    for _ in range(3):
        unsaved.redraw_features()
    np.testing.assert_array_equal(to_numpy(loaded.projection), to_numpy(unsaved.projection))
    np.testing.assert_allclose(
        to_numpy(loaded.projection), favor.random_projection(8, 4, seed=(11, 3))
    )
    assert int(to_numpy(loaded.redraws)) == 3
    assert not any(w is layer.redraws for w in layer.trainable_weights)


def test_scores_are_the_implied_weights_and_are_captured():
    query = random_inputs((1, 7, 8))
    layer = PerformerAttention(2, 4, num_features=16, causal=True, seed=0, name="perf")
    output, scores = layer(query, return_attention_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (1, 2, 7, 7)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(scores[0, 0], 1) == 0)  # causal
    np.testing.assert_allclose(to_numpy(layer(query)), to_numpy(output), atol=1e-5)
    with capture_attention(layer) as captured:
        layer(query)
    np.testing.assert_allclose(captured.scores["perf"][0], scores, atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_half_precision_training_stays_finite(policy):
    model = keras.Sequential(
        [
            keras.Input((24, 8)),
            PerformerAttention(2, 4, num_features=8, causal=True, seed=0, dtype=policy),
            keras.layers.Dense(1, dtype=policy),
        ]
    )
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    x = random_inputs((4, 24, 8)) * 20.0  # large logits: stabilisation matters
    history = model.fit(x, random_inputs((4, 24, 1)), epochs=3, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    _, scores = model.layers[0](x, return_attention_scores=True)
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_features=0), "num_features=0"),
        (dict(num_features=-3), "num_features=-3"),
        (dict(kernel="cosine"), "kernel='cosine'"),
        (dict(orthogonal="yes"), "orthogonal='yes'"),
        (dict(dropout=0.1), "dropout=0.1"),
        (dict(memory_efficient=True), "'memory_efficient': True"),
        (dict(block_size=16), "'block_size': 16"),
        (dict(chunk_size=0), "chunk_size=0"),
    ],
)
def test_invalid_constructor_arguments_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=f"PerformerAttention.*{message}"):
        PerformerAttention(2, 4, **kwargs)


def test_causal_cross_attention_is_rejected_eagerly_and_symbolically():
    layer = PerformerAttention(2, 4, num_features=8, causal=True)
    with pytest.raises(ValueError, match="causal.*self-attention.*value"):
        layer(random_inputs((1, 5, 8)), random_inputs((1, 5, 8)))
    with pytest.raises(ValueError, match="causal.*self-attention"):
        layer(keras.Input((5, 8)), keras.Input((7, 8)))
    with pytest.raises(ValueError, match="use_causal_mask=True"):
        PerformerAttention(2, 4, num_features=8)(
            random_inputs((1, 5, 8)), random_inputs((1, 5, 8)), use_causal_mask=True
        )


@pytest.mark.parametrize("options", [dict(), dict(kernel="relu", orthogonal=False)])
def test_layer_contract(tmp_path, options):
    run_layer_contract_test(
        lambda **kwargs: PerformerAttention(2, 4, num_features=8, seed=0, **options, **kwargs),
        tmp_path,
        expected_cross_output_shape=(2, 5, 8),
    )


def test_layer_contract_causal(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: PerformerAttention(
            2, 4, num_features=8, causal=True, chunk_size=2, seed=0, **kwargs
        ),
        tmp_path,
        cross_attention=False,
    )
