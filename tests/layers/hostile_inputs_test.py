"""Bad and edge inputs, tried as a hostile user would (issue 11).

Each class of failure the independent battery found has a test here: empty
inputs, integer inputs, NaN in masked positions and in the blockwise kernel,
masks in returned weights, error messages that name the class the user built,
and silently clamped arguments. `fuzz_test.py` covers the same contract over
random configurations.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from tests.testing import to_numpy

# Every attention layer of the package, small, one key/value call each.
ATTENTION_LAYERS = {
    "additive": lambda: ka.AdditiveAttention(),
    "luong_dot": lambda: ka.LuongAttention(score="dot"),
    "luong_general": lambda: ka.LuongAttention(score="general"),
    "low_rank": lambda: ka.LowRankAttention(rank=2),
    "mha_dense": lambda: ka.MultiHeadAttention(2, 4, memory_efficient=False),
    "mha_blockwise": lambda: ka.MultiHeadAttention(2, 4, memory_efficient=True, block_size=2),
    "mha_grouped": lambda: ka.MultiHeadAttention(2, 4, num_key_value_heads=1),
    "sparse": lambda: ka.SparseAttention(
        2,
        4,
        block_size=2,
        window_blocks=1,
        global_blocks=1,
        random_blocks=1,
        seed=0,
    ),
    "performer": lambda: ka.PerformerAttention(2, 4, num_features=8, seed=0),
    "performer_relu": lambda: ka.PerformerAttention(2, 4, num_features=8, kernel="relu", seed=0),
    "linformer": lambda: ka.LinformerAttention(2, 4, projected_length=3, max_length=8),
}
WEIGHTED = [n for n in ATTENTION_LAYERS if not n.startswith("performer")]


def _array(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


# ------------------------------------------------------------------ empty
@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
@pytest.mark.parametrize(
    "query_shape, value_shape",
    [((0, 4, 6), (0, 4, 6)), ((2, 0, 6), (2, 4, 6)), ((2, 4, 6), (2, 0, 6))],
    ids=["batch0", "query_length0", "key_length0"],
)
def test_empty_inputs_give_empty_or_zero_outputs(name, query_shape, value_shape):
    layer = ATTENTION_LAYERS[name]()
    output = layer(_array(*query_shape), _array(*value_shape))
    assert tuple(output.shape) == query_shape
    # Keys of length 0: nothing to attend to, the result of a fully masked
    # row (zero attention, then the output projection's zero bias).
    np.testing.assert_array_equal(to_numpy(output), 0.0)


@pytest.mark.parametrize("name", WEIGHTED)
def test_empty_keys_give_zero_weights_of_the_right_shape(name):
    layer = ATTENTION_LAYERS[name]()
    _, weights = layer(_array(2, 3, 6), _array(2, 0, 6), return_attention_scores=True)
    assert 0 in tuple(weights.shape) and tuple(weights.shape)[:1] == (2,)


# ---------------------------------------------------------------- integer
@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
def test_integer_inputs_run_in_the_compute_dtype(name):
    query = np.arange(2 * 3 * 6).reshape(2, 3, 6).astype("int32") % 3
    value = np.arange(2 * 4 * 6).reshape(2, 4, 6).astype("int32") % 5
    layer = ATTENTION_LAYERS[name]()
    output = layer(query, value)
    expected = layer(query.astype("float32"), value.astype("float32"))
    assert keras.backend.standardize_dtype(output.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(output), to_numpy(expected), atol=1e-5)


def test_luong_dot_on_integers_does_not_truncate_the_weights():
    query = np.array([[[1, 0], [0, 1]]], "int32")
    value = np.array([[[1, 0], [0, 1], [1, 1]]], "int32")
    _, weights = ka.LuongAttention(score_mode="dot")(query, value, return_attention_scores=True)
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(weights).sum(-1), 1.0, atol=1e-6)
    assert to_numpy(weights).max() < 1.0


def test_attention_pooling_keeps_its_learned_query_float():
    layer = ka.AttentionPooling(score="dot")
    inputs = np.random.default_rng(0).integers(-3, 4, (2, 5, 4)).astype("int32")
    output = layer(inputs)
    expected = layer(inputs.astype("float32"))
    assert keras.backend.standardize_dtype(output.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(output), to_numpy(expected), atol=1e-5)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: ka.SqueezeExcitation(ratio=2), (2, 3, 3, 4)),
        (lambda: ka.CBAM(ratio=2), (2, 3, 3, 4)),
        (lambda: ka.TransformerEncoderBlock(2, 4, 8, seed=0), (2, 5, 8)),
    ],
    ids=["squeeze_excitation", "cbam", "encoder_block"],
)
def test_composite_layers_cast_integer_inputs(make, shape):
    inputs = (np.arange(np.prod(shape)).reshape(shape) % 7).astype("int32")
    layer = make()
    output = layer(inputs)
    assert keras.backend.standardize_dtype(output.dtype) == "float32"
    np.testing.assert_allclose(
        to_numpy(output), to_numpy(layer(inputs.astype("float32"))), atol=1e-5
    )


@pytest.mark.both_backends
def test_string_inputs_raise_a_type_error_naming_the_layer():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("string tensors are TensorFlow's")
    import tensorflow as tf

    with pytest.raises(TypeError, match=r"SqueezeExcitation .*`inputs`.*string"):
        ka.SqueezeExcitation(ratio=1).call(tf.fill((1, 2, 2, 2), "a"))


@pytest.mark.both_backends
@pytest.mark.parametrize("argument", ["segment_ids", "key_segment_ids", "position_ids"])
@pytest.mark.parametrize("layer", ["MultiHeadAttention", "SparseAttention"])
def test_text_ids_are_refused_before_the_backend_converts_them(layer, argument):
    """#49: on JAX a text array failed inside `jax.numpy` ("could not convert
    string to float") before the layer's own check of the ids ran."""
    make = getattr(ka, layer)
    if argument == "position_ids" and layer != "MultiHeadAttention":
        pytest.skip("rotary positions are MultiHeadAttention's")
    x = np.zeros((1, 4, 8), "float32")
    ids = np.array([["a", "a", "b", "b"]])
    kwargs = {argument: ids}
    if argument == "key_segment_ids":
        kwargs["segment_ids"] = np.zeros((1, 4), "int32")
    with pytest.raises(ValueError, match=rf"{layer} .*`{argument}` must be integers.*string"):
        make(2, 4)(x, x, **kwargs)


