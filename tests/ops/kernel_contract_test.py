"""One contract, every exact multi-head kernel, against float64 NumPy (#36).

The kernels behind `MultiHeadAttention` take `(query, key, value,
AttentionMask, scale, scores)`: the materialised `dense_attention` (weights),
`shifted_attention` (normalise last, TF XLA's), `composite_attention`
(`keras.ops.dot_product_attention`, no score modifier) and the blockwise
`memory_efficient_attention` (tiles of 4 queries x 3 keys here, so rows and
keys are padded and several tiles are skipped). Each case is a mask
(every spelling and rule of `AttentionMask`) and a score modifier
(`ScoreModifier`); values and the gradients of `sum(output * cotangent)`
with respect to q, k, v and the sink logits are compared with a NumPy
reference written from the definitions, forward and backward by hand. A
query row with nothing to see gives zeros and zero gradients; half
precision is computed in float32. Ring attention runs the same reference
on 4 devices (tests/distribution/ring_worker.py). Dropout inside the
blockwise kernel (#50) is checked against the same reference fed the
kernel's own keep mask (`ops.dropout_keep_mask`).
"""

import sys

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import attention_mask
from keras_attention.ops import block_sparse
from keras_attention.ops import dense_attention
from keras_attention.ops import dropout_keep_mask
from keras_attention.ops import mods
from keras_attention.ops import score_modifier
from keras_attention.ops.memory_efficient import memory_efficient_attention
from tests.testing import to_numpy

BACKEND = keras.backend.backend()
B, H, D, DV = 2, 4, 8, 8  # equal head sizes: JAX's composite kernel needs them
CAP, WINDOW = 2.0, 5
KERNELS = ("dense", "shifted", "composite", "blockwise")


def user_score_mod(score, batch, head, q_idx, k_idx):
    wave = keras.ops.sin(keras.ops.cast(q_idx + 2 * k_idx - head, score.dtype))
    return score * (1.0 + 0.1 * keras.ops.cast(batch, score.dtype)) + 0.3 * wave


def table_score_mod(score, batch, head, q_idx, k_idx, table):
    """A `score_mod` with a weight: `table[min(|i - j|, 3), h]` added (T5-like)."""
    bucket = keras.ops.minimum(keras.ops.abs(q_idx - k_idx), 3)
    flat = keras.ops.reshape(table, (-1,))
    return score + keras.ops.take(flat, bucket * table.shape[1] + head)


def slopes_score_mod(score, batch, head, q_idx, k_idx, table):
    """Learned ALiBi: `-table[0, h] * |i - j|`, the slopes a trainable weight."""
    slope = keras.ops.take(table[0], head)
    return score - slope * keras.ops.cast(keras.ops.abs(q_idx - k_idx), score.dtype)


def user_mask_mod(batch, head, q_idx, k_idx):
    return keras.ops.not_equal((q_idx + 2 * k_idx + head + batch) % 4, 0)


