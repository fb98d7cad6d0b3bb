"""Score modifiers (#36) on every exact kernel: values and gradients against
float64 NumPy, written from the definitions (forward and backward by hand).

Soft cap `c * tanh(s / c)`, ALiBi `-slope[h] * |i - j|`, learned sinks (one
more logit per head in each row's denominator, with a zero value) and a user
`score_mod` reading every index, under a causal sliding window with grouped
heads, a key mask that leaves a row with nothing to see, and tiles that do
not divide the lengths.
"""

import keras
import numpy as np
import pytest

from keras_attention.ops import attention_mask
from keras_attention.ops import dense_attention
from keras_attention.ops import score_modifier
from keras_attention.ops.memory_efficient import memory_efficient_attention
from tests.testing import to_numpy

BACKEND = keras.backend.backend()
B, T, H, HKV, D = 2, 11, 4, 2, 8
CAP, WINDOW = 2.0, 5
MODIFIERS = ("soft_cap", "alibi", "sinks", "score_mod", "all")


def user_score_mod(score, batch, head, q_idx, k_idx):
    wave = keras.ops.sin(keras.ops.cast(q_idx + 2 * k_idx - head, score.dtype))
    return score * (1.0 + 0.1 * keras.ops.cast(batch, score.dtype)) + 0.3 * wave


# ------------------------------------------------------------ reference
def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, H, D)) * 1.5
    k = rng.normal(size=(B, T, HKV, D)) * 1.5
    v = rng.normal(size=(B, T, HKV, D))
    sinks = rng.normal(size=(H,))
    cotangent = rng.normal(size=(B, T, H, D))
    key_mask = np.ones((B, T), bool)
    key_mask[1, :2] = False  # batch 1, row 0 sees nothing (causal)
    return q, k, v, sinks, cotangent, key_mask


def _allowed(key_mask):
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    rule = (j <= i) & (np.abs(i - j) < WINDOW)
    return rule[None, None] & key_mask[:, None, None, :]


def numpy_attention(q, k, v, sinks, cotangent, key_mask, modifier):
    """`(output, weights, dq, dk, dv, dsinks)` of `sum(output * cotangent)`."""
    groups = H // HKV
    kk, vv = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = 1.0 / np.sqrt(D)
    raw = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    b = np.arange(B)[:, None, None, None]
    h = np.arange(H)[None, :, None, None]
    i = np.arange(T)[None, None, :, None]
    j = np.arange(T)[None, None, None, :]
    logits, slope_of = raw, 1.0
    if modifier in ("alibi", "all"):
        slopes = np.asarray(score_modifier.alibi_slopes(H))
        logits = logits - slopes[h] * np.abs(i - j)
    if modifier in ("score_mod", "all"):
        slope_of = 1.0 + 0.1 * b  # d score_mod / d score
        logits = logits * slope_of + 0.3 * np.sin(i + 2 * j - h)
    cap_grad = 1.0
    if modifier in ("soft_cap", "all"):
        cap_grad = 1.0 - np.tanh(logits / CAP) ** 2
        logits = CAP * np.tanh(logits / CAP)
    allowed = _allowed(key_mask)
    logits = np.where(allowed, logits, -np.inf)
    with_sinks = modifier in ("sinks", "all")
    peak = logits.max(-1, keepdims=True)
    if with_sinks:
        peak = np.maximum(peak, sinks[None, :, None, None])
    peak = np.where(np.isfinite(peak), peak, 0.0)
    exp = np.exp(logits - peak)
    total = exp.sum(-1, keepdims=True)
    sink_exp = np.exp(sinks[None, :, None, None] - peak) if with_sinks else 0.0
    total = total + sink_exp
    probs = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    out = np.einsum("bhqk,bkhd->bqhd", probs, vv)
    # Backward of sum(out * cotangent), by hand.
    d_out = cotangent
    d_probs = np.einsum("bqhd,bkhd->bhqk", d_out, vv)
    delta = np.einsum("bqhd,bqhd->bhq", d_out, out)[..., None]
    d_logits = probs * (d_probs - delta) * cap_grad * slope_of
    dq = np.einsum("bhqk,bkhd->bqhd", d_logits, kk) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", d_logits, q) * scale
    dv = np.einsum("bhqk,bqhd->bkhd", probs, d_out)
    dk = dk.reshape(B, T, HKV, groups, D).sum(3)
    dv = dv.reshape(B, T, HKV, groups, D).sum(3)
    d_sinks = np.zeros(H)
    if with_sinks:
        p_sink = np.where(total > 0, sink_exp / np.where(total > 0, total, 1.0), 0.0)
        d_sinks = -(p_sink * delta).sum(axis=(0, 2, 3))
    return out, probs, dq, dk, dv, d_sinks


# --------------------------------------------------------------- kernels
def _modifier(modifier, sinks):
    return score_modifier.ScoreModifier(
        soft_cap=CAP if modifier in ("soft_cap", "all") else None,
        alibi_slopes=score_modifier.alibi_slopes(H) if modifier in ("alibi", "all") else None,
        sink_logits=sinks if modifier in ("sinks", "all") else None,
        score_mod=user_score_mod if modifier in ("score_mod", "all") else None,
    )


