"""Exact softmax attention in linear memory: blockwise, online softmax.

`memory_efficient_attention` computes the same result as
`softmax(q k^T * scale + mask) v` without ever holding the `(B, H, Tq, Tk)`
weights. Queries and keys are cut into blocks; for each query block the key
blocks are visited in turn while a running maximum `m`, a running sum `l` and
a running weighted sum `acc` are kept per query row (the "online softmax" of
Milakov & Gimelshein 2018, as used by FlashAttention, Dao et al. 2022). Only
`acc / l` and the log-sum-exp `m + log(l)` of each row are stored.

The gradient is custom: the backward pass recomputes each `(block, block)`
tile of probabilities from the stored log-sum-exp instead of keeping them, so
forward plus backward memory grows linearly with the sequence length. One
sweep over the tiles computes `dQ`, `dK` and `dV` together (five matmuls per
tile; the forward takes two), writing `dK`/`dV` blocks with
`ops.slice_update`, which XLA does in place.

With `use_causal_mask=True` the loops stop at the diagonal: key blocks that
lie entirely in the future of a query block are never computed.

Everything runs in float32 whatever the input dtype; the result is cast back.
Loops are `keras.ops.fori_loop` (a `lax.while_loop` on JAX) or, on
TensorFlow, a `tf.while_loop` that runs one query block at a time (graph mode
would otherwise run ten at once, each with its own tiles), so the kernel runs
in TF graph mode, under XLA (`jit_compile=True`) and under `jax.jit`.
Sequence lengths must be static.
"""

import math

from keras import ops

from keras_attention.ops import masking

from keras_attention.ops.loops import sequential_fori_loop
from keras_attention.ops.loops import to_time_blocks

# Running maximum before any key is seen: finite, so `exp(m_old - m_new)`
# is never `exp(-inf + inf)`, and below every real score.
_INITIAL_MAX = -1e30
_NO_KEY_LSE = 1e30
# TF graph mode only: query blocks run one after the other (their tiles are
# what costs memory); two key steps may overlap so that the next tile's
# matmul starts while the previous tile's softmax finishes. Measured at
# L = 8192 (8 heads, block 1024): peak RSS 1.16 GiB (1, 1), 1.29 (1, 2),
# 1.46 (1, 10), 2.14 (10, 10, the `tf.while_loop` default).
_QUERY_PARALLEL, _KEY_PARALLEL = 1, 2


def _append(x, column):
    """Appends `column` (shaped like `x[..., 0]`) as a last feature."""
    return ops.concatenate([x, ops.expand_dims(column, -1)], axis=-1)


def _to_query_blocks(x, num_blocks, block, num_kv_heads):
    # (B, T, H, D) -> (nq, B, Hkv, G, bq, D)
    pad = num_blocks * block - x.shape[1]
    if pad:
        x = ops.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    groups = x.shape[2] // num_kv_heads
    x = ops.reshape(x, (-1, num_blocks, block, num_kv_heads, groups, x.shape[3]))
    return ops.transpose(x, (1, 0, 3, 4, 2, 5))


def _from_query_blocks(x, length):
    # (nq, B, Hkv, G, bq, D) -> (B, T, H, D)
    num_blocks, _, num_kv_heads, groups, block, dim = x.shape
    x = ops.transpose(x, (1, 0, 4, 2, 3, 5))
    x = ops.reshape(x, (-1, num_blocks * block, num_kv_heads * groups, dim))
    return x[:, :length]


def _mask_blocks(mask, num_blocks, block, axis_length):
    # (Bm, T) boolean -> (n, Bm, b), padding positions are False.
    pad = num_blocks * block - axis_length
    if pad:
        mask = ops.pad(mask, ((0, 0), (0, pad)), constant_values=False)
    return ops.transpose(ops.reshape(mask, (-1, num_blocks, block)), (1, 0, 2))


def _take(x, index):
    return ops.take(x, index, axis=0)


