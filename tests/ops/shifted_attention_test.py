"""The normalise-last materialised kernel (`dense_attention.shifted_attention`,
TensorFlow XLA's default) against float64 NumPy attention: values and
gradients, every mask, grouped heads, logits large enough that an unshifted
exp would overflow, rows with no key, half precision.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import dense_attention
from tests.gradients import input_gradients
from tests.ops.memory_efficient_test import _inputs
from tests.ops.memory_efficient_test import _reference


def _case(case, logits="moderate"):
    q_len, k_len = (7, 13) if case == "causal_cross_lengths" else (11, 11)
    kv_heads = 2 if case.endswith("grouped") else 4
    q, k, v, d_out = _inputs(2, q_len, k_len, 4, kv_heads)
    if logits == "large":  # logits up to ~100: exp() unshifted overflows float32
        q = q * 40
    rng = np.random.default_rng(1)
    fields = {}
    mask = np.ones((2, q_len, k_len), bool)
    if "padding" in case:
        key_mask = np.arange(k_len)[None] < np.array([[k_len], [5]])
        fields["key_mask"] = key_mask
        mask &= key_mask[:, None, :]
    if case == "query_mask":
        fields["query_mask"] = rng.random((2, q_len)) > 0.3
        mask &= fields["query_mask"][:, :, None]
    if case == "attention_mask":
        pair = rng.random((2, q_len, k_len)) > 0.5
        fields["pair_mask"] = pair[:, None]
        mask &= pair
    if case.startswith("causal"):
        fields["causal"] = True
        mask &= np.tril(np.ones((q_len, k_len), bool))[None]
    return (q, k, v, d_out), attention_masks.AttentionMask(**fields), mask


def _compiled(fn):
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    return fn


CASES = [
    "plain",
    "key_padding",
    "query_mask",
    "attention_mask",
    "causal_cross_lengths",
    "causal_padding_grouped",
]


@pytest.mark.parametrize(
    "logits, compiled", [("moderate", False), ("moderate", True), ("large", True)]
)
@pytest.mark.parametrize("case", CASES)
def test_matches_numpy_values_and_gradients(case, compiled, logits):
    (q, k, v, d_out), mask, dense_mask = _case(case, logits)
    expected, expected_grads = _reference(q, k, v, dense_mask, d_out)

    def attend(q, k, v):
        return dense_attention.shifted_attention(q, k, v, mask, scale=8**-0.5)

    fn = _compiled(attend) if compiled else attend
    out = ops.convert_to_numpy(fn(q, k, v))
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # float32 logits 40x larger lose ~40x the absolute precision in exp().
    atol = 1e-5 if logits == "moderate" else 4e-4
    for got, want in zip(input_gradients(fn, [q, k, v], d_out), expected_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=atol)


def test_rows_without_keys_give_zero_output_and_finite_zero_gradients():
    q, k, v, d_out = _inputs(2, 5, 6, 2, 2)
    key_mask = np.ones((2, 6), bool)
    key_mask[1] = False
    mask = attention_masks.AttentionMask(key_mask=key_mask)

    def attend(q, k, v):
        return dense_attention.shifted_attention(q, k, v, mask, scale=8**-0.5)

    fn = _compiled(attend)
    out = ops.convert_to_numpy(fn(q, k, v))
    np.testing.assert_array_equal(out[1], 0.0)
    assert np.all(np.isfinite(out))
    grads = input_gradients(fn, [q, k, v], d_out)
    for grad in grads:
        assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grads[0][1], 0.0)
    np.testing.assert_array_equal(grads[1][1], 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_runs_in_float32_and_keeps_the_dtype(dtype):
    q, k, v, _ = _inputs(1, 9, 9, 2, 2)
    causal = np.tril(np.ones((9, 9), bool))[None]
    key_mask = np.ones((1, 9), bool)
    key_mask[0, 0] = False  # row 0 then sees nothing: zeros, not NaN
    mask = attention_masks.AttentionMask(causal=True, key_mask=key_mask)
    rounded = [
        np.asarray(ops.convert_to_numpy(ops.cast(ops.cast(a, dtype), "float32"))) for a in (q, k, v)
    ]
    expected, _ = _reference(*rounded, causal & key_mask[:, None], np.zeros((1, 9, 2, 6)))
    out = _compiled(
        lambda q, k, v: dense_attention.shifted_attention(q, k, v, mask, scale=8**-0.5)
    )(*(ops.cast(a, dtype) for a in (q, k, v)))
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = ops.convert_to_numpy(ops.cast(out, "float32"))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, 0], 0.0)
    np.testing.assert_allclose(out, expected, atol=2e-2, rtol=2e-2)