def document_mask_mod(batch, head, q_idx, k_idx):
    """Documents of 6 positions as a function (whole tiles fall outside)."""
    return keras.ops.equal(q_idx // 6, k_idx // 6)


# The guide's per-token lookup: document ids `(B, T)` read inside a
# `mask_mod` with `keras.ops` (works on both backends; `doc[b, q_idx]` is
# JAX-only indexing). The tiled kernel pads its last tiles: the positions it
# passes stay in range (TensorFlow's gather refuses an index past the end).
LOOKUP_IDS = np.array([[0] * 3 + [1] * 5 + [2] * 3, [0] * 6 + [1] * 5], "int32")


def lookup_mask_mod(batch, head, q_idx, k_idx):
    flat = keras.ops.reshape(keras.ops.convert_to_tensor(LOOKUP_IDS), (-1,))
    length = LOOKUP_IDS.shape[1]
    same = keras.ops.take(flat, batch * length + q_idx) == keras.ops.take(
        flat, batch * length + k_idx
    )
    return same


# ---------------------------------------------------------------- cases
# name -> (lengths (Tq, Tk), key/value heads, what the mask holds)
MASKS = {
    "plain": ((11, 11), 4, ()),
    "key padding": ((11, 11), 4, ("key_mask",)),
    "query mask": ((11, 11), 4, ("query_mask",)),
    "pair mask": ((11, 11), 4, ("pair_mask",)),
    "per-head pair mask": ((11, 11), 2, ("head_pair_mask",)),
    "causal, cross lengths": ((7, 13), 4, ("causal",)),
    "causal, padding, grouped": ((11, 11), 2, ("causal", "key_mask")),
    "decoding offset": ((3, 13), 2, ("causal", "offset")),
    "causal window, row without keys": ((11, 11), 2, ("causal", "window", "empty_row")),
    "packed documents": ((13, 13), 2, ("causal", "segments")),
    "prefix per example": ((11, 11), 4, ("causal", "prefix")),
    "sink tokens beside a window": ((13, 13), 2, ("causal", "window", "sink_tokens")),
    "mask_mod": ((11, 11), 2, ("causal", "mask_mod")),
    "documents by mask_mod": ((11, 11), 2, ("documents_mask_mod",)),
    "documents by lookup": ((11, 11), 2, ("causal", "lookup_mask_mod")),
    "composed mask_mods": ((11, 11), 2, ("composed_mask_mods",)),
    # A decoding cache whose 13 slots wrap as a ring buffer: queries at 18-20,
    # slot s holding the key at RING_POSITIONS[s] (`key_positions`).
    "ring-buffer slots": ((3, 13), 2, ("causal", "window", "ring_slots")),
}
RING_POSITIONS = np.array([16, 17, 18, 19, 20, 8, 9, 10, 11, 12, 13, 14, 15])
MODIFIERS = ("soft_cap", "alibi", "sinks", "score_mod")
TABLE_SHAPE = (4, H)  # the weighted `score_mod`'s table: (buckets, heads)


def _case(name, seed=0):
    """Inputs, the `AttentionMask` and the NumPy `(B, H, Tq, Tk)` mask."""
    (q_len, k_len), kv_heads, parts = MASKS[name]
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, q_len, H, D)) * 1.5
    k = rng.normal(size=(B, k_len, kv_heads, D)) * 1.5
    v = rng.normal(size=(B, k_len, kv_heads, DV))
    cotangent = rng.normal(size=(B, q_len, H, DV))
    sinks = rng.normal(size=(H,))
    table = rng.normal(size=TABLE_SHAPE)
    offset = 8 if "offset" in parts else (18 if "ring_slots" in parts else 0)
    rows = (np.arange(q_len) + offset)[:, None]
    cols = np.arange(k_len)[None, :]
    key_positions = np.arange(k_len)
    if "ring_slots" in parts:
        key_positions = cols = RING_POSITIONS[None, :]
    batch = np.arange(B)[:, None, None, None]
    head = np.arange(H)[None, :, None, None]
    allowed = np.ones((B, H, q_len, k_len), bool)
    fields = dict(query_offset=offset)
    if "key_mask" in parts:
        key_mask = np.arange(k_len)[None] < np.array([[k_len], [5]])
        fields["key_mask"] = key_mask
        allowed &= key_mask[:, None, None, :]
    if "empty_row" in parts:  # batch 1, row 0 sees nothing (causal)
        key_mask = np.ones((B, k_len), bool)
        key_mask[1, :1] = False
        fields["key_mask"] = key_mask
        allowed &= key_mask[:, None, None, :]
    if "query_mask" in parts:
        fields["query_mask"] = rng.random((B, q_len)) > 0.3
        allowed &= fields["query_mask"][:, None, :, None]
    if "pair_mask" in parts:
        pair = rng.random((B, q_len, k_len)) > 0.5
        fields["pair_mask"] = pair
        allowed &= pair[:, None]
    if "head_pair_mask" in parts:
        pair = rng.random((B, H, q_len, k_len)) > 0.5
        fields["pair_mask"] = pair
        allowed &= pair
    causal = (cols <= rows)[None, None]
    if "prefix" in parts:
        fields["prefix_length"] = np.array([3, 7], "int32")
        causal = causal | (cols[None, None] < fields["prefix_length"][:, None, None, None])
    if "causal" in parts:
        fields["causal"] = True
        allowed &= causal
    if "window" in parts:
        fields["sliding_window"] = WINDOW
        band = np.abs(rows - cols) < WINDOW
        if "sink_tokens" in parts:
            fields["sink_tokens"] = 3
            band |= cols < 3
        allowed &= band[None, None]
    if "segments" in parts:
        ids = np.array([[0] * 4 + [1] * 6 + [2] * 3, [0] * 9 + [1] * 4], "int32")
        fields.update(query_segment_ids=ids, key_segment_ids=ids)
        allowed &= ids[:, None, :, None] == ids[:, None, None, :]
    if "mask_mod" in parts:
        fields["mask_mod"] = user_mask_mod
        allowed &= (rows[None, None] + 2 * cols[None, None] + head + batch) % 4 != 0
    if "lookup_mask_mod" in parts:
        fields["mask_mod"] = lookup_mask_mod
        allowed &= LOOKUP_IDS[:, None, :, None] == LOOKUP_IDS[:, None, None, :]
    if "composed_mask_mods" in parts:  # FlexAttention's and_masks / or_masks
        near = lambda b, h, q, k: keras.ops.abs(q - k) < 3  # noqa: E731
        first = lambda b, h, q, k: k == 0  # noqa: E731
        fields["mask_mod"] = mods.or_masks(mods.and_masks(user_mask_mod, near), first)
        user = (rows[None, None] + 2 * cols[None, None] + head + batch) % 4 != 0
        allowed &= (user & (np.abs(rows - cols) < 3)) | (cols == 0)
    if "documents_mask_mod" in parts:
        fields["mask_mod"] = document_mask_mod
        allowed &= (rows // 6 == cols // 6)[None, None]
    if "ring_slots" in parts:
        fields["key_positions"] = RING_POSITIONS[None].astype("int32")
    arrays = dict(q=q, k=k, v=v, cotangent=cotangent, sinks=sinks, table=table)
    arrays["key_positions"] = np.ravel(key_positions)
    return arrays, attention_mask.AttentionMask(**fields), allowed, offset


def _scores(modifiers, sinks, table=None):
    score_mod, weights = None, ()
    if "score_mod" in modifiers:
        score_mod = user_score_mod
    elif "table" in modifiers:
        score_mod, weights = table_score_mod, (table,)
    elif "learned slopes" in modifiers:
        score_mod, weights = slopes_score_mod, (table,)
    return score_modifier.ScoreModifier(
        soft_cap=CAP if "soft_cap" in modifiers else None,
        alibi_slopes=score_modifier.alibi_slopes(H) if "alibi" in modifiers else None,
        sink_logits=sinks if "sinks" in modifiers else None,
        score_mod=score_mod,
        score_mod_weights=weights,
    )


# ------------------------------------------------------------ reference
def numpy_attention(arrays, allowed, modifiers, offset, dropped=None):
    """`(output, weights, dq, dk, dv, dsinks, dtable)` in float64, by hand.

    `dropped`: dropout's `keep / (1 - rate)` `(B, H, Tq, Tk)` (or None),
    applied to the softmax's weights (normalised over every key) in the
    output; the weights returned are before it."""
    q, k, v, cotangent, sinks, table = (
        arrays[n].astype(np.float64) for n in ("q", "k", "v", "cotangent", "sinks", "table")
    )
    groups = H // k.shape[2]
    kk, vv = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = 1.0 / np.sqrt(D)
    logits = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    b = np.arange(B)[:, None, None, None]
    h = np.arange(H)[None, :, None, None]
    i = np.arange(q.shape[1])[None, None, :, None] + offset
    j = arrays.get("key_positions", np.arange(k.shape[1]))[None, None, None, :]
    chain = 1.0  # d modified logit / d logit
    if "alibi" in modifiers:
        logits = logits - np.asarray(score_modifier.alibi_slopes(H))[h] * np.abs(i - j)
    if "score_mod" in modifiers:
        chain = 1.0 + 0.1 * b
        logits = logits * chain + 0.3 * np.sin(i + 2 * j - h)
    bucket = np.minimum(np.abs(i - j), 3) + 0 * b  # (B, 1, Tq, Tk)
    if "table" in modifiers:
        logits = logits + table[bucket, h]
    if "learned slopes" in modifiers:
        logits = logits - table[0][h] * np.abs(i - j)
    cap_chain = 1.0
    if "soft_cap" in modifiers:
        cap_chain = 1.0 - np.tanh(logits / CAP) ** 2
        logits = CAP * np.tanh(logits / CAP)
    logits = np.where(allowed, logits, -np.inf)
    peak = logits.max(-1, keepdims=True)
    with_sinks = "sinks" in modifiers
    if with_sinks:
        peak = np.maximum(peak, sinks[None, :, None, None])
    peak = np.where(np.isfinite(peak), peak, 0.0)
    exp = np.exp(logits - peak)
    sink_exp = np.exp(sinks[None, :, None, None] - peak) if with_sinks else 0.0
    total = exp.sum(-1, keepdims=True) + sink_exp
    probs = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    dropped = 1.0 if dropped is None else dropped
    out = np.einsum("bhqk,bkhd->bqhd", probs * dropped, vv)
    # d loss / d weights, through the dropout: D dP.
    d_probs = np.einsum("bqhd,bkhd->bhqk", cotangent, vv) * dropped
    delta = (probs * d_probs).sum(-1, keepdims=True)
    d_before_cap = probs * (d_probs - delta) * cap_chain
    d_logits = d_before_cap * chain
    dq = np.einsum("bhqk,bkhd->bqhd", d_logits, kk) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", d_logits, q) * scale
    dv = np.einsum("bhqk,bqhd->bkhd", probs * dropped, cotangent)
    dk = dk.reshape(k.shape[:3] + (groups, D)).sum(3)
    dv = dv.reshape(v.shape[:3] + (groups, DV)).sum(3)
    d_sinks = np.zeros(H)
    if with_sinks:
        p_sink = np.where(total > 0, sink_exp / np.where(total > 0, total, 1.0), 0.0)
        d_sinks = -(p_sink * delta).sum(axis=(0, 2, 3))
    d_table = np.zeros(TABLE_SHAPE)
    if "table" in modifiers:
        heads = np.broadcast_to(h, d_before_cap.shape)
        np.add.at(d_table, (np.broadcast_to(bucket, d_before_cap.shape), heads), d_before_cap)
    if "learned slopes" in modifiers:
        d_table[0] = -(d_before_cap * np.abs(i - j)).sum(axis=(0, 2, 3))
    return out, probs, dq, dk, dv, d_sinks, d_table


# -------------------------------------------------------------- running
def _kernel(name, mask, dropout=None, blocks=(4, 3)):
    """`run(q, k, v, scores)` of kernel `name`; `dropout` is `(rate, seed)`
    for the blockwise kernel (tiles of `blocks` queries x keys)."""
    scale = 1.0 / np.sqrt(D)
    rate, seed = dropout or (0.0, None)

    def run(q, k, v, scores):
        if name == "dense":
            return dense_attention.dense_attention(q, k, v, mask, scale=scale, modifier=scores)[0]
        if name == "shifted":
            return dense_attention.shifted_attention(q, k, v, mask, scale=scale, modifier=scores)
        if name == "composite":
            assert scores.is_empty  # Keras' kernel cannot change the logits
            return dense_attention.composite_attention(
                q, k, v, mask, scale=scale, num_heads=H, flash_attention=False
            )
        return memory_efficient_attention(
            q,
            k,
            v,
            scale=scale,
            mask=mask,
            modifier=scores,
            block_size=blocks[0],
            key_block_size=blocks[1],
            dropout_rate=rate,
            dropout_seed=seed,
        )

    return run


def _compiled(fn):
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


def output_and_gradients(run, arrays, modifiers, compiled=None, dtype="float32", runs=None):
    """Output and the gradients w.r.t. q, k, v, the sink logits and the
    weighted `score_mod`'s table (with `runs`, a list of that many results
    of one traced and compiled function run again on the same inputs).

    `compiled=None` takes the path a model's `fit` takes on the backend:
    `jax.jit` on JAX (also half the time of op-by-op dispatch, which compiles
    every primitive once per shape: 29 s -> 15 s for the mask matrix), eager
    on TensorFlow; the `_compiled` test below runs TensorFlow's XLA."""
    if compiled is None:
        compiled = BACKEND == "jax"
    inputs = [np.asarray(arrays[n], dtype) for n in ("q", "k", "v")]
    extra = [np.asarray(arrays[n], "float32") for n in ("sinks", "table")]
    cotangent = np.asarray(arrays["cotangent"], "float32")
    if BACKEND == "jax":
        import jax

        def loss(q, k, v, s, t):
            out = run(q, k, v, _scores(modifiers, s, t))
            return (out.astype("float32") * cotangent).sum(), out

        grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)
        grad = jax.jit(grad) if compiled else grad

        def once():
            (_, out), grads = grad(*inputs, *extra)
            return [to_numpy(x) for x in (out, *grads)]

        return once() if runs is None else [once() for _ in range(runs)]
    import tensorflow as tf

    def step(q, k, v, s, t):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v, s, t])
            out = run(q, k, v, _scores(modifiers, s, t))
            loss = tf.reduce_sum(tf.cast(out, "float32") * cotangent)
        zero = tf.UnconnectedGradients.ZERO  # the sinks and table, when unused
        return (out, *tape.gradient(loss, [q, k, v, s, t], unconnected_gradients=zero))

    step = _compiled(step) if compiled else step
    tensors = [tf.constant(a) for a in inputs + extra]
    if runs is not None:
        return [[to_numpy(x) for x in step(*tensors)] for _ in range(runs)]
    return [to_numpy(x) for x in step(*tensors)]


