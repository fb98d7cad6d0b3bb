"""Precision under training, and gradients against finite differences (issue 11).

Every layer trains 200 steps under `mixed_float16` (with Keras' automatic loss
scaling) and `mixed_bfloat16`, on inputs scaled by 100 (large logits) with a
fully padded example in the batch: the loss stays finite and decreases. In
float64, each layer's input gradient agrees with central finite differences.
"""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from tests.testing import PUBLIC_LAYERS

BATCH, LENGTH, FEATURES = 4, 4, 8

# name -> factory; LAYERS: name -> (factory, kind), the kind from PUBLIC_LAYERS.
FACTORIES = {
    "AdditiveAttention": lambda: ka.AdditiveAttention(),
    "LuongAttention": lambda: ka.LuongAttention(score_mode="general", divide_by_sqrt_dim=True),
    "LowRankAttention": lambda: ka.LowRankAttention(rank=2),
    "MultiHeadAttention": lambda: ka.MultiHeadAttention(2, 4),
    "MultiHeadAttention-blockwise": lambda: ka.MultiHeadAttention(
        2, 4, memory_efficient=True, block_size=2
    ),
    "SparseAttention": lambda: ka.SparseAttention(
        2, 4, block_size=2, window_blocks=1, global_blocks=1, random_blocks=1, seed=0
    ),
    "PerformerAttention": lambda: ka.PerformerAttention(2, 4, num_features=16, seed=0),
    "LinformerAttention": lambda: ka.LinformerAttention(
        2, 4, projected_length=2, max_length=LENGTH
    ),
    "AttentionPooling": lambda: ka.AttentionPooling(),
    "SqueezeExcitation": lambda: ka.SqueezeExcitation(ratio=2),
    "CBAM": lambda: ka.CBAM(ratio=2, kernel_size=3),
    "TransformerEncoderBlock": lambda: ka.TransformerEncoderBlock(2, 4, 16, seed=0),
    "TransformerDecoderBlock": lambda: ka.TransformerDecoderBlock(2, 4, 16, seed=0),
}
LAYERS = {name: (make, PUBLIC_LAYERS[name.split("-")[0]]) for name, make in FACTORIES.items()}


def _apply(layer, kind, x, mask):
    if kind == "attention":
        return layer(x, query_mask=mask, value_mask=mask)
    if kind == "pooling":
        return layer(x, mask=mask)
    if kind == "encoder":
        return layer(x, padding_mask=mask)
    if kind == "decoder":
        return layer(x, x, decoder_padding_mask=mask, encoder_padding_mask=mask)
    return layer(x)


def _data(kind, scale=100.0):
    rng = np.random.default_rng(0)
    shape = (BATCH, 2, 2, FEATURES) if kind == "feature_map" else (BATCH, LENGTH, FEATURES)
    x = (rng.standard_normal(shape) * scale).astype("float32")
    mask = np.ones((BATCH, LENGTH), bool)
    mask[0] = False  # a fully padded example
    mask[1, 2:] = False
    target = rng.standard_normal((BATCH, 1)).astype("float32")
    return x, mask, target


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_trains_under_mixed_precision_with_large_logits(name, policy):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    factory, kind = LAYERS[name]
    x, mask, target = _data(kind)
    inputs = keras.Input(x.shape[1:])
    mask_input = keras.Input((LENGTH,), dtype="bool")
    y = _apply(factory(), kind, inputs, mask_input)
    if len(y.shape) > 2:
        y = keras.layers.Flatten()(y)
    outputs = keras.layers.Dense(1, dtype="float32")(y)
    model = keras.Model([inputs, mask_input], outputs)
    # Keras wraps the optimizer in a LossScaleOptimizer for mixed_float16.
    model.compile(keras.optimizers.Adam(1e-3), "mse", steps_per_execution=50)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    before = model.evaluate([x, mask], target, batch_size=BATCH, verbose=0)
    # 200 steps in one epoch, 50 per compiled call: little Python overhead.
    steps = 200
    history = model.fit(
        [np.tile(x, (steps,) + (1,) * (x.ndim - 1)), np.tile(mask, (steps, 1))],
        np.tile(target, (steps, 1)),
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
    )
    after = model.evaluate([x, mask], target, batch_size=BATCH, verbose=0)
    assert np.isfinite(history.history["loss"][-1]) and np.isfinite(after)
    for weight in model.trainable_weights:
        assert np.all(np.isfinite(ops.convert_to_numpy(weight)))
    assert after < before, (before, after)


def _central_differences(fn, x, indices, epsilon):
    grads = []
    for index in indices:
        plus, minus = x.copy(), x.copy()
        plus[index] += epsilon
        minus[index] -= epsilon
        grads.append((fn(plus) - fn(minus)) / (2 * epsilon))
    return np.array(grads)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_input_gradients_match_central_differences_in_float64(name):
    from tests.gradients import input_gradients

    factory, kind = LAYERS[name]
    keras.config.set_dtype_policy("float64")
    layer = factory()
    x, mask, _ = _data(kind, scale=1.0)
    x = x.astype("float64")
    mask[0, 0] = True  # keep the all-padded example, but not everywhere
    cotangent = (
        np.random.default_rng(1)
        .standard_normal(tuple(ops.shape(_apply(layer, kind, x, mask))))
        .astype("float32")
    )

    def forward(array):
        return _apply(layer, kind, array, mask)

    def loss(array):
        return float(np.sum(ops.convert_to_numpy(forward(array)) * cotangent))

    (analytic,) = input_gradients(forward, [x], cotangent)
    rng = np.random.default_rng(2)
    flat = rng.choice(x.size, size=6, replace=False)
    indices = [np.unravel_index(i, x.shape) for i in flat]
    # Softmaxes and the blockwise/FAVOR+ kernels run in float32 whatever the
    # dtype (by design): a step and tolerance that float32 rounding passes.
    numeric = _central_differences(loss, x, indices, epsilon=1e-3)
    np.testing.assert_allclose([analytic[i] for i in indices], numeric, rtol=2e-2, atol=2e-3)
