"""Which tiles a tiled kernel visits: one plan, built once, shared.

A tiled kernel cuts the queries into blocks of `query_block` rows and the
keys into blocks of `key_block` columns. For each query block a `TilePlan`
lists the key blocks to visit, in two kinds (PyTorch FlexAttention's
`BlockMask`, JAX Splash's `MaskInfo`, in our terms):

- *full*: every (query, key) pair of the tile is visible in every example
  and head, so the kernel need not evaluate the mask there (it skips it
  outside XLA; under XLA the mask is fused into the tile's other work);
- *partial*: some pair is visible and some may not be; the kernel evaluates
  the mask on the tile.

Tiles of neither kind are skipped. Each kind is a `(nq,)` count and a
`(nq, nk)` index table (the visited blocks first, in increasing order; the
rest padding), so the plan has static shapes: a new packing of documents is
new data for the same program, never a new trace.

`tile_plan(mask, ...)` builds one from an `AttentionMask` in O(number of
tiles) from its rules on block bounds (causal, window, sinks, prefix, key
length), the block extremes of segment ids and of the padding masks; a
`mask_mod` is evaluated one query block at a time (never `Tq x Tk` at once).
A plan is sound (a tile marked full has no masked pair; a skipped tile has
no visible pair), not always tight: what the bounds cannot decide is partial.

`ops.sparse_tile_plan` builds one from the block-sparse pattern (BigBird's
window, global and random blocks, Longformer's global tokens): such a plan
carries its `BlockPattern`, and restricts what the kernels given it attend
to (block-sparse attention, FlexAttention's `BlockMask` of a sparse pattern).

A model builds the plan once per batch and passes it to every layer
(`MultiHeadAttention(...)(x, tile_plan=plan)`) and both passes use it.
"""

from keras import ops

from keras_attention import validation
from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import checks
from keras_attention.ops import loops

FULL, PARTIAL = "full", "partial"


