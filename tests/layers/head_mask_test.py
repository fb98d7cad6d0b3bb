"""`MultiHeadAttention(head_mask=...)` (#38) on every kernel, against float64 NumPy.

The reference (`tests/attention_reference.reference`) scales each head's
context before the output projection; a second, independent check: a head
masked with 0 gives what the same layer gives with that head's rows of the
output projection zeroed. Gradients with respect to the mask are checked
against the reference's (the output is linear in the mask).
"""

import keras
import numpy as np
import pytest

from keras_attention import MultiHeadAttention
from keras_attention.layers.machinery import kernel_selector
from keras_attention.layers.machinery.kernel_selector import Kernel
from tests.attention_reference import positional
from tests.attention_reference import reference
from tests.gradients import input_gradients
from tests.kernel_spy import spy_kernels
from tests.testing import to_numpy

BACKEND = keras.backend.backend()
HEADS, KV_HEADS, KEY_DIM, FEATURES = 4, 2, 3, 5


def _kernels():
    """(label, layer options, call options, kernel, mode)."""
    kernels = [
        ("dense", dict(memory_efficient=False), dict(return_attention_scores=True), Kernel.DENSE),
        ("composite", dict(memory_efficient=False), {}, Kernel.COMPOSITE),
        ("blockwise", dict(memory_efficient=True, block_size=2), {}, Kernel.BLOCKWISE),
        ("fused", dict(flash_attention=True), {}, Kernel.FUSED),
    ]
    if BACKEND == "tensorflow":
        kernels.append(("shifted", dict(memory_efficient=False), {}, Kernel.SHIFTED))
    return kernels


KERNELS = _kernels()


def _layer(rng, x, **options):
    layer = MultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, num_key_value_heads=KV_HEADS, use_gate=True, **options
    )
    layer.build(x.shape, x.shape)
    # Every weight and bias random: zero biases hide bugs.
    layer.set_weights([rng.normal(scale=0.6, size=w.shape) for w in layer.get_weights()])
    weights = {w.path.split("/", 1)[1]: to_numpy(w.value) for w in layer.weights}
    return layer, weights


def _run(label, fn, *args):
    if label != "shifted":
        return fn(*args)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)(*args)


MASKS = {
    "per_head": lambda rng, batch: np.array([1.0, 0.0, 1.0, 0.0], "float32"),
    "per_example_soft": lambda rng, batch: rng.uniform(size=(batch, HEADS)).astype("float32"),
    "bool": lambda rng, batch: np.array([True, True, False, True]),
}


@pytest.mark.parametrize("mask_kind", sorted(MASKS))
@pytest.mark.parametrize(
    "label, options, call_options, kernel", KERNELS, ids=[k[0] for k in KERNELS]
)
def test_head_mask_matches_float64_numpy_on_every_kernel(
    monkeypatch, label, options, call_options, kernel, mask_kind
):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, FEATURES)).astype("float32")
    layer, weights = _layer(rng, x, **options)
    head_mask = MASKS[mask_kind](rng, 2)
    if label == "fused":  # this CPU has none: fake its presence, run the composite call
        monkeypatch.setattr(kernel_selector, "fused_kernel_available", lambda: True)
    ran = spy_kernels(monkeypatch, flash_flags=[] if label == "fused" else None)

    def call(x, mask):
        return layer(x, use_causal_mask=True, head_mask=mask, **call_options)

    result = _run(
        label, call, keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(head_mask)
    )
    assert ran == [kernel]
    allowed = positional(np.arange(6), np.arange(6), True, None)
    expected, expected_weights = reference(
        weights, x, x, allowed, HEADS, KV_HEADS, True, head_mask=head_mask
    )
    output = to_numpy(result[0] if call_options else result)
    np.testing.assert_allclose(output, expected, atol=2e-5, rtol=0)
    if call_options:  # the returned weights are the unmasked ones
        np.testing.assert_allclose(to_numpy(result[1]), expected_weights, atol=2e-6)
    # The mask bites here (a mask ignored would pass otherwise).
    unmasked, _ = reference(weights, x, x, allowed, HEADS, KV_HEADS, True)
    assert np.abs(unmasked - expected).max() > 1e-2