def _check(kernel, mask_name, modifiers, compiled=None, dropout=None, blocks=(4, 3)):
    arrays, mask, allowed, offset = _case(mask_name)
    dropped = None
    if dropout is not None:  # the kernel's own keep mask, materialised
        rate, seed = dropout
        keep = to_numpy(dropout_keep_mask(seed, *allowed.shape, rate))
        dropped = keep / (1.0 - rate)
    expected = numpy_attention(arrays, allowed, modifiers, offset, dropped)
    got = output_and_gradients(_kernel(kernel, mask, dropout, blocks), arrays, modifiers, compiled)
    names = ("output", "dq", "dk", "dv", "dsinks", "dtable")
    for name, value, want in zip(names, got, expected[:1] + expected[2:], strict=True):
        np.testing.assert_allclose(value, want, atol=2e-5, rtol=1e-4, err_msg=name)
    # A row with nothing to see: zero output and zero query gradient.
    empty = ~allowed.any(-1)  # (B, H, Tq)
    assert empty.any() or "empty_row" not in MASKS[mask_name][2]
    empty = np.transpose(empty, (0, 2, 1))
    assert not np.any(got[0][empty]) and not np.any(got[1][empty])


@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_mask_on_every_kernel(kernel, mask_name):
    _check(kernel, mask_name, ())


