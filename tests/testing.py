"""Helpers shared by the tests, and the checks every keras_attention layer must pass.

`to_numpy` turns whatever a layer returns into a float64 NumPy array;
`PUBLIC_LAYERS` and `NOT_LAYERS` are the catalogue of the public layers.

`run_layer_contract_test` is our counterpart of Keras' `run_layer_test`: one
call checks the config round-trip, the `__init__`/`get_config` agreement,
`Sequential.add` self-attention, functional cross-attention with symbolic
shapes, `.keras` save/load with `safe_mode=True`, a `fit` step compiled with
XLA (`jit_compile=True`: XLA on TensorFlow, `jax.jit` on JAX) and a
mixed-precision pass.
"""

import inspect
import os

import keras
import numpy as np

# Every public layer, by class name, with the kind of inputs it takes:
# "attention" (query and value), "pooling" (a sequence to one vector),
# "feature_map" (images), "encoder" and "decoder" (the Transformer blocks),
# "sequence" (the position layers).
PUBLIC_LAYERS = {
    "AdditiveAttention": "attention",
    "LuongAttention": "attention",
    "LowRankAttention": "attention",
    "MultiHeadAttention": "attention",
    "SparseAttention": "attention",
    "PerformerAttention": "attention",
    "LinformerAttention": "attention",
    "AttentionPooling": "pooling",
    "SqueezeExcitation": "feature_map",
    "CBAM": "feature_map",
    "TransformerEncoderBlock": "encoder",
    "TransformerDecoderBlock": "decoder",
    "PositionEmbedding": "sequence",
    "SinusoidalPositionEncoding": "sequence",
    "RotaryEmbedding": "sequence",
}

# The other names of `keras_attention.layers.__all__`: the family bases (for
# subclassing), a callback and functions.
NOT_LAYERS = frozenset(
    {
        "BaseAttention",
        "ScoreAttention",
        "BaseMultiHeadAttention",
        "RedrawFeatures",
        "capture_attention",
        "attention_memory_budget",
        "set_attention_memory_budget",
        # A score modifier for `MultiHeadAttention(score_mod=...)`, not called
        # on inputs itself (tests/layers/relative_position_bias_test.py).
        "RelativePositionBias",
    }
)


def to_numpy(x):
    """A tensor, variable or array of any backend and dtype as a float64 NumPy array."""
    return np.asarray(keras.ops.convert_to_numpy(x), dtype="float64")


def assert_config_covers_init(layer):
    """Every `__init__` argument of the layer's class appears in `get_config`."""
    config = layer.get_config()
    missing = []
    for cls in type(layer).__mro__:
        if cls is keras.layers.Layer:
            break
        if "__init__" not in vars(cls):
            continue
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                continue
            if name not in config:
                missing.append(f"{cls.__name__}.{name}")
    assert not missing, f"get_config() lacks constructor arguments: {missing}"


def random_inputs(shape, seed=0, dtype="float32"):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def run_layer_contract_test(
    make_layer,
    tmp_path,
    query_shape=(2, 5, 8),
    value_shape=(2, 7, 6),
    expected_output_shape=None,
    expected_cross_output_shape=None,
    cross_attention=True,
    mixed_precision=("mixed_float16", "mixed_bfloat16"),
):
    """Runs the contract checks. `make_layer(**kwargs)` returns a new layer.

    Args:
        make_layer: factory; called with extra kwargs such as `dtype=`.
        tmp_path: a folder for the `.keras` file.
        query_shape, value_shape: input shapes with a concrete batch size.
        expected_output_shape: output shape of self-attention on `query_shape`
            (defaults to `query_shape`).
        expected_cross_output_shape: output shape of cross-attention (defaults
            to `query_shape[:-1] + value_shape[-1:]`).
        cross_attention: whether the layer takes a separate `value`.
        mixed_precision: dtype policies to try.
    """
    expected_output_shape = tuple(expected_output_shape or query_shape)
    if expected_cross_output_shape is None:
        expected_cross_output_shape = tuple(query_shape[:-1]) + (value_shape[-1],)
    query = random_inputs(query_shape, seed=1)
    value = random_inputs(value_shape, seed=2)

    # Config: covers the constructor and survives a round trip.
    layer = make_layer()
    assert_config_covers_init(layer)
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    assert (
        keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(layer)
        ).get_config()
        == config
    )

    # Sequential.add: one input means self-attention.
    model = keras.Sequential([keras.Input(query_shape[1:])])
    model.add(make_layer())
    model.add(keras.layers.Dense(3))
    assert tuple(model.output_shape[1:]) == expected_output_shape[1:-1] + (3,)
    out = model(query)
    assert tuple(out.shape) == expected_output_shape[:-1] + (3,)
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    target = random_inputs(expected_output_shape[:-1] + (3,), seed=3)
    history = model.fit(query, target, epochs=2, batch_size=query_shape[0], verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))

    # Save and load with safe_mode: identical outputs.
    path = os.path.join(str(tmp_path), "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(query)),
        keras.ops.convert_to_numpy(model(query)),
        rtol=0,
        atol=0,
    )

    if cross_attention:
        # Functional cross-attention: symbolic shapes equal the eager ones.
        query_input = keras.Input(query_shape[1:])
        value_input = keras.Input(value_shape[1:])
        cross_layer = make_layer()
        output, scores = cross_layer(query_input, value_input, return_attention_scores=True)
        functional = keras.Model([query_input, value_input], [output, scores])
        eager_output, eager_scores = functional([query, value])
        assert tuple(eager_output.shape) == tuple(expected_cross_output_shape)
        assert tuple(output.shape[1:]) == tuple(eager_output.shape[1:])
        assert tuple(scores.shape[1:]) == tuple(eager_scores.shape[1:])

    # Mixed precision: computes in half precision, stays finite.
    for policy in mixed_precision:
        half = make_layer(dtype=policy)
        out = half(query) if not cross_attention else half(query, value)
        assert keras.backend.standardize_dtype(out.dtype) == policy.split("_")[1]
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))))