class TilePlan:
    """The key blocks each query block visits (see the module docstring).

    Args:
        query_length, key_length: the static lengths it tiles.
        query_block, key_block: rows and columns per tile.
        full_counts, partial_counts: `(nq,)` int32, how many key blocks of
            each kind query block `i` visits.
        full_indices, partial_indices: `(nq, nk)` int32; row `i` starts with
            the visited key blocks of that kind.
        pattern: a `BlockPattern` (`from_pattern`), or None. A plan with a
            pattern also restricts what is seen: a kernel given it computes
            block-sparse attention (the pairs of its tiles, its global rows
            and columns only), not the mask's exact attention.
    """

    def __init__(
        self,
        *,
        query_length,
        key_length,
        query_block,
        key_block,
        full_counts,
        full_indices,
        partial_counts,
        partial_indices,
        pattern=None,
    ):
        owner = "TilePlan"
        for name, value in (
            ("query_length", query_length),
            ("key_length", key_length),
            ("query_block", query_block),
            ("key_block", key_block),
        ):
            checks.positive_int(owner, name, value)
        num_blocks = (-(-query_length // query_block), -(-key_length // key_block))
        for name, value, shape in (
            ("full_counts", full_counts, num_blocks[:1]),
            ("partial_counts", partial_counts, num_blocks[:1]),
            ("full_indices", full_indices, num_blocks),
            ("partial_indices", partial_indices, num_blocks),
        ):
            checks.tensor(owner, name, value, rank=len(shape))
            if tuple(value.shape) != shape or "int" not in str(value.dtype):
                raise ValueError(
                    validation.error(
                        owner,
                        f"`{name}` must be integers of shape {shape} (query blocks, key "
                        f"blocks). Received: {name} with shape {tuple(value.shape)} and "
                        f"dtype {value.dtype}",
                    )
                )
        self.query_length, self.key_length = query_length, key_length
        self.query_block, self.key_block = query_block, key_block
        self.num_query_blocks = -(-query_length // query_block)
        self.num_key_blocks = -(-key_length // key_block)
        self.counts = {FULL: full_counts, PARTIAL: partial_counts}
        self.indices = {FULL: full_indices, PARTIAL: partial_indices}
        if pattern is not None and not isinstance(pattern, BlockPattern):
            raise TypeError(
                validation.error(
                    owner,
                    "`pattern` must be a BlockPattern or None. Received: "
                    f"pattern={validation.describe(pattern)}",
                )
            )
        self.pattern = pattern

    def kinds(self):
        """`(kind, counts, indices)` for the full, then the partial tiles."""
        return tuple((kind, self.counts[kind], self.indices[kind]) for kind in (FULL, PARTIAL))

    def tiles(self):
        """`(nq, nk)` int32: 0 skipped, 1 partial, 2 full (for reading and
        tests; the kernels read the compressed rows)."""
        columns = ops.arange(self.num_key_blocks, dtype="int32")
        grid = ops.zeros((self.num_query_blocks, self.num_key_blocks), "int32")
        for value, kind in ((2, FULL), (1, PARTIAL)):
            slots = ops.arange(self.num_key_blocks, dtype="int32")[None, :]
            used = ops.less(slots, self.counts[kind][:, None])
            hit = ops.equal(self.indices[kind][:, :, None], columns[None, None, :])
            marked = ops.any(ops.logical_and(hit, used[:, :, None]), axis=1)
            grid = ops.where(marked, value, grid)
        return grid

    def fractions(self):
        """`{"full", "partial", "skipped"}`: the fraction of all tiles of each
        kind (floats; eager only)."""
        total = self.num_query_blocks * self.num_key_blocks
        full = float(ops.convert_to_numpy(ops.sum(self.counts[FULL])))
        partial = float(ops.convert_to_numpy(ops.sum(self.counts[PARTIAL])))
        return {
            "full": full / total,
            "partial": partial / total,
            "skipped": 1.0 - (full + partial) / total,
        }

    def check(self, owner, query_length, key_length, query_block=None, key_block=None):
        """Refuse a plan made for other lengths (or block sizes, when given)."""
        wanted = (query_length, key_length, query_block, key_block)
        made = (self.query_length, self.key_length, self.query_block, self.key_block)
        if any(w is not None and w != m for w, m in zip(wanted, made, strict=True)):
            raise ValueError(
                validation.error(
                    owner,
                    "`tile_plan` was built for (query_length, key_length, "
                    f"query_block, key_block) = {made}. Received: a call with {wanted}",
                )
            )
        return self

    def __repr__(self):
        return (
            f"TilePlan(query_length={self.query_length}, key_length={self.key_length}, "
            f"query_block={self.query_block}, key_block={self.key_block})"
        )


def tile_plan(
    mask,
    query_length,
    key_length=None,
    *,
    block_size=512,
    key_block_size=None,
    batch_size=None,
    num_heads=None,
):
    """The `TilePlan` of `mask` over `query_length x key_length`.

    Args:
        mask: an `AttentionMask`, a `mask_mod(batch, head, q_idx, k_idx)`
            function, or None (every tile full).
        query_length, key_length: static ints (`key_length` defaults to
            `query_length`).
        block_size: queries per tile (the kernel's `block_size`, capped at
            the length as the kernel caps it).
        key_block_size: keys per tile; defaults to `block_size`.
        batch_size, num_heads: needed with a `mask_mod` (it is evaluated for
            every example and head: a tile is full only when it is full in
            all of them).

    Returns:
        A `TilePlan`, of tensors: build it inside the traced step, once per
        batch, and pass it to every layer.
    """
    owner = "tile_plan"
    if mask is None or callable(mask) and not isinstance(mask, attention_masks.AttentionMask):
        mask = attention_masks.AttentionMask(mask_mod=mask)
    if not isinstance(mask, attention_masks.AttentionMask):
        raise TypeError(
            validation.error(
                owner,
                "`mask` must be an AttentionMask, a mask_mod function or None. "
                f"Received: mask={validation.describe(mask)}",
            )
        )
    query_length = checks.positive_int(owner, "query_length", query_length)
    key_length = checks.positive_int(
        owner, "key_length", query_length if key_length is None else key_length
    )
    block_size = checks.positive_int(owner, "block_size", block_size)
    key_block_size = checks.positive_int(
        owner, "key_block_size", block_size if key_block_size is None else key_block_size
    )
    if mask.mask_mod is not None and (batch_size is None or num_heads is None):
        raise ValueError(
            validation.error(
                owner,
                "a `mask_mod` is evaluated for every example and head: pass "
                "`batch_size` and `num_heads`. Received: "
                f"batch_size={batch_size!r}, num_heads={num_heads!r}",
            )
        )
    return build(
        mask,
        query_length,
        key_length,
        min(block_size, query_length),
        min(key_block_size, key_length),
        batch_size,
        num_heads,
    )


def build(mask, q_len, k_len, q_block, k_block, batch_size=None, num_heads=None, examples=None):
    """The plan without argument checks (the kernels' own call); `examples`:
    the `(B,)` global example indices a `mask_mod` sees (default `0..B-1`)."""
    full, seen = _kinds(mask, q_len, k_len, q_block, k_block, batch_size, num_heads, examples)
    return _plan(full, seen, q_len, k_len, q_block, k_block)


def _kinds(mask, q_len, k_len, q_block, k_block, batch_size=None, num_heads=None, examples=None):
    """`(full, seen)` `(nq, nk)` booleans of `mask`'s tiles."""
    nq, nk = -(-q_len // q_block), -(-k_len // k_block)
    rows = _Bounds.of(mask.query_offset, nq, q_block, q_len)
    cols = _Bounds.of(0, nk, k_block, k_len)
    if mask.key_positions is not None:  # each block's smallest and largest
        low, high = attention_masks.block_extremes(mask.key_positions, k_block, nk)
        cols = _Bounds(ops.min(low, axis=0), ops.max(high, axis=0))
    full, seen = _positional(mask, rows, cols)
    for part in (
        _padding(mask, q_len, k_len, q_block, k_block),
        _segments(mask, q_block, nq, k_block, nk),
        _pairs(mask, q_len, k_len, q_block, k_block),
        _mask_mod(mask, rows, q_block, q_len, k_block, k_len, batch_size, num_heads, examples),
    ):
        if part is not None:
            full, seen = _and(full, part[0]), _and(seen, part[1])
    shape = (nq, nk)
    full = ops.broadcast_to(True if full is None else full, shape)
    return full, ops.broadcast_to(True if seen is None else seen, shape)


def _plan(full, seen, q_len, k_len, q_block, k_block, pattern=None):
    """The `TilePlan` of `(nq, nk)` full / seen tables."""
    partial = ops.logical_and(seen, ops.logical_not(full))
    full = ops.logical_and(seen, full)
    full_counts, full_indices = _compressed(full)
    partial_counts, partial_indices = _compressed(partial)
    return TilePlan(
        query_length=q_len,
        key_length=k_len,
        query_block=q_block,
        key_block=k_block,
        full_counts=full_counts,
        full_indices=full_indices,
        partial_counts=partial_counts,
        partial_indices=partial_indices,
        pattern=pattern,
    )


class BlockPattern:
    """Which pairs a block-sparse pattern lets through (BigBird, Longformer):
    every pair of the tiles in `blocks`, every pair of a global row (a query
    that sees every key) and of a global column (a key every query sees).

    Args:
        blocks: `(nq, nk)` boolean, the pattern's tiles.
        rows: `(nq, bq)` boolean, the global query rows, block by block.
        columns: `(nk, bk)` boolean, the global key columns, block by block.
    """

    def __init__(self, blocks, rows, columns):
        self.blocks, self.rows, self.columns = blocks, rows, columns

    def tile(self, i, j):
        """`(1, 1, 1, bq, bk)` boolean: the pairs of tile (i, j) it lets through."""
        inside = _take(_take(self.blocks, i), j)
        rows = _take(self.rows, i)[:, None]
        return ops.logical_or(ops.logical_or(inside, rows), _take(self.columns, j)[None, :])[
            None, None, None
        ]


def from_pattern(
    mask,
    q_len,
    k_len,
    q_block,
    k_block,
    blocks,
    global_rows=(),
    global_columns=(),
    batch_size=None,
    num_heads=None,
):
    """The `TilePlan` of a block-sparse pattern under `mask` (no argument
    checks: `ops.sparse_tile_plan` is the public builder).

    A tile is visited when it is one of the pattern's `blocks` (`(nq, nk)`
    boolean) or holds a global row or
    column (the static positions `global_rows` / `global_columns`), and the
    mask lets some pair of it through (tiles of `q_block` x `k_block`: the
    pattern's block, capped at each length); it is full when the pattern lets
    every pair through (a tile of `blocks`, a block of global rows) and the
    mask's bounds prove every pair visible. The global rows' and columns'
    pairs are evaluated as strips of the mask (`O(L * globals)`, without its
    `mask_mod`: a strip may open a tile the mod closes, which the sweep then
    evaluates), so the tiles they alone open are exact; the pattern's tiles
    are classified from the mask's bounds (`_kinds`; a `mask_mod` evaluated
    for `batch_size` examples and `num_heads` heads). The positional rules
    must be the same in every example (no per-example prefix or key
    positions).
    """
    nq, nk = -(-q_len // q_block), -(-k_len // k_block)
    rows = _flags(global_rows, nq, q_block, q_len)  # (nq, bq)
    columns = _flags(global_columns, nk, k_block, k_len)  # (nk, bk)
    pattern = BlockPattern(blocks, rows, columns)
    full, seen = _kinds(mask, q_len, k_len, q_block, k_block, batch_size, num_heads)
    real_rows = ops.reshape(ops.arange(nq * q_block), (nq, q_block)) < q_len
    every_row = ops.all(ops.logical_or(rows, ops.logical_not(real_rows)), axis=1)
    full = ops.logical_and(full, ops.logical_or(blocks, every_row[:, None]))
    seen = ops.logical_and(seen, blocks)
    rows_index = [r for r in sorted(set(global_rows)) if r < q_len]
    columns_index = [c for c in sorted(set(global_columns)) if c < k_len]
    if rows_index:  # (R, Tk) strip -> its rows' blocks x key blocks
        strip = ops.any(_strip(mask, rows_index, list(range(k_len))), axis=0)
        strip = ops.any(_blocks(strip, k_block, k_len, False), axis=2)  # (R, nk)
        owner = ops.one_hot(ops.convert_to_tensor(rows_index) // q_block, nq, dtype="int32")
        hits = ops.matmul(ops.transpose(owner), ops.cast(strip, "int32"))
        seen = ops.logical_or(seen, hits > 0)
    if columns_index:  # (Tq, G) strip -> query blocks x its columns' blocks
        strip = ops.any(_strip(mask, list(range(q_len)), columns_index), axis=0)
        strip = ops.any(_blocks(ops.transpose(strip), q_block, q_len, False), axis=2)  # (G, nq)
        owner = ops.one_hot(ops.convert_to_tensor(columns_index) // k_block, nk, dtype="int32")
        hits = ops.matmul(ops.transpose(ops.cast(strip, "int32")), owner)
        seen = ops.logical_or(seen, hits > 0)
    return _plan(ops.logical_and(full, seen), seen, q_len, k_len, q_block, k_block, pattern)


def _flags(positions, num_blocks, block, length):
    """`(num_blocks, block)` boolean: which of the positions `< length` are in
    `positions` (a static tuple)."""
    flags = ops.zeros((num_blocks * block,), "bool")
    kept = [p for p in positions if p < length]
    if kept:
        hit = ops.equal(ops.arange(num_blocks * block)[:, None], ops.convert_to_tensor(kept)[None])
        flags = ops.any(hit, axis=1)
    return ops.reshape(flags, (num_blocks, block))


def _strip(mask, rows, cols):
    """`(B|1, R, C)` boolean: whether query `rows[r]` may see key `cols[c]`
    (static indices) under `mask`'s masks, segment ids and positional rules."""
    rows_t = ops.convert_to_tensor(rows, dtype="int32")
    cols_t = ops.convert_to_tensor(cols, dtype="int32")
    allowed = ops.ones((1, len(rows), len(cols)), "bool")
    if mask.query_mask is not None:
        allowed = ops.logical_and(allowed, ops.take(mask.query_mask, rows_t, axis=1)[:, :, None])
    if mask.key_mask is not None:
        allowed = ops.logical_and(allowed, ops.take(mask.key_mask, cols_t, axis=1)[:, None, :])
    if mask.pair_mask is not None:
        pair = ops.take(ops.take(mask.pair_mask[:, 0], rows_t, axis=1), cols_t, axis=2)
        allowed = ops.logical_and(allowed, pair)
    if mask.has_segments:
        query_ids = ops.take(ops.cast(mask.query_segment_ids, "int32"), rows_t, axis=1)
        key_ids = ops.take(ops.cast(mask.key_segment_ids, "int32"), cols_t, axis=1)
        allowed = ops.logical_and(allowed, mask.segments(query_ids[:, :, None], key_ids[:, None]))
    if mask.has_positional:
        positions = mask.query_positions(0, max(rows) + 1)
        allowed = ops.logical_and(
            allowed, mask.positional(ops.take(positions, rows_t), cols_t)[None]
        )
    return allowed


class _Bounds:
    """First and last absolute position of each block's real entries, as
    `(n, 1)` (rows) or `(1, n)` (columns) int32 tensors."""

    def __init__(self, low, high):
        self.low, self.high = low, high

    @classmethod
    def of(cls, offset, num_blocks, block, length):
        starts = ops.arange(num_blocks, dtype="int32") * block
        ends = ops.minimum(starts + block, length) - 1
        if not isinstance(offset, int):
            offset = ops.cast(offset, "int32")
        return cls(offset + starts, offset + ends)

    def rows(self):
        return _Bounds(self.low[:, None], self.high[:, None])

    def columns(self):
        return _Bounds(self.low[None, :], self.high[None, :])


def _and(a, b):
    if a is None:
        return b
    return a if b is None else ops.logical_and(a, b)


def _or(a, b):
    return ops.logical_or(a, b)


def _positional(mask, rows, cols):
    """`(full, seen)` of the positional rules from the blocks' bounds."""
    q, k = rows.rows(), cols.columns()
    full = seen = None
    if mask.causal:
        full, seen = ops.less_equal(k.high, q.low), ops.less_equal(k.low, q.high)
        if mask.prefix_length is not None:
            prefix = mask.prefix_length
            low = high = prefix
            if not isinstance(prefix, int):
                prefix = ops.cast(prefix, "int32")
                low, high = ops.min(prefix), ops.max(prefix)
            full, seen = _or(full, ops.less(k.high, low)), _or(seen, ops.less(k.low, high))
    if mask.sliding_window is not None:
        window = mask.sliding_window
        farthest = ops.maximum(q.high - k.low, k.high - q.low)
        nearest = ops.maximum(ops.maximum(q.low - k.high, k.low - q.high), 0)
        band_full, band_seen = ops.less(farthest, window), ops.less(nearest, window)
        if mask.sink_tokens:
            band_full = _or(band_full, ops.less(k.high, mask.sink_tokens))
            band_seen = _or(band_seen, ops.less(k.low, mask.sink_tokens))
        full, seen = _and(full, band_full), _and(seen, band_seen)
    if mask.key_length is not None:
        length = mask.key_length
        if not isinstance(length, int):
            length = ops.cast(length, "int32")
        full = _and(full, ops.less(k.high, length))
        seen = _and(seen, ops.less(k.low, length))
    return full, seen


def _blocks(values, block, length, pad_value):
    """`(B, T)` -> `(B, n, block)`, padded with `pad_value`."""
    num_blocks = -(-length // block)
    pad = num_blocks * block - length
    if pad:
        values = ops.pad(values, ((0, 0), (0, pad)), constant_values=pad_value)
    return ops.reshape(values, (-1, num_blocks, block))


def _padding(mask, q_len, k_len, q_block, k_block):
    """The query and key masks, and the padding of the last key block (its
    padded keys are masked, so it is never full)."""
    keys = mask.key_mask
    if keys is None and -(-k_len // k_block) * k_block == k_len and mask.query_mask is None:
        return None
    if keys is None:
        keys = ops.ones((1, k_len), "bool")
    key_full = ops.all(_blocks(keys, k_block, k_len, False), axis=(0, 2))[None, :]
    key_seen = ops.any(_blocks(keys, k_block, k_len, False), axis=(0, 2))[None, :]
    if mask.query_mask is None:
        return key_full, key_seen
    queries = mask.query_mask
    query_full = ops.all(_blocks(queries, q_block, q_len, True), axis=(0, 2))[:, None]
    query_seen = ops.any(_blocks(queries, q_block, q_len, False), axis=(0, 2))[:, None]
    return ops.logical_and(query_full, key_full), ops.logical_and(query_seen, key_seen)


def _segments(mask, q_block, nq, k_block, nk):
    """Full where, in every example, the query block and the key block each
    hold one id and it is the same; seen where their id ranges overlap in
    some example."""
    if not mask.has_segments:
        return None
    q_low, q_high = attention_masks.block_extremes(mask.query_segment_ids, q_block, nq)
    k_low, k_high = attention_masks.block_extremes(mask.key_segment_ids, k_block, nk)
    q_low, q_high = q_low[:, :, None], q_high[:, :, None]
    k_low, k_high = k_low[:, None, :], k_high[:, None, :]
    one_id = ops.logical_and(ops.equal(q_low, q_high), ops.equal(k_low, k_high))
    full = ops.all(ops.logical_and(one_id, ops.equal(q_low, k_low)), axis=0)
    overlap = ops.logical_and(ops.greater_equal(k_high, q_low), ops.less_equal(k_low, q_high))
    return full, ops.any(overlap, axis=0)


def _pairs(mask, q_len, k_len, q_block, k_block):
    """An explicit pair mask's block reductions (it exists as a tensor)."""
    if mask.pair_mask is None:
        return None
    pair = ops.broadcast_to(
        mask.pair_mask, (ops.shape(mask.pair_mask)[0], mask.pair_mask.shape[1], q_len, k_len)
    )
    nq, nk = -(-q_len // q_block), -(-k_len // k_block)
    pad_q, pad_k = nq * q_block - q_len, nk * k_block - k_len

    def reduce(reducer, pad_value):
        padded = pair
        if pad_q or pad_k:
            padded = ops.pad(
                pair, ((0, 0), (0, 0), (0, pad_q), (0, pad_k)), constant_values=pad_value
            )
        blocks = ops.reshape(padded, (-1, nq, q_block, nk, k_block))
        return reducer(blocks, axis=(0, 2, 4))

    return reduce(ops.all, True), reduce(ops.any, False)


def _mask_mod(mask, rows, q_block, q_len, k_block, k_len, batch_size, num_heads, examples):
    """A `mask_mod` evaluated one query block at a time over every key:
    `(B, H, bq, Tk)` booleans per step, reduced to the block's row of tiles."""
    if mask.mask_mod is None:
        return None
    nq, nk = -(-q_len // q_block), -(-k_len // k_block)
    if examples is None:
        examples = ops.arange(batch_size or 1, dtype="int32")
    batch = ops.reshape(examples, (-1, 1, 1, 1))
    head = ops.reshape(ops.arange(num_heads or 1, dtype="int32"), (1, -1, 1, 1))
    # Padding positions repeat the last real one (as the kernel's tiles do).
    cols = ops.minimum(ops.arange(nk * k_block, dtype="int32"), k_len - 1)
    if mask.key_positions is not None:
        cols = ops.take(mask.key_columns(k_len), cols, axis=1)[:, None, None, :]
    else:
        cols = ops.reshape(cols, (1, 1, 1, -1))
    last_row = rows.high[-1]

    def step(i, buffers):
        full, seen = buffers
        q_idx = ops.minimum(_take(rows.low, i) + ops.arange(q_block, dtype="int32"), last_row)
        allowed = mask.mask_mod(batch, head, ops.reshape(q_idx, (1, 1, -1, 1)), cols)
        # Broadcast over rows and columns (a mod may ignore either), keeping
        # the example and head axes it uses.
        allowed = ops.logical_and(allowed, ops.ones((1, 1, q_block, nk * k_block), "bool"))
        allowed = ops.reshape(allowed, (-1, q_block, nk, k_block))
        return (
            loops.write_block(full, i, ops.all(allowed, axis=(0, 1, 3))),
            loops.write_block(seen, i, ops.any(allowed, axis=(0, 1, 3))),
        )

    empty = ops.zeros((nq, nk), "bool")
    full, seen = loops.sequential_fori_loop(
        0, nq, step, (loops.block_buffer(empty), loops.block_buffer(empty))
    )
    return loops.stack_blocks(full), loops.stack_blocks(seen)


def _take(x, index):
    return ops.take(x, index, axis=0)


def _compressed(flags):
    """`(counts (nq,), indices (nq, nk))` of a boolean `(nq, nk)` table: each
    row's true columns first, in increasing order."""
    nk = flags.shape[1]
    columns = ops.arange(nk, dtype="int32")[None, :]
    order = ops.argsort(ops.where(flags, columns, columns + nk), axis=1)
    counts = ops.sum(ops.cast(flags, "int32"), axis=1)
    return ops.cast(counts, "int32"), ops.cast(order, "int32")