# -------------------------------------------------------------------- NaN
@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
def test_nan_in_masked_positions_contributes_nothing(name):
    query, value = _array(2, 4, 6), _array(2, 4, 6, seed=1)
    query_mask = np.array([[True, True, True, False]] * 2)
    value_mask = np.array([[True, False, True, True]] * 2)
    clean = ATTENTION_LAYERS[name]()
    expected = clean(query, value, query_mask=query_mask, value_mask=value_mask)
    poisoned_query, poisoned_value = query.copy(), value.copy()
    poisoned_query[:, 3] = np.nan
    poisoned_value[:, 1] = np.inf
    poisoned_value[0, 1, 0] = np.nan
    output = clean(poisoned_query, poisoned_value, query_mask=query_mask, value_mask=value_mask)
    assert np.all(np.isfinite(to_numpy(output)))
    np.testing.assert_allclose(to_numpy(output), to_numpy(expected), atol=1e-5)


@pytest.mark.parametrize("name", ["mha_dense", "mha_blockwise", "additive", "sparse"])
def test_nan_in_a_masked_position_leaves_gradients_finite(name):
    layer = ATTENTION_LAYERS[name]()
    value = _array(2, 4, 6, seed=1)
    value[:, 2] = np.nan
    mask = np.array([[True, True, False, True]] * 2)
    layer(_array(2, 4, 6), value, value_mask=mask)
    from tests.gradients import layer_gradients

    _, input_grads, weight_grads = layer_gradients(
        layer, (_array(2, 4, 6), value), _array(2, 4, 6, seed=2), value_mask=mask
    )
    for grad in input_grads + weight_grads:
        assert np.all(np.isfinite(to_numpy(grad)))


@pytest.mark.parametrize("kernel", ["mha_dense", "mha_blockwise"])
def test_a_nan_batch_row_stays_nan_on_every_exact_kernel(kernel):
    query = _array(2, 4, 6)
    query[1] = np.nan  # a diverging example must stay visible
    output = to_numpy(ATTENTION_LAYERS[kernel]()(query, _array(2, 4, 6)))
    assert np.all(np.isfinite(output[0]))
    assert np.all(np.isnan(output[1]))


def test_blockwise_kernel_propagates_nan_like_the_exact_one():
    from keras_attention.ops.memory_efficient import memory_efficient_attention

    query = _array(2, 5, 2, 4)
    query[1, 2] = np.nan
    out = to_numpy(
        memory_efficient_attention(
            query,
            _array(2, 5, 2, 4, seed=1),
            _array(2, 5, 2, 4, seed=2),
            block_size=2,
        )
    )
    assert np.all(np.isnan(out[1, 2])) and np.all(np.isfinite(out[0]))


