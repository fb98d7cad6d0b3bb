"""FAVOR+ kernels against NumPy references and against exact softmax."""

import math

import keras
import numpy as np
import pytest

from keras_attention.ops import favor
from tests.gradients import compiled_squared_sum_gradient
from tests.gradients import input_gradients


def _inputs(batch=2, tq=23, tv=23, heads=2, dim=4, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return (
        (scale * rng.standard_normal((batch, tq, heads, dim))).astype("float32"),
        (scale * rng.standard_normal((batch, tv, heads, dim))).astype("float32"),
        rng.standard_normal((batch, tv, heads, dim + 1)).astype("float32"),
    )


def numpy_features(x, projection, kernel):
    """Unstabilised features straight from the definitions, float64."""
    x = x.astype(np.float64).transpose(0, 2, 1, 3) * x.shape[-1] ** -0.25
    projected = x @ projection.astype(np.float64).T
    m = projection.shape[0]
    if kernel == "softmax":
        return np.exp(projected - (x**2).sum(-1, keepdims=True) / 2) / math.sqrt(m)
    # The ReLU kernel is defined with its epsilon (Performer's generalised kernel).
    return np.maximum(projected, 0) / math.sqrt(m) + 1e-3


def numpy_kernel_attention(qf, kf, value, allowed):
    """`allowed` (B, Tq, Tv); returns output (B, Tq, H, Dv) and weights."""
    a = qf @ kf.transpose(0, 1, 3, 2) * allowed[:, None]
    total = a.sum(-1, keepdims=True)
    weights = np.divide(a, total, out=np.zeros_like(a), where=total > 0)
    return (weights @ value.astype(np.float64).transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3), weights


def numpy_softmax_attention(query, key, value):
    q = query.astype(np.float64).transpose(0, 2, 1, 3)
    k = key.astype(np.float64).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return weights


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_time_paths_match_numpy_kernel_attention(kernel, causal):
    query, key, value = _inputs()
    projection = favor.random_projection(16, 4, orthogonal=True, seed=3)
    key_mask = np.ones((2, 23), bool)
    key_mask[1, 17:] = False
    allowed = np.broadcast_to(key_mask[:, None, :], (2, 23, 23))
    if causal:
        allowed = allowed & np.tril(np.ones((23, 23), bool))[None]
    expected, _ = numpy_kernel_attention(
        numpy_features(query, projection, kernel),
        numpy_features(key, projection, kernel),
        value,
        allowed,
    )
    output = favor.favor_attention(
        query,
        key,
        value,
        projection,
        kernel=kernel,
        causal=causal,
        key_mask=key_mask,
        chunk_size=5,  # 23 is not a multiple of 5
    )
    # The softmax stabiliser's epsilon is the only departure from the reference.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, rtol=2e-3, atol=2e-3)


def test_masked_keys_contribute_nothing():
    query, key, value = _inputs()
    projection = favor.random_projection(8, 4, seed=0)
    key_mask = np.ones((2, 23), bool)
    key_mask[:, 10:] = False
    changed_key, changed_value = key.copy(), value.copy()
    changed_key[:, 10:] = 50.0  # would dominate the max if it were not masked
    changed_value[:, 10:] = -7.0
    for causal in (False, True):
        a = favor.favor_attention(
            query, key, value, projection, causal=causal, key_mask=key_mask, chunk_size=4
        )
        b = favor.favor_attention(
            query,
            changed_key,
            changed_value,
            projection,
            causal=causal,
            key_mask=key_mask,
            chunk_size=4,
        )
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), atol=1e-6
        )