def _kernel(name, key_mask):
    mask = attention_mask.AttentionMask(key_mask=key_mask, causal=True, sliding_window=WINDOW)
    scale = 1.0 / np.sqrt(D)

    def run(q, k, v, scores):
        if name == "dense":
            return dense_attention.dense_attention(q, k, v, mask, scale=scale, scores=scores)[0]
        if name == "shifted":
            return dense_attention.shifted_attention(q, k, v, mask, scale=scale, scores=scores)
        return memory_efficient_attention(
            q, k, v, scale=scale, mask=mask, scores=scores, block_size=4, key_block_size=3
        )

    return run


def _gradients(run, modifier, q, k, v, sinks, cotangent, compiled=False):
    """Output and gradients w.r.t. q, k, v and the sinks, float32."""
    arrays = [np.asarray(x, "float32") for x in (q, k, v, sinks)]
    cot = np.asarray(cotangent, "float32")
    if BACKEND == "jax":
        import jax

        def loss(q, k, v, s):
            out = run(q, k, v, _modifier(modifier, s))
            return (out * cot).sum(), out

        grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
        if compiled:
            grad = jax.jit(grad)
        (_, out), grads = grad(*arrays)
        return [to_numpy(x) for x in (out, *grads)]
    import tensorflow as tf

    def step(q, k, v, s):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, s])
            out = run(q, k, v, _modifier(modifier, s))
            loss = tf.reduce_sum(out * cot)
        zero = tf.UnconnectedGradients.ZERO  # the sinks, when unused
        return (out, *tape.gradient(loss, [q, k, v, s], unconnected_gradients=zero))

    if compiled:
        step = tf.function(step, jit_compile=True)
    return [to_numpy(x) for x in step(*[tf.constant(a) for a in arrays])]


@pytest.mark.parametrize("modifier", MODIFIERS)
@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_values_and_gradients_match_float64_numpy(kernel, modifier):
    q, k, v, sinks, cotangent, key_mask = _inputs()
    expected = numpy_attention(q, k, v, sinks, cotangent, key_mask, modifier)
    out, dq, dk, dv, d_sinks = _gradients(
        _kernel(kernel, key_mask), modifier, q, k, v, sinks, cotangent
    )
    np.testing.assert_allclose(out, expected[0], atol=2e-5)
    for got, want in zip((dq, dk, dv, d_sinks), expected[2:], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    # The row with nothing to see: zero result and zero gradient.
    assert not np.any(out[1, 0]) and not np.any(dq[1, 0])


def test_dense_weights_are_the_keys_share_and_rows_with_sinks_sum_below_one():
    q, k, v, sinks, cotangent, key_mask = _inputs()
    expected = numpy_attention(q, k, v, sinks, cotangent, key_mask, "all")[1]
    mask = attention_mask.AttentionMask(key_mask=key_mask, causal=True, sliding_window=WINDOW)
    scores = _modifier("all", np.asarray(sinks, "float32"))
    cast = [np.asarray(x, "float32") for x in (q, k, v)]
    _, weights = dense_attention.dense_attention(*cast, mask, scale=D**-0.5, scores=scores)
    np.testing.assert_allclose(to_numpy(weights), expected, atol=2e-6)
    sums = to_numpy(weights).sum(-1)
    assert np.all(sums < 1.0) and np.all(sums[1, :, 0] == 0.0)
    # Selected heads and rows (scores on demand) are the same numbers.
    some = dense_attention.selected_weights(
        cast[0], cast[1], mask, scale=D**-0.5, num_heads=H, heads=[3, 1], rows=(4, 9), scores=scores
    )
    np.testing.assert_allclose(to_numpy(some), expected[:, [3, 1], 4:9], atol=2e-6)


def test_compiled_blockwise_gradients_match_float64_numpy():
    """XLA (TF) / `jax.jit`: the `score_mod`'s autodiff inside the loops."""
    q, k, v, sinks, cotangent, key_mask = _inputs(1)
    expected = numpy_attention(q, k, v, sinks, cotangent, key_mask, "all")
    got = _gradients(
        _kernel("blockwise", key_mask), "all", q, k, v, sinks, cotangent, compiled=True
    )
    for g, want in zip(got, expected[:1] + expected[2:], strict=True):
        np.testing.assert_allclose(g, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_half_precision_is_computed_in_float32(kernel, dtype):
    q, k, v, sinks, cotangent, key_mask = _inputs()
    expected = numpy_attention(q, k, v, sinks, cotangent, key_mask, "all")[0]
    cast = [keras.ops.convert_to_tensor(np.asarray(x, dtype)) for x in (q, k, v)]
    out = to_numpy(_kernel(kernel, key_mask)(*cast, _modifier("all", sinks.astype("float32"))))
    assert np.all(np.isfinite(out)) and not np.any(out[1, 0])
    np.testing.assert_allclose(out, expected, atol=0.05 if dtype == "bfloat16" else 5e-3)


def test_alibi_slopes_are_the_papers():
    # Powers of two: 2^(-8 i / n); otherwise the closest power's slopes, then
    # every other slope of twice as many heads (Press et al.'s code).
    np.testing.assert_allclose(score_modifier.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_allclose(
        score_modifier.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(soft_cap=0.0), ValueError, "soft_cap=0.0"),
        (dict(soft_cap="50"), TypeError, "soft_cap='50'"),
        (dict(soft_cap=True), TypeError, "soft_cap=True"),
        (dict(score_mod="tanh"), TypeError, "score_mod='tanh'"),
    ],
)
def test_bad_modifiers_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=f"^ScoreModifier: .*{message}"):
        score_modifier.ScoreModifier(**kwargs)