@pytest.mark.parametrize("modifier", MODIFIERS + ("table", "all"))
@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_every_score_modifier_on_every_kernel(kernel, modifier):
    modifiers = MODIFIERS if modifier == "all" else (modifier,)
    _check(kernel, "causal window, row without keys", modifiers)


@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_learned_weights_get_exact_gradients_bit_identical_run_to_run(kernel):
    """A `score_mod` reading trainable weights (learned ALiBi slopes): their
    gradient equals float64 NumPy's, and two runs give the same bits (the
    blockwise backward sums its tiles' contributions in a fixed order, no
    atomics), compiled as `fit` compiles it: one compiled step run twice, as
    `fit` runs its train function (on JAX a second `jax.jit` traced and
    compiled the same program again)."""
    modifiers = ("learned slopes", "soft_cap")
    arrays, mask, allowed, offset = _case("causal, padding, grouped")
    expected = numpy_attention(arrays, allowed, modifiers, offset)
    runs = output_and_gradients(_kernel(kernel, mask), arrays, modifiers, compiled=True, runs=2)
    for value, want in zip(runs[0], expected[:1] + expected[2:], strict=True):
        np.testing.assert_allclose(value, want, atol=2e-5, rtol=1e-4)
    assert np.all(runs[0][5][0]) and not np.any(runs[0][5][1:])  # the slopes' row
    for first, second in zip(*runs, strict=True):
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize(
    "mask_name", ["decoding offset", "key padding", "prefix per example", "ring-buffer slots"]
)
@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_alibi_at_an_offset_without_the_causal_rule_and_under_a_prefix(kernel, mask_name):
    """The blockwise kernel folds causal ALiBi into its matmuls (tile-relative
    positions, the cache offset included) and adds it per tile otherwise (and
    where the keys sit at given positions: a ring buffer's slots)."""
    _check(kernel, mask_name, ("alibi", "soft_cap"))


@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_rules_and_modifiers_together_compiled(kernel):
    """XLA (TF) / `jax.jit`: the blockwise kernel's tile skipping and the
    `score_mod`'s autodiff inside the loops, under packed documents."""
    _check(kernel, "packed documents", MODIFIERS, compiled=True)
    _check(kernel, "sink tokens beside a window", ("soft_cap", "sinks", "table"), compiled=True)
    _check(kernel, "documents by mask_mod", ("alibi",), compiled=True)  # tiles skipped by cond