def test_explicit_mask_and_weights_use_the_same_features():
    query, key, value = _inputs(tq=9, tv=11)
    projection = favor.random_projection(16, 4, seed=1)
    attention_mask = np.random.default_rng(0).random((2, 9, 11)) > 0.4
    expected, expected_weights = numpy_kernel_attention(
        numpy_features(query, projection, "softmax"),
        numpy_features(key, projection, "softmax"),
        value,
        attention_mask,
    )
    output, weights = favor.favor_attention(
        query,
        key,
        value,
        projection,
        attention_mask=attention_mask,
        return_weights=True,
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=2e-3)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), expected_weights, atol=2e-3)


def test_many_features_approximate_exact_softmax():
    query, key, value = _inputs(batch=1, tq=6, tv=6, dim=8)
    projection = favor.random_projection(8192, 8, orthogonal=True, seed=0)
    _, weights = favor.favor_attention(query, key, value, projection, return_weights=True)
    exact = numpy_softmax_attention(query, key, value)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weights), exact, atol=0.02)
    # ... and few features approximate it worse (the test above can fail).
    _, rough = favor.favor_attention(
        query, key, value, favor.random_projection(2, 8, seed=0), return_weights=True
    )
    assert np.abs(keras.ops.convert_to_numpy(rough) - exact).max() > 0.02


def test_orthogonal_projection_blocks_are_orthogonal():
    projection = favor.random_projection(10, 4, orthogonal=True, seed=2)
    assert projection.shape == (10, 4)
    for start in (0, 4):
        block = projection[start : start + 4]
        gram = block @ block.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-5)
    # Rows keep Gaussian-like norms (chi with d degrees of freedom), not 1.
    assert not np.allclose(np.linalg.norm(projection, axis=1), 1.0)


def test_features_are_float32_and_finite_for_large_half_precision_inputs():
    query, key, value = _inputs(scale=30.0)
    projection = favor.random_projection(16, 4, seed=0)
    for causal in (False, True):
        output = favor.favor_attention(
            query.astype("float16"),
            key.astype("float16"),
            value.astype("float16"),
            projection,
            causal=causal,
        )
        assert keras.backend.standardize_dtype(output.dtype) == "float16"
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(output)))
    features = favor.softmax_features(
        keras.ops.cast(query.transpose(0, 2, 1, 3), "float16"),
        projection,
        is_query=True,
    )
    assert keras.backend.standardize_dtype(features.dtype) == "float32"


def test_trigonometric_features_estimate_the_softmax_kernel():
    rng = np.random.default_rng(0)
    x = (0.3 * rng.standard_normal((1, 1, 2, 4))).astype("float32")
    projection = favor.random_projection(20000, 4, orthogonal=False, seed=1)
    features = keras.ops.convert_to_numpy(favor.trigonometric_features(x, projection))
    estimate = features[0, 0, 0] @ features[0, 0, 1]
    exact = np.exp(x[0, 0, 0] @ x[0, 0, 1] / 2.0)  # (d^-1/4)^2 = 1/2 for d=4
    assert abs(estimate - exact) < 0.05 * exact


def test_unknown_kernel_is_rejected():
    query, key, value = _inputs()
    with pytest.raises(ValueError, match="kernel='cosine'"):
        favor.favor_attention(query, key, value, np.ones((4, 4), "float32"), kernel="cosine")


def test_causal_path_compiles_and_differentiates():
    query, key, value = _inputs(batch=1, tq=37, tv=37)
    projection = favor.random_projection(8, 4, seed=0)
    kwargs = dict(causal=True, chunk_size=8)

    def attend(q):
        return favor.favor_attention(q, key, value, projection, **kwargs)

    grad = compiled_squared_sum_gradient(attend, query)
    assert np.all(np.isfinite(grad)) and np.any(grad != 0)


