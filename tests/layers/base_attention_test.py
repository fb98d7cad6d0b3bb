"""The shared call contract, exercised through the concrete layers."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention
from keras_attention import layers as ka
from keras_attention.layers import AdditiveAttention
from keras_attention.layers import LowRankAttention
from keras_attention.layers import LuongAttention
from tests import reference
from tests.testing import random_inputs
from tests.testing import to_numpy

LAYERS = {
    "additive": lambda **kw: AdditiveAttention(units=4, **kw),
    "dot": lambda **kw: LuongAttention(score="dot", **kw),
    "general": lambda **kw: LuongAttention(score="general", **kw),
    "concat": lambda **kw: LuongAttention(score="concat", **kw),
    "low_rank": lambda **kw: LowRankAttention(rank=2, **kw),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_keras_mask_from_embedding_propagates(name):
    tokens = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], "int32")
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    attended, scores = LAYERS[name]()(embedded, return_attention_scores=True)
    # The output carries the query's mask on to the next layer.
    assert getattr(attended, "_keras_mask", None) is not None
    model = keras.Model(inputs, [attended, scores])
    outputs, weights = (to_numpy(x) for x in model(tokens))
    padding = tokens == 0
    # Padded keys get no weight, padded query rows get none at all.
    assert np.all(weights[np.broadcast_to(padding[:, None, :], weights.shape)] == 0)
    assert np.all(weights[padding] == 0)
    np.testing.assert_allclose(weights[~padding].sum(-1), 1.0, atol=1e-5)
    assert np.all(outputs[padding] == 0)


def test_output_mask_is_the_query_mask():
    query = keras.ops.convert_to_tensor(random_inputs((2, 3, 4)))
    mask = keras.ops.convert_to_tensor(np.array([[True, True, False], [True, False, False]]))
    layer = LuongAttention()
    np.testing.assert_array_equal(
        ops.convert_to_numpy(layer.compute_mask(query, mask)), ops.convert_to_numpy(mask)
    )


def test_masked_output_feeds_a_masked_rnn_in_sequential():
    model = keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(20, 8, mask_zero=True),
            keras_attention.LuongAttention(score="dot", divide_by_sqrt_dim=True),
            keras.layers.GRU(4),
        ]
    )
    tokens = np.array([[1, 2, 3, 0, 0, 0]], "int32")
    trailing_garbage = np.array([[1, 2, 3, 9, 9, 9]], "int32")
    # With the mask honoured end to end, padding content cannot change the result
    # of masked timesteps; compare against an input truncated to its real length.
    short = keras.Sequential(model.layers)
    np.testing.assert_allclose(to_numpy(model(tokens)), to_numpy(short(tokens[:, :3])), atol=1e-5)
    assert not np.allclose(to_numpy(model(tokens)), to_numpy(model(trailing_garbage)))


def test_explicit_masks_and_causal_mask_combine():
    rng = np.random.default_rng(0)
    query = random_inputs((2, 5, 8), seed=1)
    query_mask = reference.random_mask(rng, 2, 5)
    value_mask = reference.random_mask(rng, 2, 5)
    attention_mask = rng.random((2, 5, 5)) > 0.2
    attention_mask[:, :, 0] = True
    _, weights = LuongAttention()(
        query,
        query,
        query_mask=query_mask,
        value_mask=value_mask,
        attention_mask=attention_mask,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    scores = np.einsum("bqd,bkd->bqk", query, query)
    mask = reference.combined_mask(2, 5, 5, query_mask, value_mask, causal=True)
    expected = reference.softmax_with_mask(scores, mask & attention_mask)
    np.testing.assert_allclose(to_numpy(weights), expected, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_fully_masked_rows_give_zeros_not_nan(name, dtype):
    query = random_inputs((2, 3, 8), seed=1) * 10
    value = random_inputs((2, 4, 8), seed=2) * 10
    value_mask = np.array([[False] * 4, [True, False, False, True]])
    layer = LAYERS[name](dtype=dtype)
    out, weights = layer(query, value, value_mask=value_mask, return_attention_scores=True)
    out, weights = to_numpy(out), to_numpy(weights)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights))
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(weights[0], 0.0)
    np.testing.assert_allclose(weights[1].sum(-1), 1.0, atol=2e-2)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_softmax_runs_in_float32(policy):
    query = random_inputs((1, 2, 4), seed=0)
    layer = LuongAttention(dtype=policy)
    out, weights = layer(query, return_attention_scores=True)
    assert keras.backend.standardize_dtype(out.dtype) == policy.split("_")[1]
    assert layer.variable_dtype == "float32"
    float32_weights = LuongAttention()(query, return_attention_scores=True)[1]
    np.testing.assert_allclose(to_numpy(weights), to_numpy(float32_weights), atol=1e-2)


def test_dropout_only_in_training_and_seeded():
    query = random_inputs((2, 6, 8), seed=0)
    layer = LuongAttention(dropout=0.5, seed=42)
    inference = to_numpy(layer(query, training=False))
    np.testing.assert_allclose(inference, to_numpy(LuongAttention()(query)), atol=1e-6)
    trained = to_numpy(layer(query, training=True))
    assert not np.allclose(trained, inference)
    repeat = to_numpy(LuongAttention(dropout=0.5, seed=42)(query, training=True))
    np.testing.assert_allclose(trained, repeat)


def test_returned_weights_are_those_applied_to_the_values():
    # As keras.layers.Attention: after dropout when training, each weight
    # dropped (0) or kept and scaled by 1 / (1 - rate).
    query = random_inputs((2, 6, 8), seed=0)
    layer = LuongAttention(dropout=0.5, seed=1)
    _, clean = layer(query, return_attention_scores=True)
    output, weights = layer(query, training=True, return_attention_scores=True)
    weights, clean = to_numpy(weights), to_numpy(clean)
    kept = weights != 0
    assert kept.any() and not kept.all()
    np.testing.assert_allclose(weights[kept], 2 * clean[kept], rtol=1e-5)
    np.testing.assert_allclose(to_numpy(output), weights @ query, atol=1e-5)


def test_cross_attention_symbolic_shapes_with_different_lengths():
    query = keras.Input((3, 8))
    value = keras.Input((11, 6))
    out, scores = LuongAttention(score="general")(query, value, return_attention_scores=True)
    assert tuple(out.shape) == (None, 3, 6)
    assert tuple(scores.shape) == (None, 3, 11)


def test_key_defaults_to_value_and_value_to_query():
    query = random_inputs((1, 3, 4), seed=0)
    value = random_inputs((1, 5, 4), seed=1)
    layer = LuongAttention()
    np.testing.assert_allclose(to_numpy(layer(query, value)), to_numpy(layer(query, value, value)))
    np.testing.assert_allclose(to_numpy(layer(query)), to_numpy(layer(query, query, query)))


# ---------------------------------------------------------------- bad input
def test_wrong_rank_names_layer_argument_and_shape():
    layer = AdditiveAttention(name="att")
    with pytest.raises(
        ValueError,
        match=r"AdditiveAttention \(layer 'att'\): `value` must have rank >= 3.*\(2, 5\)",
    ):
        layer(np.ones((2, 3, 4), "float32"), np.ones((2, 5), "float32"))


def test_key_value_length_mismatch():
    with pytest.raises(
        ValueError, match=r"`key` and `value` must have the same length.*\(1, 4, 2\).*\(1, 5, 2\)"
    ):
        LuongAttention()(
            np.ones((1, 3, 2), "float32"),
            np.ones((1, 5, 2), "float32"),
            np.ones((1, 4, 2), "float32"),
        )


def test_key_without_value():
    with pytest.raises(ValueError, match=r"`key` was given without `value`"):
        LuongAttention()(np.ones((1, 3, 2), "float32"), key=np.ones((1, 3, 2), "float32"))


def test_feature_size_change_after_build():
    layer = LuongAttention(score="general")
    layer(np.ones((1, 3, 2), "float32"), np.ones((1, 4, 5), "float32"))
    with pytest.raises(ValueError, match=r"`value` has 6 features but the layer was built for 5"):
        layer(np.ones((1, 3, 2), "float32"), np.ones((1, 4, 6), "float32"))


@pytest.mark.parametrize(
    "argument, mask, error",
    [
        ("value_mask", np.ones((1, 4), bool), r"`value_mask` must have shape \(1, 5\).*\(1, 4\)"),
        (
            "query_mask",
            np.ones((1, 3, 1), bool),
            r"`query_mask` must have shape \(1, 3\).*\(1, 3, 1\)",
        ),
        (
            "attention_mask",
            np.ones((1, 3, 4), bool),
            r"`attention_mask` must have shape \(1, 3, 5\)",
        ),
        ("value_mask", np.ones((1, 5), "complex64"), r"`value_mask` must be boolean.*complex64"),
        ("value_mask", [[True] * 5], r"`value_mask` must be a boolean tensor.*\[\[True"),
    ],
)
def test_bad_masks_are_rejected_before_the_backend(argument, mask, error):
    layer = LuongAttention(name="luong")
    query = np.ones((1, 3, 2), "float32")
    value = np.ones((1, 5, 2), "float32")
    with pytest.raises(
        (ValueError, TypeError), match=rf"LuongAttention \(layer 'luong'\): {error}"
    ):
        layer(query, value, **{argument: mask})


def test_float_and_integer_masks_act_like_boolean_masks():
    # Keras accepts 0/1 masks of any number type; so do we.
    layer = LuongAttention()
    query = np.random.default_rng(0).normal(size=(2, 3, 2)).astype("float32")
    value = np.random.default_rng(1).normal(size=(2, 5, 2)).astype("float32")
    valid = np.arange(5)[None, :] < np.array([[5], [2]])
    reference = ops.convert_to_numpy(layer(query, value, value_mask=valid))
    for dtype in ("float32", "int32"):
        got = layer(query, value, value_mask=valid.astype(dtype))
        np.testing.assert_allclose(ops.convert_to_numpy(got), reference, atol=1e-6)


def test_bad_mask_is_rejected_in_functional_construction():
    query = keras.Input((3, 2))
    with pytest.raises(ValueError, match=r"`query_mask` must have shape"):
        LuongAttention()(query, query_mask=keras.Input((4,), dtype="bool"))


@pytest.mark.parametrize("dropout", [-0.1, 1.0, "0.5"])
def test_bad_dropout(dropout):
    with pytest.raises(ValueError, match=r"`dropout` must be a float in \[0, 1\)"):
        LuongAttention(dropout=dropout)


def test_bad_seed():
    with pytest.raises(TypeError, match=r"`seed` must be an integer or None. Received: seed='x'"):
        LuongAttention(seed="x")


NO_CACHE = {
    "LuongAttention": lambda: ka.LuongAttention(name="x"),
    "AdditiveAttention": lambda: ka.AdditiveAttention(name="x"),
    "LowRankAttention": lambda: ka.LowRankAttention(rank=2, name="x"),
    "SparseAttention": lambda: ka.SparseAttention(2, 4, name="x"),
    "PerformerAttention": lambda: ka.PerformerAttention(2, 4, name="x"),
    "LinformerAttention": lambda: ka.LinformerAttention(2, 4, 2, 8, name="x"),
}


@pytest.mark.parametrize("name", sorted(NO_CACHE))
@pytest.mark.parametrize("argument", ["cache", "cache_update_index"])
def test_layers_without_a_cache_refuse_one_by_name(name, argument):
    layer = NO_CACHE[name]()
    query = random_inputs((1, 4, 8))
    given = {"cache": np.zeros((1, 2, 8, 2, 4), "float32"), "cache_update_index": 0}
    with pytest.raises(
        TypeError,
        match=rf"^{name} \(layer 'x'\): this layer takes no "
        rf"decoding `cache`.*Received: {argument}=",
    ):
        layer(query, **{argument: given[argument]})
    assert not layer.built  # refused before Keras builds anything
