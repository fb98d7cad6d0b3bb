"""Attention dropout inside the tiled kernels (#50): the keep bits themselves.

The kernel's values and gradients under dropout are the kernel contract's
(tests/ops/kernel_contract_test.py, a float64 reference fed the mask
`dropout_keep_mask` materialises). Here: that mask is the hash its module
documents, written again in NumPy, on every execution path; its bits look
independent; and the kernel's output averaged over many draws is attention
without dropout.
"""

import keras
import numpy as np
import pytest

from keras_attention.ops import AttentionMask
from keras_attention.ops import dropout_keep_mask
from keras_attention.ops.memory_efficient import memory_efficient_attention
from tests.testing import to_numpy

BACKEND = keras.backend.backend()
U32 = 0xFFFFFFFF


def _fmix(x):
    x = np.asarray(x, np.uint64) & U32
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & U32
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & U32
    return x ^ (x >> np.uint64(16))


def numpy_keep_mask(seed, batch, heads, query_length, key_length, rate):
    """The module docstring's formula, in NumPy (uint64 holding uint32s)."""
    seed = np.uint64(seed % 2**32)
    b = np.arange(batch, dtype=np.uint64)[:, None, None]
    h = np.arange(heads, dtype=np.uint64)[None, :, None]
    i = np.arange(query_length, dtype=np.uint64)[None, None, :]
    rows = _fmix(_fmix(_fmix(_fmix(seed ^ np.uint64(0x9E3779B9)) ^ b) ^ h) ^ i)
    j = np.arange(key_length, dtype=np.uint64)
    columns = _fmix(_fmix(_fmix(seed ^ np.uint64(0x7F4A7C15))) ^ j) | np.uint64(1)
    return ((rows[..., None] * columns) & U32) >= round(rate * 2**32)


def _compiled(fn, jit):
    if BACKEND == "jax":
        import jax

        return jax.jit(fn) if jit else fn
    import tensorflow as tf

    return tf.function(fn, jit_compile=jit)


@pytest.mark.parametrize("jit", [False, True], ids=["eager_or_graph", "xla"])
def test_the_mask_is_the_documented_hash_on_every_path(jit):
    """TF graph and XLA, JAX eager and jit: the same bits, from a seed tensor
    (the layer draws one per call)."""
    shape = (2, 3, 7, 9)
    mask = _compiled(lambda seed: dropout_keep_mask(seed, *shape, 0.3), jit)
    for seed in (0, 1234, 2**31 - 1):
        expected = numpy_keep_mask(seed, *shape, 0.3)
        got = to_numpy(mask(keras.ops.convert_to_tensor(seed, "int32")))
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(to_numpy(dropout_keep_mask(seed, *shape, 0.3)), expected)
    assert to_numpy(dropout_keep_mask(5, *shape, 0.0)).all()


def test_the_bits_look_independent():
    """One (batch, head)'s 512 x 512 bits at rate 0.1 and 0.5 (plus another
    head, batch and seed): the kept fraction is within 5 binomial standard
    deviations of `1 - rate`; the parity of a rectangle's four corners is
    that of four independent bits (an XOR of row and column keys would make
    it always even); the correlations of row pairs and of column pairs have
    the spread of independent rows (1 / sqrt(512)) and no outlier past 6
    of it (130816 pairs: an independent maximum is ~4.8); other heads,
    batches and seeds are uncorrelated with it."""
    n = 512
    for rate in (0.1, 0.5):
        mask = to_numpy(dropout_keep_mask(99, 2, 2, n, n, rate))
        other_seed = to_numpy(dropout_keep_mask(100, 1, 1, n, n, rate))[0, 0]
        bits = mask[0, 0].astype(np.float64)
        sd = np.sqrt(rate * (1 - rate) / bits.size)
        assert abs(bits.mean() - (1 - rate)) < 5 * sd
        rng = np.random.default_rng(0)
        i, j = rng.integers(0, n, (2, 200000, 2))
        corners = sum(bits[i[:, a], j[:, c]] for a in (0, 1) for c in (0, 1))
        odd = 0.5 * (1 - (1 - 2 * rate) ** 4)  # P(odd number of keeps)
        assert abs((corners % 2).mean() - odd) < 5 * np.sqrt(odd * (1 - odd) / len(corners))
        for matrix in (bits, bits.T):
            centred = matrix - matrix.mean(1, keepdims=True)
            norms = np.sqrt((centred**2).sum(1))
            corr = (centred @ centred.T) / np.outer(norms, norms)
            pairs = corr[np.triu_indices(n, 1)]
            assert abs(pairs.std() * np.sqrt(n) - 1) < 0.1
            assert np.abs(pairs).max() < 6 / np.sqrt(n)
        for other in (mask[0, 1], mask[1, 0], other_seed):
            assert abs(np.corrcoef(bits.ravel(), other.ravel())[0, 1]) < 5 / n


def test_the_mean_over_draws_is_attention_without_dropout():
    """256 draws (4 seeds x 64 batch rows holding the same example): each
    output's mean is the no-dropout output to within 5 standard errors.
    One draw's variance is `rate / (1 - rate) * sum_j P_ij^2 v_jd^2` (bits
    independent, each kept with probability `1 - rate`), so the mean of 256
    is off by at most 5 sqrt(var / 256) except with probability 6e-7 per
    output (352 outputs here, and the draws are fixed by the seeds)."""
    rate, copies, seeds = 0.4, 64, (11, 12, 13, 14)
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 11, 4, 8)) for _ in range(3))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    logits = np.where(np.tril(np.ones((11, 11), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd->bqhd", probs, v)[0]
    variance = rate / (1 - rate) * np.einsum("bhqk,bkhd->bqhd", probs**2, v**2)[0]
    mask = AttentionMask(causal=True)
    q, k, v = (np.repeat(x, copies, axis=0).astype("float32") for x in (q, k, v))

    def draw(seed):
        return memory_efficient_attention(
            q, k, v, mask=mask, block_size=4, dropout_rate=rate, dropout_seed=seed
        )

    run = draw
    if BACKEND == "jax":  # one compiled program, the seed a traced scalar (op by op: 4 s)
        import jax

        compiled = jax.jit(draw)
        run = lambda seed: compiled(np.int32(seed))  # noqa: E731
    draws = [to_numpy(run(seed)) for seed in seeds]
    draws = np.concatenate(draws)
    assert draws.shape[0] == copies * len(seeds) and np.all(np.isfinite(draws))
    assert draws.std(0).max() > 0.1  # each draw is its own
    error = np.abs(draws.mean(0) - expected)
    assert np.all(error <= 5 * np.sqrt(variance / draws.shape[0]) + 1e-6), error.max()


def test_dropout_arguments_are_checked():
    q = np.zeros((1, 4, 1, 2), "float32")
    with pytest.raises(ValueError, match=r"memory_efficient_attention: `dropout_rate`.*1\.0"):
        memory_efficient_attention(q, q, q, dropout_rate=1.0, dropout_seed=1)
    with pytest.raises(ValueError, match=r"memory_efficient_attention: `dropout_seed`.*None"):
        memory_efficient_attention(q, q, q, dropout_rate=0.1)
    with pytest.raises(TypeError, match=r"memory_efficient_attention: `dropout_seed`.*0\.5"):
        memory_efficient_attention(q, q, q, dropout_rate=0.1, dropout_seed=0.5)
    with pytest.raises(ValueError, match=r"memory_efficient_attention: `dropout_rows`.*\(3,\)"):
        memory_efficient_attention(
            q, q, q, dropout_rate=0.1, dropout_seed=1, dropout_rows=np.arange(3, dtype="int32")
        )
