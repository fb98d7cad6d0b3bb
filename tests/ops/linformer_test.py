"""Linformer kernel against a NumPy reference."""

import math

import keras
import numpy as np

from keras_attention.ops import linformer


def numpy_linformer(query, key, value, e, f, key_mask):
    keep = key_mask[:, :, None, None].astype(np.float64)
    k = np.einsum("bthd,tk->bkhd", key * keep, e[: key.shape[1]])
    v = np.einsum("bthd,tk->bkhd", value * keep, f[: key.shape[1]])
    scores = np.einsum("bqhd,bkhd->bhqk", query, k) / math.sqrt(query.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v), np.einsum(
        "bhqk,tk->bhqt", weights, f[: key.shape[1]]
    )


def test_matches_numpy_reference_with_padding():
    rng = np.random.default_rng(0)
    query = rng.standard_normal((2, 7, 3, 4)).astype("float32")
    key = rng.standard_normal((2, 9, 3, 4)).astype("float32")
    value = rng.standard_normal((2, 9, 3, 5)).astype("float32")
    e = rng.standard_normal((12, 4)).astype("float32") / 3
    f = rng.standard_normal((12, 4)).astype("float32") / 3
    key_mask = np.ones((2, 9), bool)
    key_mask[1, 6:] = False
    expected, expected_weights = numpy_linformer(query, key, value, e, f, key_mask)
    output, weights = linformer.linformer_attention(
        query, key, value, e, f, key_mask=key_mask, return_weights=True
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    # The implied weights reproduce the output from the original values.
    np.testing.assert_allclose(
        np.einsum(
            "bhqt,bthd->bqhd",
            keras.ops.convert_to_numpy(weights),
            value * key_mask[:, :, None, None],
        ),
        expected,
        atol=1e-5,
    )