def _plain_softmax_favor(query, key, value, projection, key_mask, epsilon=1e-6):
    """FAVOR+ softmax-kernel attention written plainly with keras ops.

    Whole feature maps, no chunks, no custom gradient: the backend's
    autodiff of this is the reference for the chunked kernel's gradient.
    Same stabilisers as the kernel (per-row max for queries, max over valid
    keys for keys, both without gradient) and the same epsilon.
    """
    ops = keras.ops
    m = projection.shape[0]
    w = ops.convert_to_tensor(projection)

    def projected(x):
        x = ops.transpose(x, (0, 2, 1, 3)) * x.shape[-1] ** -0.25
        half = ops.sum(x * x, axis=-1, keepdims=True) / 2
        return ops.einsum("bhtd,md->bhtm", x, w), half

    qp, q_half = projected(query)
    kp, k_half = projected(key)
    valid = ops.convert_to_tensor(key_mask)[:, None, :, None]
    q_shift = ops.stop_gradient(ops.max(qp, axis=-1, keepdims=True))
    k_shift = ops.stop_gradient(ops.max(ops.where(valid, kp, -1e30), axis=(2, 3), keepdims=True))
    qf = (ops.exp(qp - q_half - q_shift) + epsilon) / math.sqrt(m)
    kf = (ops.exp(kp - k_half - k_shift) + epsilon) / math.sqrt(m)
    kf = kf * ops.cast(valid, kf.dtype)
    v = ops.transpose(value, (0, 2, 1, 3))
    numerator = ops.einsum("bhqm,bhkm,bhkd->bhqd", qf, kf, v)
    denominator = ops.einsum("bhqm,bhkm->bhq", qf, kf)
    return ops.transpose(numerator / denominator[..., None], (0, 2, 1, 3))


@pytest.mark.parametrize("tq, tv, chunk", [(23, 31, 5), (17, 17, 64)])
def test_chunked_softmax_path_matches_plain_outputs_and_gradients(tq, tv, chunk):
    # Odd and cross lengths, chunks that do not divide them (or exceed them),
    # padded keys: the chunked, recomputing kernel against autodiff of the
    # plain formula, and its output against the NumPy kernel attention.
    query, key, value = _inputs(tq=tq, tv=tv, scale=1.0)
    projection = favor.random_projection(16, 4, orthogonal=True, seed=3)
    key_mask = np.ones((2, tv), bool)
    key_mask[1, tv - 6 :] = False
    cotangent = (
        np.random.default_rng(4).standard_normal((2, tq, 2, value.shape[-1])).astype("float32")
    )

    def chunked(q, k, v):
        return favor.favor_attention(
            q, k, v, projection, key_mask=key_mask, feature_chunk_size=chunk
        )

    def plain(q, k, v):
        return _plain_softmax_favor(q, k, v, projection, key_mask)

    expected, _ = numpy_kernel_attention(
        numpy_features(query, projection, "softmax"),
        numpy_features(key, projection, "softmax"),
        value,
        np.broadcast_to(key_mask[:, None, :], (2, tq, tv)),
    )
    output = keras.ops.convert_to_numpy(chunked(query, key, value))
    np.testing.assert_allclose(output, expected, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(
        output, keras.ops.convert_to_numpy(plain(query, key, value)), atol=1e-5
    )
    # Compiled on JAX, as a model runs them (op by op: 8.5 CPU s for the two cases; 4.1).
    grads = input_gradients(chunked, [query, key, value], cotangent, jit=True)
    expected_grads = input_gradients(plain, [query, key, value], cotangent, jit=True)
    for name, grad, want in zip("qkv", grads, expected_grads, strict=True):
        assert np.any(want != 0)
        np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")


@pytest.mark.tf_only
def test_chunked_softmax_path_runs_its_chunks_one_at_a_time_in_tf_graphs():
    from tests.graph_loops import while_loop_parallelism

    query, key, value = _inputs(tq=23, tv=31)
    projection = favor.random_projection(16, 4, seed=3)
    found = while_loop_parallelism(
        lambda q, k, v: favor.favor_attention(q, k, v, projection, feature_chunk_size=8),
        [query, key, value],
    )
    # Forward: key stabiliser, key sums, queries; backward: queries, keys.
    assert len(found) >= 5 and set(found) == {1}, found