# ---------------------------------------------------------- masks in weights
@pytest.mark.parametrize("name", WEIGHTED)
def test_returned_weights_are_zero_on_masked_rows_and_keys(name):
    mask = np.array([[True, True, False, False], [False, False, False, False]])
    _, weights = ATTENTION_LAYERS[name]()(
        _array(2, 4, 6),
        _array(2, 4, 6, seed=1),
        query_mask=mask,
        value_mask=mask,
        return_attention_scores=True,
    )
    weights = to_numpy(weights)
    np.testing.assert_array_equal(weights[..., 2:], 0.0)  # padded keys
    np.testing.assert_array_equal(weights[1], 0.0)  # fully masked example
    np.testing.assert_array_equal(weights[..., 2:, :], 0.0)  # masked query rows


# ---------------------------------------------------------------- messages
@pytest.mark.parametrize(
    "make, pattern",
    [
        (lambda: ka.SparseAttention(0, 4), r"^SparseAttention: .*num_heads=0"),
        (lambda: ka.PerformerAttention(2, 0), r"^PerformerAttention: .*key_dim=0"),
        (
            lambda: ka.LinformerAttention(2, 4, 2, 8, value_dim=-1),
            r"^LinformerAttention: .*value_dim=-1",
        ),
        (lambda: ka.AttentionPooling(score="nope"), r"^AttentionPooling: .*'nope'"),
    ],
)
def test_constructor_errors_name_the_class_built(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ka.SparseAttention(2, 4, block_size=2, global_blocks=1, seed=0),
        lambda: ka.PerformerAttention(2, 4, num_features=8, seed=0),
        lambda: ka.LinformerAttention(2, 4, 2, 8),
    ],
)
def test_call_errors_name_the_class_built(make):
    layer = make()
    name = type(layer).__name__
    with pytest.raises(ValueError, match=rf"{name} \(layer '.*'\): `query_mask`"):
        layer(_array(2, 4, 6), query_mask=np.ones((2, 5), bool))


def test_attention_pooling_mask_errors_name_attention_pooling():
    layer = ka.AttentionPooling()
    with pytest.raises(ValueError, match=r"^AttentionPooling \(layer .*`mask`.*\(2, 5\)"):
        layer(_array(2, 4, 3), mask=np.ones((2, 5), bool))
    layer(_array(2, 4, 3))
    with pytest.raises(ValueError, match=r"AttentionPooling \(layer .*6 features.*built for 3"):
        layer(_array(2, 4, 6))
    with pytest.raises(TypeError, match=r"^AttentionPooling \(layer .*`inputs`.*None"):
        layer(None)


@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
def test_a_missing_query_is_a_type_error_naming_the_layer(name):
    layer = ATTENTION_LAYERS[name]()
    with pytest.raises(TypeError, match=rf"{type(layer).__name__} \(layer .*query=None"):
        layer(None, _array(2, 4, 6))


@pytest.mark.parametrize("name", ["additive", "mha_dense", "sparse", "linformer"])
def test_key_without_value_reports_the_key(name):
    layer = ATTENTION_LAYERS[name]()
    with pytest.raises(ValueError, match=r"`key` was given without `value`.*\(2, 5, 6\)"):
        layer(_array(2, 3, 6), key=_array(2, 5, 6))


# ---------------------------------------------------------------- clamping
def test_an_eager_cache_index_beyond_the_cache_raises():
    layer = ka.MultiHeadAttention(2, 4)
    layer(_array(1, 3, 8))
    cache = ops.zeros((1, 2, 4, 2, 4))
    step = _array(1, 1, 8)
    for index in (4, ops.convert_to_tensor(4), ops.convert_to_tensor(-1), np.int32(7)):
        with pytest.raises(ValueError, match=r"MultiHeadAttention .*cache_update_index="):
            layer(step, cache=cache, cache_update_index=index)
    layer(step, cache=cache, cache_update_index=ops.convert_to_tensor(3))


def test_linformer_rejects_a_projection_longer_than_the_sequence():
    with pytest.raises(ValueError, match=r"^LinformerAttention: .*projected_length=9"):
        ka.LinformerAttention(2, 4, projected_length=9, max_length=8)
    ka.LinformerAttention(2, 4, projected_length=8, max_length=8)
