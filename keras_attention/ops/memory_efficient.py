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
`loops.write_block` (in place under XLA and JAX; a TensorArray in TF graph mode).

Every mask comes from one `AttentionMask` (`attention_mask.py`), and the
tiles to visit from one `TilePlan` (`tiling.py`, built from that mask or
passed in, shared by several calls): for each query block the loops visit
the plan's *full* key blocks, where every pair is visible and no mask is
evaluated (outside XLA; under XLA one loop masks every tile), then its
*partial* ones, where each tile takes its rows of the
query/key/pair masks and asks the description for the rules at its absolute
positions (a decoding cache's offset included). Tiles of neither kind (past
the causal diagonal, outside a window, other documents) are never computed.
The running softmax is `online_softmax`'s.

With `dropout_rate > 0` (training) the weights are dropped inside the
kernel: each tile's keep bits come from `ops.dropout` (a hash of the seed,
batch, head, and the pair's row and column), computed again by the
backward sweep, so nothing `(Tq, Tk)` is stored. The keep bits act on the
probabilities of `P @ V` only, never on the running sum `l` (the softmax is
normalised over every key, then dropped), and the values are scaled by
`1 / (1 - rate)` once. The backward uses `D = keep / (1 - rate)`:
`dV = (P D)^T dO`, `dS = P (D dP - delta)`, where `delta = rowsum(dO O)`
of the dropped output `O` is `sum_j P D dP` still.

