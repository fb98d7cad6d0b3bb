import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import masking
from keras_attention.ops.attention_mask import AttentionMask
from tests.reference import softmax_with_mask


def test_masked_softmax_matches_numpy():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 4, 6)).astype("float32")
    mask = rng.random((3, 4, 6)) > 0.3
    mask[0, 1] = False  # one fully masked row
    got = ops.convert_to_numpy(masking.masked_softmax(scores, mask))
    np.testing.assert_allclose(got, softmax_with_mask(scores, mask), atol=1e-6)
    np.testing.assert_array_equal(got[0, 1], np.zeros(6))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_are_zero_not_nan(dtype):
    scores = ops.cast(np.full((1, 2, 5), 60000.0, "float32"), dtype)
    mask = np.array([[[False] * 5, [True, False, True, False, False]]])
    weights = ops.convert_to_numpy(ops.cast(masking.masked_softmax(scores, mask), "float32"))
    assert keras.backend.standardize_dtype(masking.masked_softmax(scores, mask).dtype) == dtype
    assert np.all(np.isfinite(weights))
    np.testing.assert_array_equal(weights[0, 0], np.zeros(5))
    np.testing.assert_allclose(weights[0, 1], [0.5, 0, 0.5, 0, 0], atol=1e-2)


def test_half_precision_large_scores_do_not_overflow():
    scores = np.array([[[65000.0, -65000.0, 64000.0]]], "float32")
    weights = masking.masked_softmax(ops.cast(scores, "float16"))
    weights = ops.convert_to_numpy(ops.cast(weights, "float32"))
    assert np.all(np.isfinite(weights))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-3)


def test_from_tensors_combines_keras_spellings():
    query_mask = np.array([[True, True, False]])
    value_mask = np.array([[True, False, True, True]])
    explicit = np.ones((1, 3, 4), bool)
    explicit[0, 1, 0] = False
    mask = AttentionMask.from_tensors(
        query_mask=query_mask,
        key_mask=value_mask,
        attention_mask=explicit,
        causal=True,
    ).dense(3, 4)[:, 0]
    expected = (
        query_mask[:, :, None]
        & value_mask[:, None, :]
        & explicit
        & np.tril(np.ones((3, 4), bool))[None]
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(mask), expected)


def test_no_mask_sources_gives_none():
    assert AttentionMask.from_tensors().dense(3, 4) is None
    # Keras' lower-rank spellings broadcast: (Tq, Tk) and (1, Tk).
    pair = np.tril(np.ones((3, 4), bool))
    dense = ops.convert_to_numpy(AttentionMask.from_tensors(attention_mask=pair).dense(3, 4))
    np.testing.assert_array_equal(dense, pair[None, None])


def test_integer_masks_are_accepted():
    got = masking.to_bool_mask(np.array([[1, 0, 2]], "int32"))
    np.testing.assert_array_equal(ops.convert_to_numpy(got), [[True, False, True]])


def test_confine_nonfinite_flags_positions_and_keeps_finite_ones_bit_for_bit():
    rng = np.random.default_rng(0)
    key = rng.standard_normal((2, 5, 3, 4)).astype("float32")
    value = rng.standard_normal((2, 5, 3, 6)).astype("float32")
    key[0, 1, 2, 0] = np.inf  # a non-finite key
    value[1, 3, 0, 5] = np.nan  # a non-finite value
    confined_key, confined_value = (
        ops.convert_to_numpy(x) for x in masking.confine_nonfinite(key, value)
    )
    bad = np.zeros((2, 5, 3), bool)
    bad[0, 1, 2] = bad[1, 3, 0] = True
    assert np.all(np.isnan(confined_key[bad]))  # every feature of those keys
    np.testing.assert_array_equal(confined_key[~bad], key[~bad])
    np.testing.assert_array_equal(confined_value, np.nan_to_num(value, nan=0.0))
    again = masking.confine_nonfinite(confined_key, confined_value)
    np.testing.assert_array_equal(ops.convert_to_numpy(again[0]), confined_key)