@pytest.mark.parametrize("cap", [None, 50.0, 2.0])
@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_large_logits_keep_their_precision(kernel, cap, monkeypatch):
    """Logits up to ~100 (an unshifted exp overflows; the blockwise kernel's
    fixed-shift path must fall back to the running maximum). Under Gemma 2's
    soft cap of 50 (or a small one) the blockwise kernel keeps the fixed
    shift, unshifted: capped terms lie in [exp(-50), exp(50)]."""
    arrays, mask, allowed, offset = _case("causal, padding, grouped")
    arrays["q"] = arrays["q"] * 30
    arrays["q"][:, :4] /= 30  # one query block bounded, the others not
    modifiers = () if cap is None else ("soft_cap",)
    monkeypatch.setattr(sys.modules[__name__], "CAP", cap)
    expected = numpy_attention(arrays, allowed, modifiers, offset)
    got = output_and_gradients(_kernel(kernel, mask), arrays, modifiers)
    for value, want in zip(got[:4], expected[:1] + expected[2:5], strict=True):
        np.testing.assert_allclose(value, want, atol=5e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_half_precision_is_computed_in_float32(kernel, dtype):
    arrays, mask, allowed, offset = _case("causal window, row without keys")
    arrays["q"] = arrays["q"] * 10  # logits past float16's exp range
    rounded = dict(arrays)
    for name in ("q", "k", "v"):
        rounded[name] = to_numpy(ops.cast(ops.cast(arrays[name], dtype), "float32"))
    modifiers = () if kernel == "composite" else ("soft_cap", "sinks")
    expected = numpy_attention(rounded, allowed, modifiers, offset)[0]
    out = _kernel(kernel, mask)(
        *(ops.cast(arrays[n], dtype) for n in ("q", "k", "v")),
        _scores(modifiers, arrays["sinks"].astype("float32")),
    )
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = to_numpy(out)
    assert np.all(np.isfinite(out)) and not np.any(out[1, 0])
    np.testing.assert_allclose(out, expected, atol=5e-2, rtol=2e-2)


def test_dense_weights_are_the_keys_share_and_rows_with_sinks_sum_below_one():
    arrays, mask, allowed, offset = _case("causal window, row without keys")
    expected = numpy_attention(arrays, allowed, MODIFIERS, offset)[1]
    scores = _scores(MODIFIERS, arrays["sinks"].astype("float32"))
    q, k, v = (np.asarray(arrays[n], "float32") for n in ("q", "k", "v"))
    _, weights = dense_attention.dense_attention(q, k, v, mask, scale=D**-0.5, modifier=scores)
    np.testing.assert_allclose(to_numpy(weights), expected, atol=2e-6)
    sums = to_numpy(weights).sum(-1)
    assert np.all(sums < 1.0) and np.all(sums[1, :, 0] == 0.0)
    # Selected heads and rows (scores on demand) are the same numbers.
    some = dense_attention.selected_weights(
        q, k, mask, scale=D**-0.5, num_heads=H, heads=[3, 1], rows=(4, 9), modifier=scores
    )
    np.testing.assert_allclose(to_numpy(some), expected[:, [3, 1], 4:9], atol=2e-6)


@pytest.mark.tf_only
def test_the_blockwise_kernel_skips_the_tiles_a_mask_mod_rules_out(monkeypatch):
    """A `mask_mod` is evaluated once per query block over every key
    (booleans); the tiles it leaves empty are not computed. Counted from the
    online softmax's tile updates (TF eager runs the loops in Python)."""
    from keras_attention.ops import online_softmax

    computed = []
    for name in ("update", "update_fixed_shift"):
        original = getattr(online_softmax, name)

        def counting(state, logits, weighted_sum, original=original):
            computed.append(tuple(logits.shape))
            return original(state, logits, weighted_sum)

        monkeypatch.setattr(online_softmax, name, counting)
    arrays, mask, allowed, _ = _case("documents by mask_mod")
    q, k, v = (arrays[n].astype("float32") for n in ("q", "k", "v"))
    out = memory_efficient_attention(q, k, v, mask=mask, block_size=4, key_block_size=3)
    expected = numpy_attention(arrays, allowed, (), 0)[0]
    np.testing.assert_allclose(to_numpy(out), expected, atol=2e-5, rtol=1e-4)
    # Query blocks of rows 0-3, 4-7, 8-10 against key blocks 0-2, 3-5, 6-8,
    # 9-10 under documents 0-5 and 6-11: 2 + 4 + 2 of the 12 tiles hold a pair.
    assert len(computed) == 8, computed


def exact_tile_kinds(allowed, q_block, k_block):
    """NumPy: `(nq, nk)` 0 skipped / 1 partial / 2 full of a `(B, H, Tq, Tk)`
    mask: full when every real row sees every column of the tile in every
    example and head (padded key columns are hidden, padded rows ignored)."""
    _, _, q_len, k_len = allowed.shape
    nq, nk = -(-q_len // q_block), -(-k_len // k_block)
    grid = np.zeros(allowed.shape[:2] + (nq * q_block, nk * k_block), bool)
    grid[:, :, :q_len, :k_len] = allowed
    tiles = grid.reshape(allowed.shape[:2] + (nq, q_block, nk, k_block))
    real = np.arange(nq * q_block).reshape(nq, q_block) < q_len
    kinds = np.zeros((nq, nk), int)
    for i in range(nq):
        rows = tiles[:, :, i][:, :, real[i]]  # (B, H, real rows, nk, bk)
        kinds[i] = np.where(rows.all(axis=(0, 1, 2, 4)), 2, rows.any(axis=(0, 1, 2, 4)))
    return kinds


@pytest.mark.parametrize("name", sorted(MASKS))
def test_the_tile_plan_is_each_tiles_exact_kind(name):
    """`ops.tile_plan` on every mask of the contract (tiles of 4 x 3, so
    rows and keys are padded): full, partial and skipped tiles are exactly
    those of the NumPy mask (sound: a full tile evaluates no mask, a skipped
    one is never computed; tight here: no tile the mask rules out is visited)."""
    from keras_attention import ops as ka_ops

    arrays, mask, allowed, _ = _case(name)
    q_len, k_len = allowed.shape[2:]
    plan = ka_ops.tile_plan(
        mask, q_len, k_len, block_size=4, key_block_size=3, batch_size=B, num_heads=H
    )
    np.testing.assert_array_equal(to_numpy(plan.tiles()), exact_tile_kinds(allowed, 4, 3))


@pytest.mark.tf_only
@pytest.mark.parametrize("blocks", [None, (5, 2)], ids=["its own plan", "a plan passed in"])
def test_the_blockwise_kernel_visits_the_plan_and_masks_partial_tiles_only(blocks, monkeypatch):
    """The kernel computes the plan's tiles, each once, and evaluates the
    mask on the partial ones only (TF eager runs the loops in Python, so
    every tile is counted). A plan passed in brings its own block sizes."""
    from keras_attention import ops as ka_ops
    from keras_attention.ops import online_softmax

    masked = []
    original = online_softmax.mask_logits

    def counting(logits, allowed):
        masked.append(allowed is not None)
        return original(logits, allowed)

    monkeypatch.setattr(online_softmax, "mask_logits", counting)
    arrays, mask, allowed, _ = _case("packed documents")
    q, k, v = (arrays[n].astype("float32") for n in ("q", "k", "v"))
    plan = None
    q_block, k_block = blocks or (4, 3)
    if blocks is not None:
        plan = ka_ops.tile_plan(mask, 13, 13, block_size=q_block, key_block_size=k_block)
    out = memory_efficient_attention(
        q, k, v, mask=mask, block_size=4, key_block_size=3, tile_plan=plan
    )
    np.testing.assert_allclose(
        to_numpy(out), numpy_attention(arrays, allowed, (), 0)[0], atol=2e-5, rtol=1e-4
    )
    kinds = exact_tile_kinds(allowed, q_block, k_block)
    assert (masked.count(False), masked.count(True)) == (np.sum(kinds == 2), np.sum(kinds == 1))


def test_a_tile_plan_for_other_lengths_or_not_a_plan_is_refused():
    from keras_attention import ops as ka_ops

    q = np.ones((1, 6, 1, 2), "float32")
    plan = ka_ops.tile_plan(None, 8, block_size=4)
    with pytest.raises(ValueError, match=r"memory_efficient_attention.*built for .*\(8, 8, 4, 4\)"):
        memory_efficient_attention(q, q, q, tile_plan=plan)
    with pytest.raises(TypeError, match="memory_efficient_attention.*`tile_plan` must be"):
        memory_efficient_attention(q, q, q, tile_plan="causal")


# ------------------------------------------------------ the mods' contract
MOD_KERNELS = ("dense", "shifted", "composite", "blockwise")


@pytest.mark.parametrize("kernel", MOD_KERNELS)
def test_mods_get_the_same_documented_indices_on_every_kernel(kernel):
    """`(B,1,1,1)`, `(1,H,1,1)`, `(1,1,Tq,1)`, `(1,1,1,Tk)` int32 on every
    kernel (the blockwise one gave 5-D grouped tensors), positions never past
    the sequence (its padded tiles repeat the last one)."""
    seen = []

    def record(*indices):
        shapes = tuple(tuple(t.shape) for t in indices)
        dtypes = {keras.backend.standardize_dtype(t.dtype) for t in indices}
        top = None
        if BACKEND == "tensorflow":  # eager: the loops run in Python
            top = (int(np.max(to_numpy(indices[2]))), int(np.max(to_numpy(indices[3]))))
        seen.append((shapes, dtypes, top))

    def spy_mask(batch, head, q_idx, k_idx):
        record(batch, head, q_idx, k_idx)
        return k_idx <= q_idx

    def spy_score(score, batch, head, q_idx, k_idx):
        record(batch, head, q_idx, k_idx)
        return score

    arrays, _, _, _ = _case("decoding offset")  # Tq 3 at offset 8, Tk 13, 2 kv heads
    mask = attention_mask.AttentionMask(causal=True, query_offset=8, mask_mod=spy_mask)
    scores = None if kernel == "composite" else score_modifier.ScoreModifier(score_mod=spy_score)
    q, k, v = (np.asarray(arrays[n], "float32") for n in ("q", "k", "v"))
    if kernel == "composite":
        _kernel(kernel, mask)(q, k, v, score_modifier.ScoreModifier())
    else:
        _kernel(kernel, mask)(q, k, v, scores)
    assert seen
    tiled = kernel == "blockwise"
    q_len, k_len = (3, 3) if tiled else (3, 13)
    for shapes, dtypes, top in seen:
        assert dtypes == {"int32"}
        assert shapes[:2] == ((B, 1, 1, 1), (1, H, 1, 1)), shapes
        assert shapes[2][:2] + shapes[2][3:] == (1, 1, 1) and shapes[2][2] == q_len, shapes
        assert shapes[3][:3] == (1, 1, 1) and shapes[3][3] in (k_len, 15 if tiled else 13)
        assert top is None or (top[0] <= 10 and top[1] <= 12), top


def _float_mask(b, h, q, k):
    return keras.ops.where(k <= q, 0.0, float("-inf"))  # Hugging Face's additive form


def _dropped_column(b, h, q, k):
    return (k <= q)[..., :-1]


def _extra_axis(b, h, q, k):
    return (k <= q)[None]


def _three(b, h, q, k):
    return keras.ops.ones((3,), "bool")


def _integer_score(s, b, h, q, k):
    return keras.ops.cast(s, "int32")


def _score_dropped_column(s, b, h, q, k):
    return s[..., :-1]


BAD_MODS = {
    "float mask": ("mask_mod", _float_mask, TypeError, r"must return booleans.*float32.*score_mod"),
    "dropped column": ("mask_mod", _dropped_column, ValueError, r"broadcastable.*Received.*\)"),
    "extra axis": ("mask_mod", _extra_axis, ValueError, r"Received: a result of shape \(1, 1, 1,"),
    "(3,)": ("mask_mod", _three, ValueError, r"Received: a result of shape \(3,\)"),
    "integer score": ("score_mod", _integer_score, TypeError, r"floating point.*int32"),
    "score column": ("score_mod", _score_dropped_column, ValueError, r"the score's shape"),
}


@pytest.mark.parametrize("bad", sorted(BAD_MODS))
@pytest.mark.parametrize("kernel", ["dense", "shifted", "blockwise"])
def test_a_mods_wrong_result_is_refused_naming_the_function(kernel, bad):
    """Checked once per trace on every kernel: the owner, the argument, the
    function's name and the shape or dtype expected and returned, not a
    backend's broadcast error from inside a kernel."""
    argument, function, error, pattern = BAD_MODS[bad]
    arrays, _, _, _ = _case("plain")
    mask = attention_mask.AttentionMask(
        **({"mask_mod": function} if argument == "mask_mod" else {})
    )
    scores = score_modifier.ScoreModifier(
        **({"score_mod": function} if argument == "score_mod" else {})
    )
    q, k, v = (np.asarray(arrays[n], "float32") for n in ("q", "k", "v"))
    owner = "AttentionMask" if argument == "mask_mod" else "ScoreModifier"
    with pytest.raises(error, match=rf"^{owner}: `{argument}` {function.__name__} .*{pattern}"):
        _kernel(kernel, mask)(q, k, v, scores)


# ---------------------------------------------------------------- dropout
DROPOUT = (0.3, 1234)  # (rate, seed)


@pytest.mark.parametrize(
    "mask_name, modifiers",
    [
        ("plain", ()),  # the fixed-shift forward
        ("causal window, row without keys", ("soft_cap",)),  # the cap's path, an empty row
        ("packed documents", MODIFIERS),  # the running maximum, folded ALiBi, sinks
        ("mask_mod", ("table",)),  # a weighted `score_mod`'s gradient
    ],
)
def test_dropout_in_the_blockwise_kernel(mask_name, modifiers):
    """Values and gradients equal the float64 reference fed the kernel's keep
    mask: the softmax normalised over every key, then dropped and scaled;
    `dV = (P D)^T dO`, `dS = P (D dP - delta)` (#50)."""
    _check("blockwise", mask_name, modifiers, dropout=DROPOUT)


def test_dropout_in_the_blockwise_kernel_compiled_and_whatever_the_tiles():
    """XLA (TF) / `jax.jit`, and tiles of other sizes: the keep bits belong to
    the (row, column) pairs, not to the tiles."""
    _check("blockwise", "causal, padding, grouped", ("sinks",), compiled=True, dropout=DROPOUT)
    _check("blockwise", "key padding", (), dropout=DROPOUT, blocks=(16, 16))
    _check("blockwise", "key padding", (), dropout=DROPOUT, blocks=(2, 5))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dropout_in_half_precision_is_computed_in_float32(dtype):
    arrays, mask, allowed, offset = _case("causal window, row without keys")
    arrays["q"] = arrays["q"] * 10  # logits past float16's exp range
    rounded = dict(arrays)
    for name in ("q", "k", "v"):
        rounded[name] = to_numpy(ops.cast(ops.cast(arrays[name], dtype), "float32"))
    rate, seed = DROPOUT
    dropped = to_numpy(dropout_keep_mask(seed, *allowed.shape, rate)) / (1.0 - rate)
    expected = numpy_attention(rounded, allowed, (), offset, dropped)[0]
    out = _kernel("blockwise", mask, DROPOUT)(
        *(ops.cast(arrays[n], dtype) for n in ("q", "k", "v")), None
    )
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = to_numpy(out)
    assert np.all(np.isfinite(out)) and not np.any(out[1, 0])
    np.testing.assert_allclose(out, expected, atol=5e-2, rtol=2e-2)


# ------------------------------------------------------------- statistics
def numpy_statistics(arrays, allowed, modifiers, weights):
    """Each row's log-sum-exp and maximum over its visible keys' capped
    logits and the sink (`-inf` with none), and the gradients of
    `sum(weights * lse)` (finite rows) w.r.t. q, k and the sinks, in float64."""
    q, k, sinks = (arrays[n].astype(np.float64) for n in ("q", "k", "sinks"))
    kk = np.repeat(k, H // k.shape[2], axis=2)
    scale = 1.0 / np.sqrt(D)
    raw = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    cap_chain = 1.0 - np.tanh(raw / CAP) ** 2 if "soft_cap" in modifiers else 1.0
    logits = CAP * np.tanh(raw / CAP) if "soft_cap" in modifiers else raw
    logits = np.where(allowed, logits, -np.inf)
    terms = [logits]
    if "sinks" in modifiers:
        terms.append(np.broadcast_to(sinks[None, :, None, None], logits.shape[:3] + (1,)))
    full = np.concatenate(terms, axis=-1)
    peak = full.max(-1)
    seen = np.isfinite(peak)
    safe = np.where(seen, peak, 0.0)[..., None]
    total = np.exp(full - safe).sum(-1)
    lse = np.where(seen, safe[..., 0] + np.log(np.where(seen, total, 1.0)), -np.inf)
    probs = np.where(seen[..., None], np.exp(full - np.where(seen, lse, 0.0)[..., None]), 0.0)
    d_logits = weights[..., None] * probs[..., : logits.shape[-1]] * cap_chain
    dq = np.einsum("bhqk,bkhd->bqhd", d_logits, kk) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", d_logits, q) * scale
    dk = dk.reshape(k.shape[:3] + (-1, D)).sum(3)
    d_sinks = (weights * probs[..., -1]).sum(axis=(0, 2)) if "sinks" in modifiers else 0 * sinks
    return lse, peak, dq, dk, d_sinks


STATISTICS_KERNELS = ("dense", "shifted", "blockwise", "block_sparse")


def _statistics(kernel, q, k, v, mask, scores):
    scale = 1.0 / np.sqrt(D)
    if kernel == "dense":
        return dense_attention.dense_attention(
            q, k, v, mask, scale=scale, modifier=scores, return_statistics=True
        )[2]
    if kernel == "shifted":
        return dense_attention.shifted_attention(
            q, k, v, mask, scale=scale, modifier=scores, return_statistics=True
        )[1]
    if kernel == "block_sparse":
        # A pattern that covers every key (a wide window) equals the dense
        # statistics; the global block's rows are the engine's second call.
        groups = q.shape[2] // k.shape[2]
        return block_sparse.block_sparse_attention(
            q,
            ops.repeat(k, groups, axis=2),
            ops.repeat(v, groups, axis=2),
            block_size=4,
            window_blocks=8,
            global_blocks=1,
            mask=mask,
            scale=scale,
            modifier=scores,
            return_statistics=True,
        )[1]
    return memory_efficient_attention(
        q,
        k,
        v,
        mask=mask,
        scale=scale,
        modifier=scores,
        block_size=4,
        key_block_size=3,
        return_statistics=True,
    )[1]


@pytest.mark.parametrize(
    "name, modifiers",
    [
        ("causal window, row without keys", ()),
        ("causal window, row without keys", ("soft_cap", "sinks")),
        ("decoding offset", ("soft_cap", "sinks")),
        ("packed documents", ()),
    ],
    ids=["plain", "cap+sinks", "cache offset, cap+sinks", "packed documents"],
)
@pytest.mark.parametrize("kernel", STATISTICS_KERNELS)
def test_every_kernel_returns_the_rows_log_sum_exp_and_maximum(kernel, name, modifiers):
    """FlexAttention's `return_aux`: the same numbers from each kernel's own
    pass (the blockwise one from its sweep over its plan, its backward taking
    the log-sum-exp's gradient), a row with nothing to see at `-inf`; under
    a cache's offset and between packed documents too."""
    if kernel == "block_sparse" and "offset" in name:
        pytest.skip("a sparse pattern is self-attention's: no cache offset")
    arrays, mask, allowed, _ = _case(name)
    weights = np.random.default_rng(1).normal(size=(B, H, allowed.shape[2]))
    lse, peak, dq, dk, d_sinks = numpy_statistics(arrays, allowed, modifiers, weights)
    if "row without keys" in name:  # -inf, or the sink's logit alone
        assert np.isneginf(lse).any() != ("sinks" in modifiers)
    inputs = [np.asarray(arrays[n], "float32") for n in ("q", "k", "v", "sinks")]
    finite = np.isfinite(lse)
    if BACKEND == "jax":
        import jax

        def loss(q, k, v, s):
            stats = _statistics(kernel, q, k, v, mask, _scores(modifiers, s))
            total = (jax.numpy.where(finite, stats["logsumexp"], 0.0) * weights).sum()
            return total, stats

        # Compiled, as everywhere in this file on JAX (op by op: several times slower).
        grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 3), has_aux=True))
        (_, stats), grads = grad(*inputs)
    else:
        import tensorflow as tf

        tensors = [tf.constant(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            stats = _statistics(kernel, *tensors[:3], mask, _scores(modifiers, tensors[3]))
            total = tf.reduce_sum(tf.where(finite, stats["logsumexp"], 0.0) * weights)
        zero = tf.UnconnectedGradients.ZERO
        grads = tape.gradient(total, [tensors[i] for i in (0, 1, 3)], unconnected_gradients=zero)
    got_lse, got_max = to_numpy(stats["logsumexp"]), to_numpy(stats["max"])
    np.testing.assert_array_equal(np.isneginf(got_lse), ~finite)
    np.testing.assert_allclose(got_lse[finite], lse[finite], atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.isneginf(got_max), ~finite)
    np.testing.assert_allclose(got_max[finite], peak[finite], atol=2e-5, rtol=1e-5)
    for got, want in zip(grads, (dq, dk, d_sinks), strict=True):
        np.testing.assert_allclose(to_numpy(got), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kernel", STATISTICS_KERNELS[:3])
def test_parts_over_disjoint_keys_merge_into_the_whole(kernel):
    """`merge_attention`: the keys split in two (the second half hidden from
    example 1, whose rows then have one part only), each half attended by
    the kernel with its statistics, merged: the whole call's output, its
    log-sum-exp, and the output's gradient w.r.t. the queries, against
    float64 NumPy."""
    from keras_attention.ops import merge_attention

    arrays, mask, allowed, offset = _case("key padding")  # keys 5.. hidden in example 1
    expected = numpy_attention(arrays, allowed, (), offset)
    lse, _, _, _, _ = numpy_statistics(arrays, allowed, (), np.zeros(allowed.shape[:3]))
    q, k, v = (np.asarray(arrays[n], "float32") for n in ("q", "k", "v"))
    key_mask = to_numpy(mask.key_mask).astype(bool)
    cotangent = np.asarray(arrays["cotangent"], "float32")

    def merged(q):
        outputs, statistics = [], []
        for keys in (slice(0, 6), slice(6, None)):
            part = attention_mask.AttentionMask(key_mask=key_mask[:, keys])
            scale = 1.0 / np.sqrt(D)
            if kernel == "blockwise":
                out, stats = memory_efficient_attention(
                    q,
                    k[:, keys],
                    v[:, keys],
                    mask=part,
                    scale=scale,
                    block_size=4,
                    key_block_size=3,
                    return_statistics=True,
                )
            elif kernel == "shifted":
                out, stats = dense_attention.shifted_attention(
                    q, k[:, keys], v[:, keys], part, scale=scale, return_statistics=True
                )
            else:
                out, _, stats = dense_attention.dense_attention(
                    q, k[:, keys], v[:, keys], part, scale=scale, return_statistics=True
                )
            outputs.append(out)
            statistics.append(stats)
        return merge_attention(outputs, statistics)

    if BACKEND == "jax":
        import jax

        def loss(q):
            out, stats = merged(q)
            return (out * cotangent).sum(), (out, stats)

        (_, (out, stats)), dq = jax.jit(jax.value_and_grad(loss, has_aux=True))(q)
    else:
        import tensorflow as tf

        q = tf.constant(q)
        with tf.GradientTape() as tape:
            tape.watch(q)
            out, stats = merged(q)
            total = tf.reduce_sum(out * cotangent)
        dq = tape.gradient(total, q)
    np.testing.assert_allclose(to_numpy(out), expected[0], atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(to_numpy(stats["logsumexp"]), lse, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(dq), expected[2], atol=2e-5, rtol=1e-4)