Everything runs in float32 whatever the input dtype; the result is cast back.
Loops are `keras.ops.fori_loop` (a `lax.while_loop` on JAX) or, on
TensorFlow, a `tf.while_loop` that runs one query block at a time (graph mode
would otherwise run ten at once, each with its own tiles), so the kernel runs
in TF graph mode, under XLA (`jit_compile=True`) and under `jax.jit`.
Sequence lengths must be static.
"""

import math

from keras import ops

from keras_attention import validation
from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import checks
from keras_attention.ops import dropout
from keras_attention.ops import masking
from keras_attention.ops import tiled_engine
from keras_attention.ops import tiling


def memory_efficient_attention(
    query,
    key,
    value,
    *,
    mask=None,
    scale=None,
    block_size=512,
    key_block_size=None,
    modifier=None,
    dropout_rate=0.0,
    dropout_seed=None,
    dropout_rows=None,
    return_statistics=False,
    tile_plan=None,
):
    """Exact multi-head softmax attention in memory linear in the length.

    Args:
        query: `(B, Tq, H, D)` projected queries.
        key: `(B, Tk, Hkv, D)` projected keys; `Hkv` divides `H` (query head
            `h` uses key/value head `h // (H // Hkv)`).
        value: `(B, Tk, Hkv, Dv)` projected values.
        mask: an `AttentionMask` (what each query may see, with absolute
            positions: `AttentionMask.from_tensors` builds one from Keras'
            spellings), or None (every query sees every key). Its rules are
            formed per tile, never as a `(Tq, Tk)` array, and the tiles they
            rule out are skipped.
        scale: multiplies the logits; defaults to `1 / sqrt(D)`.
        block_size: queries per tile.
        key_block_size: keys per tile; defaults to `block_size`.
        modifier: a `ScoreModifier` (soft cap, ALiBi, learned sinks, a user
            `score_mod`) applied to each tile's logits at its absolute
            positions, inside the forward and the recomputing backward; or
            None.
        dropout_rate: the fraction of attention weights dropped (training),
            a float in `[0, 1)`; kept weights are scaled by `1 / (1 - rate)`.
        dropout_seed: an integer or an integer scalar tensor (draw a new one
            per training step); needed when `dropout_rate > 0`. The weights
            kept are those where `ops.dropout_keep_mask(dropout_seed, B, H,
            Tq, Tk, dropout_rate)` is True, whatever the block sizes.
        dropout_rows: the int32 `(Tq,)` positions that key the query rows'
            dropout bits; defaults to `0..Tq-1`. For a caller that attends
            some rows of a longer sequence (the block-sparse kernel's global
            rows), so they keep the bits of their positions.
        return_statistics: also return each row's log-sum-exp and maximum
            (`dense_attention.row_statistics`: over the visible keys'
            modified logits and the sink, `-inf` with none), from the same
            sweep; the log-sum-exp carries its gradient, the maximum none.
        tile_plan: a `TilePlan` of `mask` (`ops.tile_plan`: which key blocks
            each query block visits, full or partial), built once and shared
            by several calls; its block sizes replace `block_size` and
            `key_block_size`. Defaults to `mask.tile_plan`; built here from
            `mask` when neither is given.

    Returns:
        `(B, Tq, H, Dv)` in the dtype of `query` (with `return_statistics`,
        `(output, {"logsumexp": (B, H, Tq), "max": (B, H, Tq)})`). A query
        row with no allowed key gets zeros (never NaN), as does its gradient.
    """
    owner = "memory_efficient_attention"
    for argument, tensor in (("query", query), ("key", key), ("value", value)):
        checks.tensor(owner, argument, tensor, rank=4)
    block_size = checks.positive_int(owner, "block_size", block_size)
    key_block_size = checks.positive_int(owner, "key_block_size", key_block_size, allow_none=True)
    scale = checks.scale(owner, scale)
    return_statistics = checks.flag(owner, "return_statistics", return_statistics)
    mask = _checked_mask(owner, mask)
    dropout_rate = validation.validate_rate(owner, "dropout_rate", dropout_rate)
    if dropout_rate > 0.0:
        _check_dropout(owner, query, dropout_rate, dropout_seed, dropout_rows)
    _check_shapes(owner, query, key)
    q_len, num_heads = query.shape[1], query.shape[2]
    if masking.is_statically_empty(query, key):
        # No query, or nothing to attend to: the zeros of a fully masked row.
        empty = masking.empty_attention(query, value)
        if not return_statistics:
            return empty
        nothing = ops.full((ops.shape(query)[0], num_heads, q_len), float("-inf"))
        return empty, {"logsumexp": nothing, "max": nothing}
    k_len = key.shape[1]
    plan = _checked_plan(owner, mask.tile_plan if tile_plan is None else tile_plan, q_len, k_len)
    if plan is not None:
        block_size, key_block_size = plan.query_block, plan.key_block
    q_block = min(block_size, q_len)
    k_block = min(key_block_size or block_size, k_len)
    # NaN/Inf at a key reaches only the queries whose masks let them see it.
    key, value = masking.confine_nonfinite(key, value)
    sweep = tiled_engine.TiledSweep(
        query,
        key,
        value,
        mask,
        scale=1.0 / math.sqrt(query.shape[3]) if scale is None else scale,
        q_block=q_block,
        k_block=k_block,
        modifier=modifier,
        keep=(dropout_rate, dropout_seed, dropout_rows) if dropout_rate > 0.0 else None,
        stats=return_statistics,
    )
    if plan is None:
        plan = tiling.build(mask, q_len, k_len, q_block, k_block, sweep.batch, num_heads)
    out, statistics = sweep.run(plan)
    out = ops.cast(out, query.dtype)
    return out if not return_statistics else (out, statistics)


def _checked_mask(owner, mask):
    if mask is None:
        return attention_masks.AttentionMask()
    if not isinstance(mask, attention_masks.AttentionMask):
        raise TypeError(
            f"{owner}: `mask` must be an AttentionMask (see AttentionMask.from_tensors) "
            f"or None. Received: mask={mask!r}"
        )
    return mask


def _check_dropout(owner, query, rate, seed, rows):
    if seed is None:
        raise ValueError(
            f"{owner}: `dropout_seed` is needed when `dropout_rate` > 0 (an integer or "
            "an integer scalar tensor, new at each training step). Received: "
            f"dropout_rate={rate}, dropout_seed=None"
        )
    dropout.check_seed(owner, "dropout_seed", seed)
    if rows is not None and tuple(rows.shape) != (query.shape[1],):
        raise ValueError(
            f"{owner}: `dropout_rows` must hold one position per query row. Received: "
            f"dropout_rows with shape {tuple(rows.shape)}, query with shape "
            f"{tuple(query.shape)}"
        )


def _check_shapes(owner, query, key):
    if query.shape[1] is None or key.shape[1] is None:
        raise ValueError(
            f"{owner} needs static sequence lengths. Received: query shape "
            f"{tuple(query.shape)}, key shape {tuple(key.shape)}"
        )
    if query.shape[2] % key.shape[2]:
        raise ValueError(
            f"{owner}: the number of key/value heads must divide the number of query "
            f"heads. Received: {key.shape[2]} key/value heads, {query.shape[2]} query heads"
        )


def _checked_plan(owner, plan, q_len, k_len):
    if plan is None:
        return None
    if not isinstance(plan, tiling.TilePlan):
        raise TypeError(
            f"{owner}: `tile_plan` must be a TilePlan (ops.tile_plan) or None. "
            f"Received: tile_plan={plan!r}"
        )
    return plan.check(owner, q_len, k_len)
