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
evaluated, then its *partial* ones, where each tile takes its rows of the
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
from keras_attention.ops import dropout
from keras_attention.ops import loops
from keras_attention.ops import masking
from keras_attention.ops import online_softmax
from keras_attention.ops import tiling as tile_plans
from keras_attention.ops.loops import sequential_fori_loop
from keras_attention.ops.loops import to_time_blocks
from keras_attention.ops.xla import under_xla

# TF graph mode only: query blocks run one after the other (their tiles are
# what costs memory); two key steps may overlap so that the next tile's
# matmul starts while the previous tile's softmax finishes. Measured at
# L = 8192 (8 heads, block 1024): peak RSS 1.16 GiB (1, 1), 1.29 (1, 2),
# 1.46 (1, 10), 2.14 (10, 10, the `tf.while_loop` default).
_QUERY_PARALLEL, _KEY_PARALLEL = 1, 2


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
    mask=None,
    scale=None,
    block_size=512,
    key_block_size=None,
    scores=None,
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
        scores: a `ScoreModifier` (soft cap, ALiBi, learned sinks, a user
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
    if mask is None:
        mask = attention_masks.AttentionMask()
    elif not isinstance(mask, attention_masks.AttentionMask):
        raise TypeError(
            "memory_efficient_attention: `mask` must be an AttentionMask (see "
            f"AttentionMask.from_tensors) or None. Received: mask={mask!r}"
        )
    owner = "memory_efficient_attention"
    dropout_rate = validation.validate_rate(owner, "dropout_rate", dropout_rate)
    if dropout_rate > 0.0:
        if dropout_seed is None:
            raise ValueError(
                f"{owner}: `dropout_seed` is needed when `dropout_rate` > 0 (an "
                "integer or an integer scalar tensor, new at each training step). "
                f"Received: dropout_rate={dropout_rate}, dropout_seed=None"
            )
        dropout.check_seed(owner, "dropout_seed", dropout_seed)
        if dropout_rows is not None and tuple(dropout_rows.shape) != (query.shape[1],):
            raise ValueError(
                f"{owner}: `dropout_rows` must hold one position per query row. "
                f"Received: dropout_rows with shape {tuple(dropout_rows.shape)}, query "
                f"with shape {tuple(query.shape)}"
            )
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
        empty = masking.empty_attention(query, value)
        if not return_statistics:
            return empty
        nothing = ops.full((ops.shape(query)[0], num_heads, q_len), float("-inf"))
        return empty, {"logsumexp": nothing, "max": nothing}
    if scale is None:
        scale = 1.0 / math.sqrt(key_dim)
    # NaN/Inf at a key reaches only the queries whose masks let them see it.
    key, value = masking.confine_nonfinite(key, value)
    if tile_plan is None:
        tile_plan = mask.tile_plan
    if tile_plan is not None:
        if not isinstance(tile_plan, tile_plans.TilePlan):
            raise TypeError(
                f"{owner}: `tile_plan` must be a TilePlan (ops.tile_plan) or None. "
                f"Received: tile_plan={tile_plan!r}"
            )
        tile_plan.check(owner, q_len, k_len)
        block_size, key_block_size = tile_plan.query_block, tile_plan.key_block
    key_block_size = key_block_size or block_size
    q_block, k_block = min(block_size, q_len), min(key_block_size, k_len)
    num_q_blocks = -(-q_len // q_block)
    num_k_blocks = -(-k_len // k_block)
    groups = num_heads // num_kv_heads

    q = _to_query_blocks(ops.cast(query, "float32") * scale, num_q_blocks, q_block, num_kv_heads)
    k = to_time_blocks(ops.cast(key, "float32"), num_k_blocks, k_block)
    v = to_time_blocks(ops.cast(value, "float32"), num_k_blocks, k_block)
    keep_rows = keep_columns = None
    if dropout_rate > 0.0:
        # Every row's and column's key, once per call; a tile's keep bits are
        # one product and one comparison of them (`ops.dropout`).
        bits = dropout.KeepBits(dropout_seed, dropout_rate, ops.shape(q)[1], num_heads)
        if dropout_rows is None:
            dropout_rows = ops.arange(q_len, dtype="int32")
        rows = ops.pad(ops.cast(dropout_rows, "int32"), ((0, num_q_blocks * q_block - q_len),))
        rows = ops.reshape(bits.rows(rows), (-1, num_kv_heads, groups, num_q_blocks, q_block))
        keep_rows = ops.transpose(rows, (3, 0, 1, 2, 4))[..., None]  # (nq, B, Hkv, G, bq, 1)
        columns = bits.columns(ops.arange(num_k_blocks * k_block, dtype="int32"))
        keep_columns = ops.reshape(columns, (num_k_blocks, k_block))
        # The kept weights' 1 / (1 - rate), on the values (autodiff scales dV).
        v = v * bits.scale

    def kept(i, j):
        """Tile (i, j)'s `(B, Hkv, G, bq, bk)` keep bits, or None."""
        if keep_rows is None:
            return None
        columns = ops.reshape(_take(keep_columns, j), (1, 1, 1, 1, k_block))
        return bits.keep(_take(keep_rows, i), columns)

    # The description's masks, cut into blocks once; each tile picks its slice.
    key_valid = mask.key_mask
    if key_valid is None and num_k_blocks * k_block != k_len:
        key_valid = ops.ones((1, k_len), dtype="bool")  # hides the padding
    key_blocks = (
        None if key_valid is None else _mask_blocks(key_valid, num_k_blocks, k_block, k_len)
    )
    query_blocks = (
        None
        if mask.query_mask is None
        else _mask_blocks(mask.query_mask, num_q_blocks, q_block, q_len)
    )
    segment_blocks = None  # ((nq, B|1, bq), (nk, B|1, bk)) integer ids
    if mask.has_segments:
        segment_blocks = (
            _mask_blocks(ops.cast(mask.query_segment_ids, "int32"), num_q_blocks, q_block, q_len),
            _mask_blocks(ops.cast(mask.key_segment_ids, "int32"), num_k_blocks, k_block, k_len),
        )
    pair_blocks = None
    pair_heads = (1, 1)  # the pair mask's (Hkv, G): per-head masks split like q
    if mask.pair_mask is not None:
        pair = mask.pair_mask  # (Bm, H|1, Tq|1, Tk|1)
        if mask.per_head:
            pair_heads = (num_kv_heads, groups)
        pair = ops.broadcast_to(pair, (ops.shape(pair)[0], pair.shape[1], q_len, k_len))
        pad_q, pad_k = num_q_blocks * q_block - q_len, num_k_blocks * k_block - k_len
        if pad_q or pad_k:
            pair = ops.pad(pair, ((0, 0), (0, 0), (0, pad_q), (0, pad_k)), constant_values=False)
        pair = ops.reshape(
            pair, (-1,) + pair_heads + (num_q_blocks, q_block, num_k_blocks, k_block)
        )
        # (nq, nk, Bm, Hkv|1, G|1, bq, bk)
        pair_blocks = ops.transpose(pair, (3, 5, 0, 1, 2, 4, 6))

    def tile_mask(i, j, masked=True):
        """`(Bm, Hkv|1, G|1, bq, bk)` boolean mask of tile (i, j), or None
        (a full tile of the plan: `masked` False)."""
        if not masked:
            return None
        allowed = None
        if key_blocks is not None:
            allowed = ops.reshape(_take(key_blocks, j), (-1, 1, 1, 1, k_block))
        if query_blocks is not None:
            allowed = masking.merge_masks(
                allowed, ops.reshape(_take(query_blocks, i), (-1, 1, 1, q_block, 1))
            )
        if pair_blocks is not None:
            tile = ops.reshape(
                _take(_take(pair_blocks, i), j), (-1,) + pair_heads + (q_block, k_block)
            )
            allowed = masking.merge_masks(allowed, tile)
        if segment_blocks is not None:
            query_ids, key_ids = (
                _take(blocks, index) for blocks, index in zip(segment_blocks, (i, j), strict=True)
            )
            allowed = masking.merge_masks(
                allowed,
                mask.segments(query_ids[:, None, None, :, None], key_ids[:, None, None, None, :]),
            )
        if mask.has_rules:
            batch, head, rows, cols = tile_indices(i, j)
            rule = mask.rules(batch if mask.batch_dependent_rules else None, head, rows, cols)
            allowed = masking.merge_masks(allowed, rule)
        return allowed

    if scores is not None and scores.is_empty:
        scores = None
    # ALiBi under the causal rule (every visible key at or before its query):
    # `-slope (i - j) = -slope (i - i0) + slope (j - i0)`, with `i0` the query
    # block's first position, is folded into each tile's matmul as two more
    # features, `[q, -slope r, slope] . [k, 1, j - i0]` (`r = i - i0`), so
    # the tile takes no elementwise pass for it; both terms stay small where
    # the bias is (no cancellation of large numbers). Otherwise the bias is
    # added per tile by the description.
    alibi_slopes = None
    if (
        scores is not None
        and scores.alibi_slopes is not None
        and mask.causal
        and mask.prefix_length is None
    ):
        alibi_slopes = ops.reshape(scores.alibi_slopes, (num_kv_heads, groups))
        scores = scores.without_alibi()
        if scores.is_empty:
            scores = None
    modify = scores is not None and scores.changes_logits
    # A soft cap (Gemma 2's configuration; with causal ALiBi folded into the
    # matmul too) keeps the fixed-shift step: capped logits are bounded, so
    # the running maximum is not needed, and `1 / c` is folded into the
    # queries, so a tile costs tanh and one multiply more than the plain
    # kernel's exp and sum.
    cap_only = (
        modify
        and scores.soft_cap is not None
        and scores.soft_cap <= online_softmax.SOFT_CAP_FIXED_MAX
        and scores.alibi_slopes is None
        and scores.score_mod is None
        and scores.sink_logits is None
    )
    head_index = ops.reshape(ops.arange(num_heads, dtype="int32"), (1, num_kv_heads, groups, 1, 1))

    def tile_indices(i, j):
        """`(batch, head, q_idx, k_idx)` of tile (i, j), broadcastable to it.
        Past the sequence's end (the last tiles' padding, hidden or dropped)
        the last real position is repeated, so a mod's lookups stay in range."""
        batch = ops.reshape(ops.arange(ops.shape(q)[1], dtype="int32"), (-1, 1, 1, 1, 1))
        rows = real_rows(mask.query_positions(i * q_block, q_block))
        cols = real_cols(j * k_block + ops.arange(k_block, dtype="int32"))
        return batch, head_index, rows[..., None], cols[:, :, :, None, :]

    def real_rows(rows):
        if num_q_blocks * q_block != q_len:
            rows = ops.minimum(rows, mask.query_positions(q_len - 1, 1))
        return ops.reshape(rows, (1, 1, 1, -1))

    def real_cols(cols):
        if num_k_blocks * k_block != k_len:
            cols = ops.minimum(cols, k_len - 1)
        return ops.reshape(cols, (1, 1, 1, -1))

    def with_alibi_queries(queries):
        """`(nq, B, Hkv, G, bq, D)` queries with the fold's two features."""
        if alibi_slopes is None:
            return queries
        rows = ops.arange(q_block, dtype="float32")
        slope = alibi_slopes[None, None, :, :, None]
        shape = ops.shape(queries)[:-1]
        first = ops.broadcast_to(-slope * rows, shape)
        second = ops.broadcast_to(slope, shape)
        return ops.concatenate([queries, first[..., None], second[..., None]], axis=-1)

    def with_alibi_keys(k_tile, i, j):
        """Tile (i, j)'s `(B, Hkv, bk, D)` keys with the fold's features."""
        if alibi_slopes is None:
            return k_tile
        offset = mask.query_offset
        if not isinstance(offset, int):
            offset = ops.cast(offset, "int32")
        relative = j * k_block + ops.arange(k_block, dtype="int32") - (offset + i * q_block)
        shape = ops.shape(k_tile)[:-1]
        relative = ops.broadcast_to(ops.cast(relative, "float32"), shape)
        ones = ops.ones_like(relative)
        return ops.concatenate([k_tile, ones[..., None], relative[..., None]], axis=-1)

    def masked_logits(q_tile, k_tile, i, j, weights=(), masked=True):
        logits = ops.einsum("bhgqd,bhkd->bhgqk", q_tile, with_alibi_keys(k_tile, i, j))
        if modify:
            logits = scores.apply(logits, *tile_indices(i, j), weights=weights)
        return online_softmax.mask_logits(logits, tile_mask(i, j, masked))

    def queries_over_cap(q_alibi, i):
        """Query block `i` divided by the cap (a folded ALiBi's features too)."""
        return _take(q_alibi, i) * (1.0 / scores.soft_cap)

    def cap_tanh(q_over_cap, k_tile, i, j):
        """`tanh(logits / c)` of tile (i, j) from queries already divided by
        `c` (a folded ALiBi's features included: the cap applies to the
        biased logits)."""
        return ops.tanh(ops.einsum("bhgqd,bhkd->bhgqk", q_over_cap, with_alibi_keys(k_tile, i, j)))

    def capped_logits(q_over_cap, k_tile, i, j, weights=(), masked=True):
        """`c tanh(logits / c)`, masked (`masked_logits` for the cap-only path)."""
        capped = scores.soft_cap * cap_tanh(q_over_cap, k_tile, i, j)
        return online_softmax.mask_logits(capped, tile_mask(i, j, masked))

    # The kernel's inputs after (q, k, v): the sink logits, then the
    # `score_mod`'s weights (explicit, so that the backward returns their
    # gradients).
    sink_inputs = () if scores is None or scores.sink_logits is None else (scores.sinks(),)
    score_weights = () if scores is None else scores.weights()

    # A user mod's results are checked once, here, on the first tile: an
    # error raised inside the loops below would be reported as the loop's.
    # The unused results are pruned by graph and XLA compilers.
    if mask.mask_mod is not None:
        mask.rules(*tile_indices(0, 0))
    if modify and scores.score_mod is not None:
        tile = (ops.shape(q)[1], num_kv_heads, groups, q_block, k_block)
        scores.apply(ops.zeros(tile), *tile_indices(0, 0), weights=score_weights)
    if tile_plan is None:
        tile_plan = tile_plans.build(
            mask, q_len, k_len, q_block, k_block, ops.shape(q)[1], num_heads
        )

    def over_plan(i, step, state):
        """`step(j, state, masked)` folded over the key blocks query block
        `i` visits: the plan's full tiles (no mask evaluated), then its
        partial ones."""
        for kind, counts, indices in tile_plan.kinds():
            row = _take(indices, i)
            masked = kind == tile_plans.PARTIAL

            def body(t, state, row=row, masked=masked):
                return step(_take(row, t), state, masked)

            state = sequential_fori_loop(
                0, _take(counts, i), body, state, parallel_iterations=_KEY_PARALLEL
            )
        return state

    def initial_state(row_shape, value_dim, sinks):
        """The running softmax before any key: a learned sink is a key with
        logit `sink[h]` and a zero value, so the state starts from it."""
        state = online_softmax.initial_state(row_shape, value_dim)
        if not sinks:
            return state
        sink = ops.reshape(sinks[0], (1, num_kv_heads, groups, 1))
        return (ops.broadcast_to(sink, row_shape), ops.ones(row_shape, "float32"), state[2])

    def forward(q, k, v, *extra):
        sinks, weights = extra[: len(sink_inputs)], extra[len(sink_inputs) :]
        batch = ops.shape(q)[1]
        row_shape = (batch, num_kv_heads, groups, q_block)
        value_dim = v.shape[-1]
        # Rows whose logits are bounded (|q| max|k| <= FIXED_SHIFT_MAX) skip
        # the running maximum: the shift is folded into the logits' matmul,
        # [q, -shift] . [k, 1], and each tile costs exp and sum only. A query
        # block takes that path when all its rows qualify (NaN/inf inputs
        # never do).
        # The statistics read the exact running maximum: no fixed shift.
        running_max_only = scores is not None or alibi_slopes is not None or return_statistics
        q_alibi = with_alibi_queries(q)
        if not running_max_only:
            shift = online_softmax.logit_bound(q, ops.expand_dims(k, 3), key_axis=(0, 4))
            q_shift = online_softmax.append_column(q, -shift)
            k_one = online_softmax.append_column(k, ops.ones_like(k[..., 0]))
            bounded = ops.all(
                ops.reshape(shift <= online_softmax.FIXED_SHIFT_MAX, (num_q_blocks, -1)), axis=1
            )

        def query_step(i, buffers):
            out_buffer, lse_buffer = buffers[:2]
            q_tile = _take(q, i)

            def key_loop(update, queries, keys, init, logits=masked_logits):
                """The key blocks folded into `init` by `update` (the
                online softmax's running-max or fixed-shift step)."""

                def key_step(j, state, masked):
                    v_tile = _take(v, j)
                    keep = kept(i, j)

                    def weighted_sum(probs):
                        # Dropped from `P @ V` only: the running sum `l`
                        # counts every key (the full row's normaliser). A
                        # product with the 0/1 bits, not a `where`: 0.83x
                        # the dropout's time in TF graph mode (8192 tokens).
                        if keep is not None:
                            probs = probs * ops.cast(keep, "float32")
                        return ops.einsum("bhgqk,bhkd->bhgqd", probs, v_tile)

                    return update(
                        state,
                        logits(queries, _take(keys, j), i, j, weights, masked),
                        weighted_sum,
                    )

                return over_plan(i, key_step, init)

            if cap_only and not return_statistics:  # bounded by the cap: shift 0
                state = key_loop(
                    online_softmax.update_fixed_shift,
                    queries_over_cap(q_alibi, i),
                    k,
                    online_softmax.fixed_shift_state(ops.zeros(row_shape), value_dim),
                    logits=capped_logits,
                )
            elif running_max_only:  # changed logits or a sink: no bound holds
                init = initial_state(row_shape, value_dim, sinks)
                state = key_loop(online_softmax.update, _take(q_alibi, i), k, init)
            else:
                state = ops.cond(
                    _take(bounded, i),
                    lambda: key_loop(
                        online_softmax.update_fixed_shift,
                        _take(q_shift, i),
                        k_one,
                        online_softmax.fixed_shift_state(_take(shift, i), value_dim),
                    ),
                    lambda: key_loop(
                        online_softmax.update,
                        q_tile,
                        k,
                        online_softmax.initial_state(row_shape, value_dim),
                    ),
                )
            out, lse = online_softmax.finish(state)
            written = (loops.write_block(out_buffer, i, out), loops.write_block(lse_buffer, i, lse))
            if return_statistics:  # the running maximum, -inf where nothing was seen
                peak = ops.where(ops.not_equal(state[1], 0.0), state[0], float("-inf"))
                written += (loops.write_block(buffers[2], i, peak),)
            return written

        row_buffer = ops.zeros((num_q_blocks,) + row_shape, dtype="float32")
        buffers = (
            loops.block_buffer(
                ops.zeros((num_q_blocks,) + row_shape + (value_dim,), dtype="float32")
            ),
            loops.block_buffer(row_buffer),
        ) + ((loops.block_buffer(row_buffer),) if return_statistics else ())
        results = sequential_fori_loop(
            0, num_q_blocks, query_step, buffers, parallel_iterations=_QUERY_PARALLEL
        )
        out, lse = loops.stack_blocks(results[0]), loops.stack_blocks(results[1])
        if not return_statistics:
            return out, (out, lse)
        return (out, lse, loops.stack_blocks(results[2])), (out, lse)

    def backward(inputs, saved, d_out):
        q, k, v = inputs[:3]
        weights = inputs[3 + len(sink_inputs) :]
        out, lse = saved
        d_lse = None
        if return_statistics:  # (d out, d lse, d max): the maximum has none
            d_out, d_lse = d_out[0], d_out[1]
        delta = online_softmax.output_delta(out, d_out)  # (nq, B, Hkv, G, bq)
        if d_lse is not None:
            # d lse / d logits = P: the row term becomes delta - d lse.
            delta = delta - ops.where(ops.equal(lse, online_softmax.NO_KEY_LSE), 0.0, d_lse)
        # One extra feature folds the row terms into the matmuls:
        # [q, -lse] . [k, 1] = logits - lse and [dO, -delta] . [v, 1] = dP - delta,
        # saving two elementwise passes over every tile.
        q_alibi = with_alibi_queries(q)
        q_lse = online_softmax.append_column(q_alibi, -lse)
        d_out_delta = online_softmax.append_column(d_out, -delta)
        k_one = online_softmax.append_column(k, ops.ones_like(k[..., 0]))
        v_one = online_softmax.append_column(v, ops.ones_like(v[..., 0]))
        keys_last = under_xla()

        def keys_gradient(tile, rows):
            """`tile^T rows` summed over the groups: a tile's `dK` (from `dS`)
            or `dV` (from `P`). Under XLA the product is formed as
            `(rows^T tile)^T`: XLA:CPU lays a dot's operands out with the
            contracted axis where its GEMM wants it, and contracting the
            tile's query axis as the left operand copied the whole
            `(bq, bk)` tile transposed, in a fusion that recomputed `dS`
            from its inputs (3 reads with a soft cap's derivative, 2
            without). Transposing the `(D, bk)` result instead: the same
            sums, 0.90x the plain kernel's time and a soft cap 1.08-1.09x
            over it instead of 1.66x / 1.41x (TF XLA / JAX, 8192 tokens,
            benchmarks/RESULTS.md). TensorFlow's graph path is left as it
            was (no difference there)."""
            if keys_last:
                return ops.swapaxes(ops.einsum("bhgqd,bhgqk->bhdk", rows, tile), -1, -2)
            return ops.einsum("bhgqk,bhgqd->bhkd", tile, rows)

        def query_step(i, buffers):
            dq_buffer, dk_buffer, dv_buffer, d_weights = buffers
            q_tile, d_out_tile = _take(q, i), _take(d_out, i)
            q_alibi_tile = _take(q_alibi, i)
            q_cap_tile = queries_over_cap(q_alibi, i) if cap_only else None
            q_lse_tile, d_out_delta_tile = _take(q_lse, i), _take(d_out_delta, i)
            if cap_only:
                # P = exp(c t) * exp(-lse): the row factor (<= exp(c); 0 for a
                # row without keys) joins dO and delta, so a tile takes no
                # pass for `- lse` (dV = exp(c t)^T (r dO), dS = exp(c t) r (dP - delta)).
                row = ops.expand_dims(ops.exp(-_take(lse, i)), -1)
                d_out_tile, d_out_delta_tile = d_out_tile * row, d_out_delta_tile * row

            def key_step(j, state, masked):
                dq, dk_buffer, dv_buffer, d_weights = state
                allowed = tile_mask(i, j, masked)
                k_tile = _take(k, j)
                if cap_only:  # the derivative below reads tanh(logits / c) again
                    capped = cap_tanh(q_cap_tile, k_tile, i, j)
                    changed = online_softmax.mask_logits(scores.soft_cap * capped, allowed)
                    probs = ops.exp(changed)  # times the row factor, folded into dO
                elif modify:  # the change comes between the matmul and the lse
                    raw = ops.einsum(
                        "bhgqd,bhkd->bhgqk", q_alibi_tile, with_alibi_keys(k_tile, i, j)
                    )
                    applied = scores.apply(raw, *tile_indices(i, j), weights=weights)
                    changed = online_softmax.mask_logits(applied, allowed)
                    probs = ops.exp(changed - ops.expand_dims(_take(lse, i), -1))
                elif alibi_slopes is None:
                    probs = ops.exp(masked_logits(q_lse_tile, _take(k_one, j), i, j, masked=masked))
                else:  # [q, -slope r, slope, -lse] . [k, 1, j - i0, 1]
                    keys = with_alibi_keys(k_tile, i, j)
                    keys = online_softmax.append_column(keys, ops.ones_like(keys[..., 0]))
                    logits = ops.einsum("bhgqd,bhkd->bhgqk", q_lse_tile, keys)
                    probs = ops.exp(online_softmax.mask_logits(logits, allowed))
                # dP - delta ([dO, -delta] . [v, 1]; v carries 1 / (1 - rate)).
                d_probs = ops.einsum("bhgqd,bhkd->bhgqk", d_out_delta_tile, _take(v_one, j))
                probs_kept = probs
                keep = kept(i, j)
                if keep is not None:  # D dP - delta: -delta where dropped
                    d_probs = ops.where(keep, d_probs, d_out_delta_tile[..., -1:])
                    probs_kept = probs * ops.cast(keep, "float32")
                d_logits = probs * d_probs
                if cap_only:  # d c tanh(x / c) / dx = 1 - tanh(x / c)^2
                    d_logits = d_logits * (1.0 - capped * capped)
                elif modify:
                    d_logits, tile_d_weights = scores.gradient(
                        raw, *tile_indices(i, j), d_logits, weights=weights, applied=applied
                    )
                    d_weights = tuple(a + b for a, b in zip(d_weights, tile_d_weights, strict=True))
                dq = dq + ops.einsum("bhgqk,bhkd->bhgqd", d_logits, k_tile)
                dk = loops.read_block(dk_buffer, j) + keys_gradient(d_logits, q_tile)
                dv = loops.read_block(dv_buffer, j) + keys_gradient(probs_kept, d_out_tile)
                return (
                    dq,
                    loops.write_block(dk_buffer, j, dk),
                    loops.write_block(dv_buffer, j, dv),
                    d_weights,
                )

            dq, dk_buffer, dv_buffer, d_weights = over_plan(
                i, key_step, (ops.zeros_like(q_tile), dk_buffer, dv_buffer, d_weights)
            )
            return loops.write_block(dq_buffer, i, dq), dk_buffer, dv_buffer, d_weights

        *grads, d_weights = sequential_fori_loop(
            0,
            num_q_blocks,
            query_step,
            tuple(loops.block_buffer(ops.zeros_like(x)) for x in (q, k, v))
            + (tuple(ops.zeros_like(w) for w in weights),),
            parallel_iterations=_QUERY_PARALLEL,
        )
        grads = tuple(loops.stack_blocks(g) for g in grads)
        if sink_inputs:
            # d sink[h] = -sum over rows of p_sink * delta (the sink's value is 0).
            sink = ops.reshape(inputs[3], (1, 1, num_kv_heads, groups, 1))
            d_sink = -ops.sum(ops.exp(sink - lse) * delta, axis=(0, 1, 4))
            grads += (ops.reshape(d_sink, (num_heads,)),)
        return grads + tuple(d_weights)

    attend = online_softmax.recomputing_gradient(forward, backward)
    out = attend(q, k, v, *sink_inputs, *score_weights)
    if not return_statistics:
        return ops.cast(_from_query_blocks(out, q_len), dtype)
    out, lse, peak = out

    def by_head(x):  # (nq, B, Hkv, G, bq) -> (B, H, Tq)
        x = ops.transpose(x, (1, 2, 3, 0, 4))
        return ops.reshape(x, (-1, num_heads, num_q_blocks * q_block))[:, :, :q_len]

    lse = ops.where(ops.equal(lse, online_softmax.NO_KEY_LSE), float("-inf"), lse)
    statistics = {"logsumexp": by_head(lse), "max": by_head(ops.stop_gradient(peak))}
    return ops.cast(_from_query_blocks(out, q_len), dtype), statistics