def memory_efficient_attention(
    query,
    key,
    value,
    *,
    scale=None,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    sliding_window=None,
    block_size=512,
    key_block_size=None,
):
    """Exact multi-head softmax attention in memory linear in the length.

    Args:
        query: `(B, Tq, H, D)` projected queries.
        key: `(B, Tk, Hkv, D)` projected keys; `Hkv` divides `H` (query head
            `h` uses key/value head `h // (H // Hkv)`).
        value: `(B, Tk, Hkv, Dv)` projected values.
        scale: multiplies the logits; defaults to `1 / sqrt(D)`.
        query_mask: `(B, Tq)` boolean, `False` rows get zero output.
        key_mask: `(B, Tk)` boolean, `False` keys are never attended.
        attention_mask: `(B, Tq, Tk)` or per head `(B, H, Tq, Tk)` boolean,
            `True` where attention is allowed (a batch dimension of 1
            broadcasts).
        use_causal_mask: query `i` attends keys `j <= i` only.
        sliding_window: if set, query `i` attends keys with
            `|i - j| < sliding_window` only (as `keras.layers.
            MultiHeadAttention`); formed per tile, never as a `(Tq, Tk)` array.
        block_size: queries per tile.
        key_block_size: keys per tile; defaults to `block_size`.

    Returns:
        `(B, Tq, H, Dv)` in the dtype of `query`. A query row with no allowed
        key gets zeros (never NaN), as does its gradient.
    """
    dtype = query.dtype
    q_len, num_heads, key_dim = query.shape[1], query.shape[2], query.shape[3]
    k_len, num_kv_heads = key.shape[1], key.shape[2]
    if q_len is None or k_len is None:
        raise ValueError(
            "memory_efficient_attention needs static sequence lengths. "
            f"Received: query shape {tuple(query.shape)}, key shape "
            f"{tuple(key.shape)}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            "The number of key/value heads must divide the number of query "
            f"heads. Received: {num_kv_heads} key/value heads, {num_heads} "
            "query heads"
        )
    if masking.is_statically_empty(query, key):
        # No query, or nothing to attend to: the zeros of a fully masked row.
        return masking.empty_attention(query, value)
    if scale is None:
        scale = 1.0 / math.sqrt(key_dim)
    # NaN/Inf at a key reaches only the queries whose masks let them see it.
    key, value = masking.confine_nonfinite(key, value)
    key_block_size = key_block_size or block_size
    q_block, k_block = min(block_size, q_len), min(key_block_size, k_len)
    num_q_blocks = -(-q_len // q_block)
    num_k_blocks = -(-k_len // k_block)
    pads_keys = num_k_blocks * k_block != k_len

    q = _to_query_blocks(
        ops.cast(query, "float32") * scale, num_q_blocks, q_block, num_kv_heads
    )
    k = to_time_blocks(ops.cast(key, "float32"), num_k_blocks, k_block)
    v = to_time_blocks(ops.cast(value, "float32"), num_k_blocks, k_block)

    # Masks, cut into blocks once; each tile picks its slice.
    if key_mask is None and pads_keys:
        key_mask = ops.ones((1, k_len), dtype="bool")
    key_blocks = (
        None
        if key_mask is None
        else _mask_blocks(ops.cast(key_mask, "bool"), num_k_blocks, k_block, k_len)
    )
    query_blocks = (
        None
        if query_mask is None
        else _mask_blocks(
            ops.cast(query_mask, "bool"), num_q_blocks, q_block, q_len
        )
    )
    pair_blocks = None
    pair_heads = (1, 1)  # the mask's (Hkv, G): per-head masks split like q
    if attention_mask is not None:
        mask = ops.cast(attention_mask, "bool")
        if len(mask.shape) == 3:
            mask = ops.expand_dims(mask, 1)  # (Bm, 1, Tq, Tk)
        if mask.shape[1] != 1:
            pair_heads = (num_kv_heads, num_heads // num_kv_heads)
        pad_q, pad_k = num_q_blocks * q_block - q_len, num_k_blocks * k_block - k_len
        if pad_q or pad_k:
            mask = ops.pad(
                mask, ((0, 0), (0, 0), (0, pad_q), (0, pad_k)), constant_values=False
            )
        mask = ops.reshape(
            mask, (-1,) + pair_heads + (num_q_blocks, q_block, num_k_blocks, k_block)
        )
        # (nq, nk, Bm, Hkv|1, G|1, bq, bk)
        pair_blocks = ops.transpose(mask, (3, 5, 0, 1, 2, 4, 6))

    def tile_mask(i, j):
        """`(Bm, 1, 1, bq, bk)` boolean mask of tile (i, j), or None."""
        parts = []
        if key_blocks is not None:
            parts.append(ops.reshape(_take(key_blocks, j), (-1, 1, 1, 1, k_block)))
        if query_blocks is not None:
            parts.append(ops.reshape(_take(query_blocks, i), (-1, 1, 1, q_block, 1)))
        if pair_blocks is not None:
            tile = _take(_take(pair_blocks, i), j)
            parts.append(ops.reshape(tile, (-1,) + pair_heads + (q_block, k_block)))
        if use_causal_mask or sliding_window is not None:
            rows = ops.expand_dims(i * q_block + ops.arange(q_block), 1)
            cols = ops.expand_dims(j * k_block + ops.arange(k_block), 0)
        if use_causal_mask:
            causal = ops.greater_equal(rows, cols)
            parts.append(ops.reshape(causal, (1, 1, 1, q_block, k_block)))
        if sliding_window is not None:
            band = ops.less(ops.abs(rows - cols), sliding_window)
            parts.append(ops.reshape(band, (1, 1, 1, q_block, k_block)))
        if not parts:
            return None
        mask = parts[0]
        for part in parts[1:]:
            mask = ops.logical_and(mask, part)
        return mask

    def masked_logits(q_tile, k_tile, i, j):
        logits = ops.einsum("bhgqd,bhkd->bhgqk", q_tile, k_tile)
        mask = tile_mask(i, j)
        if mask is None:
            return logits
        return ops.where(mask, logits, float("-inf"))

    def key_stop(i):
        """One past the last key block query block `i` may see."""
        if not use_causal_mask:
            return num_k_blocks
        last_row = (i + 1) * q_block - 1
        return ops.minimum(last_row // k_block + 1, num_k_blocks)

    def forward(q, k, v):
        batch = ops.shape(q)[1]
        row_shape = (batch, num_kv_heads, num_heads // num_kv_heads, q_block)
        value_dim = v.shape[-1]

        def query_step(i, buffers):
            out_buffer, lse_buffer = buffers
            q_tile = _take(q, i)

            def key_step(j, state):
                running_max, running_sum, acc = state
                logits = masked_logits(q_tile, _take(k, j), i, j)
                new_max = ops.maximum(running_max, masking.row_max(logits, axis=-1))
                probs = ops.exp(logits - ops.expand_dims(new_max, -1))
                correction = ops.exp(running_max - new_max)
                running_sum = running_sum * correction + ops.sum(probs, axis=-1)
                acc = acc * ops.expand_dims(correction, -1) + ops.einsum(
                    "bhgqk,bhkd->bhgqd", probs, _take(v, j)
                )
                return new_max, running_sum, acc

            init = (
                ops.full(row_shape, _INITIAL_MAX, dtype="float32"),
                ops.zeros(row_shape, dtype="float32"),
                ops.zeros(row_shape + (value_dim,), dtype="float32"),
            )
            running_max, running_sum, acc = sequential_fori_loop(
                0, key_stop(i), key_step, init, parallel_iterations=_KEY_PARALLEL
            )
            # `!= 0`, not `> 0`: a NaN row must stay NaN (the exact kernel
            # propagates it), so a diverging model stays visible.
            attended = ops.not_equal(running_sum, 0.0)
            safe_sum = ops.where(attended, running_sum, 1.0)
            out = ops.where(
                ops.expand_dims(attended, -1),
                acc / ops.expand_dims(safe_sum, -1),
                0.0,
            )
            # Huge for rows with no key: exp(logit - lse) = 0 in the backward
            # (finite, as it goes through a matmul there).
            lse = ops.where(attended, running_max + ops.log(safe_sum), _NO_KEY_LSE)
            out_buffer = ops.slice_update(
                out_buffer, (i, 0, 0, 0, 0, 0), ops.expand_dims(out, 0)
            )
            lse_buffer = ops.slice_update(
                lse_buffer, (i, 0, 0, 0, 0), ops.expand_dims(lse, 0)
            )
            return out_buffer, lse_buffer

        buffers = (
            ops.zeros((num_q_blocks,) + row_shape + (value_dim,), dtype="float32"),
            ops.zeros((num_q_blocks,) + row_shape, dtype="float32"),
        )
        return sequential_fori_loop(
            0, num_q_blocks, query_step, buffers, parallel_iterations=_QUERY_PARALLEL
        )

    def backward(q, k, v, out, lse, d_out):
        delta = ops.sum(d_out * out, axis=-1)  # rowsum(dO * O), (nq, B, Hkv, G, bq)
        # One extra feature folds the row terms into the matmuls:
        # [q, -lse] . [k, 1] = logits - lse and [dO, -delta] . [v, 1] = dP - delta,
        # saving two elementwise passes over every tile.
        q_lse = _append(q, -lse)
        d_out_delta = _append(d_out, -delta)
        k_one = _append(k, ops.ones_like(k[..., 0]))
        v_one = _append(v, ops.ones_like(v[..., 0]))

        def query_step(i, buffers):
            dq_buffer, dk_buffer, dv_buffer = buffers
            q_tile, d_out_tile = _take(q, i), _take(d_out, i)
            q_lse_tile, d_out_delta_tile = _take(q_lse, i), _take(d_out_delta, i)

            def key_step(j, state):
                dq, dk_buffer, dv_buffer = state
                k_tile = _take(k, j)
                probs = ops.exp(masked_logits(q_lse_tile, _take(k_one, j), i, j))
                d_logits = probs * ops.einsum(
                    "bhgqd,bhkd->bhgqk", d_out_delta_tile, _take(v_one, j)
                )
                dq = dq + ops.einsum("bhgqk,bhkd->bhgqd", d_logits, k_tile)
                dk = _take(dk_buffer, j) + ops.einsum(
                    "bhgqk,bhgqd->bhkd", d_logits, q_tile
                )
                dv = _take(dv_buffer, j) + ops.einsum(
                    "bhgqk,bhgqd->bhkd", probs, d_out_tile
                )
                dk_buffer = ops.slice_update(
                    dk_buffer, (j, 0, 0, 0, 0), ops.expand_dims(dk, 0)
                )
                dv_buffer = ops.slice_update(
                    dv_buffer, (j, 0, 0, 0, 0), ops.expand_dims(dv, 0)
                )
                return dq, dk_buffer, dv_buffer

            dq, dk_buffer, dv_buffer = sequential_fori_loop(
                0,
                key_stop(i),
                key_step,
                (ops.zeros_like(q_tile), dk_buffer, dv_buffer), parallel_iterations=_KEY_PARALLEL
            )
            dq_buffer = ops.slice_update(
                dq_buffer, (i, 0, 0, 0, 0, 0), ops.expand_dims(dq, 0)
            )
            return dq_buffer, dk_buffer, dv_buffer

        return sequential_fori_loop(
            0,
            num_q_blocks,
            query_step,
            (ops.zeros_like(q), ops.zeros_like(k), ops.zeros_like(v)), parallel_iterations=_QUERY_PARALLEL
        )

    @ops.custom_gradient
    def attend(q, k, v):
        out, lse = forward(q, k, v)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return backward(q, k, v, out, lse, upstream)

        return out, grad

    out = attend(q, k, v)
    return ops.cast(_from_query_blocks(out, q_len), dtype)