@pytest.mark.parametrize(
    "label, options, call_options, kernel", KERNELS, ids=[k[0] for k in KERNELS]
)
def test_a_zero_head_is_its_output_projection_rows_zeroed(
    monkeypatch, label, options, call_options, kernel
):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, FEATURES)).astype("float32")
    layer, _ = _layer(rng, x, **options)
    head_mask = np.array([1.0, 1.0, 0.0, 1.0], "float32")
    if label == "fused":
        monkeypatch.setattr(kernel_selector, "fused_kernel_available", lambda: True)
    ran = spy_kernels(monkeypatch, flash_flags=[] if label == "fused" else None)
    masked = _run(label, lambda x: layer(x, head_mask=head_mask, **call_options), x)
    kernel_weights = to_numpy(layer.output_dense.kernel)  # (H, Dv, F)
    kernel_weights[2] = 0.0
    layer.output_dense.kernel.assign(kernel_weights.astype("float32"))
    zeroed = _run(label, lambda x: layer(x, **call_options), x)
    assert ran == [kernel, kernel]
    if call_options:
        masked, zeroed = masked[0], zeroed[0]
    np.testing.assert_allclose(to_numpy(masked), to_numpy(zeroed), atol=1e-6)


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["materialised", "blockwise"])
def test_gradient_with_respect_to_the_head_mask_matches_numpy(memory_efficient):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 6, FEATURES)).astype("float32")
    layer, weights = _layer(rng, x, memory_efficient=memory_efficient, block_size=2)
    cotangent = rng.normal(size=(2, 6, FEATURES)).astype("float32")
    head_mask = rng.uniform(size=(2, HEADS)).astype("float32")
    (gradient,) = input_gradients(lambda m: layer(x, head_mask=m), [head_mask], cotangent)
    # The output is linear in the mask: d<out, cot>/dm[b, h] is head h's
    # projected context for example b, against the cotangent.
    allowed = np.ones((1, 1, 6, 6), bool)
    bias = weights["attention_output/bias"]
    expected = np.zeros((2, HEADS))
    for h in range(HEADS):
        one_head = np.zeros((2, HEADS))
        one_head[:, h] = 1.0
        out, _ = reference(weights, x, x, allowed, HEADS, KV_HEADS, True, head_mask=one_head)
        expected[:, h] = ((out - bias) * cotangent).sum(axis=(1, 2))
    np.testing.assert_allclose(gradient, expected, rtol=1e-4, atol=1e-5)


def test_head_mask_with_a_decoding_cache_matches_the_full_call():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 4, FEATURES)).astype("float32")
    layer, weights = _layer(rng, x)
    head_mask = np.array([[0.0, 1.0, 0.5, 1.0], [1.0, 0.0, 1.0, 0.25]], "float32")
    cache = keras.ops.zeros((2, 2, 4, KV_HEADS, KEY_DIM))
    steps = []
    for t in range(4):
        out, cache = layer(
            x[:, t : t + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=t,
            head_mask=head_mask,
        )
        steps.append(to_numpy(out))
    allowed = positional(np.arange(4), np.arange(4), True, None)
    expected, _ = reference(weights, x, x, allowed, HEADS, KV_HEADS, True, head_mask=head_mask)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), expected, atol=2e-5)


def test_per_example_head_mask_with_attention_axes():
    # (B, T, S, F) attending over S: the T axis joins the batch inside the
    # layer, and each example's mask must follow its own T slices.
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 4, FEATURES)).astype("float32")
    layer = MultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, num_key_value_heads=KV_HEADS, attention_axes=(2,)
    )
    layer.build(x.shape, x.shape)
    layer.set_weights([rng.normal(scale=0.6, size=w.shape) for w in layer.get_weights()])
    weights = {w.path.split("/", 1)[1]: to_numpy(w.value) for w in layer.weights}
    head_mask = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.5, 1.0]], "float32")
    output = to_numpy(layer(x, head_mask=head_mask))
    flat = x.reshape(6, 4, FEATURES)
    allowed = np.ones((1, 1, 4, 4), bool)
    expected, _ = reference(
        weights, flat, flat, allowed, HEADS, KV_HEADS, False, head_mask=np.repeat(head_mask, 3, 0)
    )
    np.testing.assert_allclose(output, expected.reshape(x.shape), atol=2e-5)


def test_a_symbolic_head_mask_in_a_functional_model():
    inputs = keras.Input((5, FEATURES))
    mask = keras.Input((HEADS,))
    layer = MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM)
    model = keras.Model([inputs, mask], layer(inputs, head_mask=mask))
    x = np.random.default_rng(6).normal(size=(2, 5, FEATURES)).astype("float32")
    zero = np.zeros((2, HEADS), "float32")
    bias = to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(to_numpy(model([x, zero])), np.broadcast_to(bias, (2, 5, 5)))


@pytest.mark.parametrize(
    "head_mask, error, match",
    [
        ("abc", TypeError, "head_mask='abc'"),
        (np.array(["a"] * HEADS), TypeError, "must hold numbers"),
        (np.ones(HEADS + 1), ValueError, r"shape \(5,\)"),
        (np.ones((3, HEADS)), ValueError, r"shape \(3, 4\)"),
        (np.ones((2, HEADS, 1)), ValueError, r"shape \(2, 4, 1\)"),
    ],
    ids=["string", "string_array", "wrong_heads", "wrong_batch", "wrong_rank"],
)
def test_bad_head_masks_are_refused_naming_the_layer(head_mask, error, match):
    layer = MultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM, name="probe")
    x = np.ones((2, 3, FEATURES), "float32")
    with pytest.raises(error, match=match) as raised:
        layer(x, head_mask=head_mask)
    assert "MultiHeadAttention (layer 'probe')" in str(raised.value)
    assert "head_mask" in str(raised.value)
    # Symbolic inputs are checked too.
    with pytest.raises(error, match=match):
        layer(keras.Input((3, FEATURES), batch_size=2), head_mask=head_mask)
