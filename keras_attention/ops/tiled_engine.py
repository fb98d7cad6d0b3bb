"""The tiled engine: one forward sweep and one recomputing backward sweep over a plan.

`memory_efficient_attention` (the front end: argument checks) hands its
call to a `TiledSweep`, which holds the call's tiles in the layout the loops
read, `(nq, B, Hkv, G, bq, D)` queries and `(nk, B, Hkv, bk, D)` keys and
values, and sweeps the `TilePlan` (`tiling.py`): for each query block its
full key blocks (no mask evaluated), then its partial ones; under XLA, both
kinds in one loop, each tile masked (`over_plan` says why). The pieces,
each a small method:

- *where a tile is*: `tile_indices` (the mods' int32 indices, absolute
  positions, padding clamped to the last real position), `tile_mask` (the
  `AttentionMask`'s masks cut into blocks once, each tile taking its slice
  and the rules at its positions), `kept` (dropout's keep bits, `dropout.py`);
- *how a tile's logits are formed* (the strategies, chosen once per call by
  `_logits_kind`): `plain` (the running-max softmax, or the fixed shift when
  a query block's logits are bounded: `[q, -shift] . [k, 1]`), `capped`
  (a soft cap alone: bounded by the cap, so the fixed shift always holds),
  `modified` (a `ScoreModifier` between the matmul and the softmax, with
  its own gradient); a causal ALiBi is folded into the matmul as two more
  features (`alibi_queries` / `alibi_keys`) in every strategy;
- *the backward's layout*: `keys_gradient` (under XLA, `(rows^T tile)^T`).

The forward keeps each row's output and log-sum-exp; the backward recomputes
each tile's probabilities from the log-sum-exp (FlashAttention's scheme):
memory linear in the length, forward and backward.
"""

from keras import ops

from keras_attention.ops import dropout
from keras_attention.ops import loops
from keras_attention.ops import masking
from keras_attention.ops import online_softmax
from keras_attention.ops import tiling
from keras_attention.ops.loops import sequential_fori_loop
from keras_attention.ops.loops import to_time_blocks
from keras_attention.ops.xla import under_xla

# TF graph mode only: query blocks run one after the other (their tiles are
# what costs memory); two key steps may overlap so that the next tile's
# matmul starts while the previous tile's softmax finishes. Measured at
# L = 8192 (8 heads, block 1024): peak RSS 1.16 GiB (1, 1), 1.29 (1, 2),
# 1.46 (1, 10), 2.14 (10, 10, the `tf.while_loop` default).
_QUERY_PARALLEL, _KEY_PARALLEL = 1, 2
PLAIN, CAPPED, MODIFIED = "plain", "capped", "modified"


def _take(x, index):
    return ops.take(x, index, axis=0)


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


def _logits_kind(modifier):
    """The strategy for a call's `ScoreModifier` (ALiBi already folded)."""
    if modifier is None or not modifier.changes_logits:
        return PLAIN
    # A soft cap alone (Gemma 2's configuration; with causal ALiBi folded
    # into the matmul too) keeps the fixed-shift step: capped logits are
    # bounded, so the running maximum is not needed, and `1 / c` is folded
    # into the queries, so a tile costs tanh and one multiply more than the
    # plain kernel's exp and sum.
    if (
        modifier.soft_cap is not None
        and modifier.soft_cap <= online_softmax.SOFT_CAP_FIXED_MAX
        and modifier.alibi_slopes is None
        and modifier.score_mod is None
        and modifier.sink_logits is None
    ):
        return CAPPED
    return MODIFIED


class TiledSweep:
    """One call of the tiled engine (see the module docstring).

    Args:
        query, key, value: `(B, T, H|Hkv, D)`, key and value already
            confined (`masking.confine_nonfinite`).
        mask: the `AttentionMask`.
        scale: multiplies the logits.
        q_block, k_block: the tile, at most the lengths.
        modifier: a `ScoreModifier` or None.
        keep: `(dropout_rate, seed, rows)` or None.
        return_statistics: also return each row's log-sum-exp and maximum.
        examples: the `(B,)` int32 global indices of the examples, as the
            rules and mods see them (ring attention's batch shard), or None
            (`0..B-1`).
    """

    def __init__(
        self,
        query,
        key,
        value,
        mask,
        *,
        scale,
        q_block,
        k_block,
        modifier,
        keep,
        stats,
        examples=None,
    ):
        self.mask, self.stats = mask, stats
        self.q_len, self.k_len = query.shape[1], key.shape[1]
        self.num_heads, self.num_kv_heads = query.shape[2], key.shape[2]
        self.groups = self.num_heads // self.num_kv_heads
        self.q_block, self.k_block = q_block, k_block
        self.nq, self.nk = -(-self.q_len // q_block), -(-self.k_len // k_block)
        scaled = ops.cast(query, "float32") * scale
        self.q = _to_query_blocks(scaled, self.nq, q_block, self.num_kv_heads)
        self.k = to_time_blocks(ops.cast(key, "float32"), self.nk, k_block)
        self.v = to_time_blocks(ops.cast(value, "float32"), self.nk, k_block)
        self.batch = ops.shape(self.q)[1]
        if examples is None:
            examples = ops.arange(self.batch, dtype="int32")
        self.examples = ops.reshape(examples, (-1, 1, 1, 1, 1))
        self.head_index = ops.reshape(
            ops.arange(self.num_heads, dtype="int32"), (1, self.num_kv_heads, self.groups, 1, 1)
        )
        self.keep_rows = None
        if keep is not None:
            self._dropout(*keep)
        self._cut_masks()
        self._choose_modifier(modifier)

    # ------------------------------------------------------------ where
    def _dropout(self, rate, seed, rows):
        """Every row's and column's key, once per call; a tile's keep bits
        are one product and one comparison of them (`ops.dropout`)."""
        self.bits = dropout.KeepBits(seed, rate, self.batch, self.num_heads)
        if rows is None:
            rows = ops.arange(self.q_len, dtype="int32")
        rows = ops.pad(ops.cast(rows, "int32"), ((0, self.nq * self.q_block - self.q_len),))
        shape = (-1, self.num_kv_heads, self.groups, self.nq, self.q_block)
        rows = ops.reshape(self.bits.rows(rows), shape)
        self.keep_rows = ops.transpose(rows, (3, 0, 1, 2, 4))[..., None]  # (nq, B, Hkv, G, bq, 1)
        columns = self.bits.columns(ops.arange(self.nk * self.k_block, dtype="int32"))
        self.keep_columns = ops.reshape(columns, (self.nk, self.k_block))
        # The kept weights' 1 / (1 - rate), on the values (autodiff scales dV).
        self.v = self.v * self.bits.scale

    def kept(self, i, j):
        """Tile (i, j)'s `(B, Hkv, G, bq, bk)` keep bits, or None."""
        if self.keep_rows is None:
            return None
        columns = ops.reshape(_take(self.keep_columns, j), (1, 1, 1, 1, self.k_block))
        return self.bits.keep(_take(self.keep_rows, i), columns)

    def _cut_masks(self):
        """The description's masks, cut into blocks once; each tile picks
        its slice."""
        mask, nq, nk, bq, bk = self.mask, self.nq, self.nk, self.q_block, self.k_block
        key_valid = mask.key_mask
        if key_valid is None and nk * bk != self.k_len:
            key_valid = ops.ones((1, self.k_len), dtype="bool")  # hides the padding
        self.key_blocks = None if key_valid is None else _mask_blocks(key_valid, nk, bk, self.k_len)
        self.query_blocks = None
        if mask.query_mask is not None:
            self.query_blocks = _mask_blocks(mask.query_mask, nq, bq, self.q_len)
        self.position_blocks = None  # (nk, B|1, bk) the keys' absolute positions
        if mask.key_positions is not None:
            positions = ops.cast(mask.key_positions, "int32")
            pad = nk * bk - self.k_len  # the padding repeats the last position
            if pad:
                positions = ops.concatenate(
                    [positions, ops.repeat(positions[:, -1:], pad, axis=1)], axis=1
                )
            blocks = ops.reshape(positions, (-1, nk, bk))
            self.position_blocks = ops.transpose(blocks, (1, 0, 2))
        self.segment_blocks = None  # ((nq, B|1, bq), (nk, B|1, bk)) integer ids
        if mask.has_segments:
            self.segment_blocks = (
                _mask_blocks(ops.cast(mask.query_segment_ids, "int32"), nq, bq, self.q_len),
                _mask_blocks(ops.cast(mask.key_segment_ids, "int32"), nk, bk, self.k_len),
            )
        self.pair_blocks, self.pair_heads = None, (1, 1)  # per-head masks split like q
        if mask.pair_mask is not None:
            pair = mask.pair_mask  # (Bm, H|1, Tq|1, Tk|1)
            if mask.per_head:
                self.pair_heads = (self.num_kv_heads, self.groups)
            shape = (ops.shape(pair)[0], pair.shape[1], self.q_len, self.k_len)
            pair = ops.broadcast_to(pair, shape)
            pad = ((0, 0), (0, 0), (0, nq * bq - self.q_len), (0, nk * bk - self.k_len))
            if pad[2][1] or pad[3][1]:
                pair = ops.pad(pair, pad, constant_values=False)
            pair = ops.reshape(pair, (-1,) + self.pair_heads + (nq, bq, nk, bk))
            self.pair_blocks = ops.transpose(pair, (3, 5, 0, 1, 2, 4, 6))  # (nq, nk, Bm, ..)

    def tile_mask(self, i, j, masked=True):
        """`(Bm, Hkv|1, G|1, bq, bk)` boolean mask of tile (i, j), or None
        (a full tile of the plan: `masked` False)."""
        if not masked:
            return None
        allowed = None
        if self.key_blocks is not None:
            allowed = ops.reshape(_take(self.key_blocks, j), (-1, 1, 1, 1, self.k_block))
        if self.query_blocks is not None:
            rows = ops.reshape(_take(self.query_blocks, i), (-1, 1, 1, self.q_block, 1))
            allowed = masking.merge_masks(allowed, rows)
        if self.pair_blocks is not None:
            tile = _take(_take(self.pair_blocks, i), j)
            shape = (-1,) + self.pair_heads + (self.q_block, self.k_block)
            allowed = masking.merge_masks(allowed, ops.reshape(tile, shape))
        if self.segment_blocks is not None:
            query_ids = _take(self.segment_blocks[0], i)
            key_ids = _take(self.segment_blocks[1], j)
            same = self.mask.segments(
                query_ids[:, None, None, :, None], key_ids[:, None, None, None, :]
            )
            allowed = masking.merge_masks(allowed, same)
        if self.mask.has_rules:
            batch, head, rows, cols = self.tile_indices(i, j)
            batch = batch if self.mask.batch_dependent_rules else None
            allowed = masking.merge_masks(allowed, self.mask.rules(batch, head, rows, cols))
        if self.plan.pattern is not None:  # a block-sparse plan's pairs only
            allowed = masking.merge_masks(allowed, self.plan.pattern.tile(i, j))
        return allowed

    def tile_indices(self, i, j):
        """`(batch, head, q_idx, k_idx)` of tile (i, j), broadcastable to it.
        Past the sequence's end (the last tiles' padding, hidden or dropped)
        the last real position is repeated, so a mod's lookups stay in range."""
        batch = self.examples
        rows = self.mask.query_positions(i * self.q_block, self.q_block)
        if self.nq * self.q_block != self.q_len:
            rows = ops.minimum(rows, self.mask.query_positions(self.q_len - 1, 1))
        rows = ops.reshape(rows, (1, 1, 1, -1, 1))
        if self.position_blocks is not None:  # (B|1, 1, 1, 1, bk)
            cols = _take(self.position_blocks, j)[:, None, None, None, :]
            return batch, self.head_index, rows, cols
        cols = j * self.k_block + ops.arange(self.k_block, dtype="int32")
        if self.nk * self.k_block != self.k_len:
            cols = ops.minimum(cols, self.k_len - 1)
        return batch, self.head_index, rows, ops.reshape(cols, (1, 1, 1, 1, -1))

    # ------------------------------------------------------- the logits
    def _choose_modifier(self, modifier):
        """The strategy, the causal ALiBi fold and the kernel's extra inputs
        (the sink logits, then the `score_mod`'s weights: explicit, so that
        the backward returns their gradients)."""
        if modifier is not None and modifier.is_empty:
            modifier = None
        # ALiBi under the causal rule (every visible key at or before its
        # query): `-slope (i - j) = -slope (i - i0) + slope (j - i0)`, with
        # `i0` the query block's first position, is folded into each tile's
        # matmul as two more features, `[q, -slope r, slope] . [k, 1, j - i0]`
        # (`r = i - i0`): no elementwise pass for it, and both terms stay
        # small where the bias is. Otherwise the description adds it per tile.
        self.alibi_slopes = None
        mask = self.mask
        folds = modifier is not None and modifier.alibi_slopes is not None
        folds = folds and mask.key_positions is None  # the fold reads key indices
        if folds and mask.causal and mask.prefix_length is None:
            shape = (self.num_kv_heads, self.groups)
            self.alibi_slopes = ops.reshape(modifier.alibi_slopes, shape)
            modifier = modifier.without_alibi()
            modifier = None if modifier.is_empty else modifier
        self.modifier, self.kind = modifier, _logits_kind(modifier)
        self.sink_inputs = (
            () if modifier is None or modifier.sink_logits is None else (modifier.sinks(),)
        )
        self.score_weights = () if modifier is None else modifier.weights()

    def check_mods(self):
        """A user mod's results are checked once, on the first tile: an error
        raised inside the loops would be reported as the loop's. The unused
        results are pruned by graph and XLA compilers."""
        if self.mask.mask_mod is not None:
            self.mask.rules(*self.tile_indices(0, 0))
        if self.kind == MODIFIED and self.modifier.score_mod is not None:
            tile = (self.batch, self.num_kv_heads, self.groups, self.q_block, self.k_block)
            self.modifier.apply(
                ops.zeros(tile), *self.tile_indices(0, 0), weights=self.score_weights
            )

    def alibi_queries(self, queries):
        """`(nq, B, Hkv, G, bq, D)` queries with the fold's two features."""
        if self.alibi_slopes is None:
            return queries
        rows = ops.arange(self.q_block, dtype="float32")
        slope = self.alibi_slopes[None, None, :, :, None]
        shape = ops.shape(queries)[:-1]
        first, second = ops.broadcast_to(-slope * rows, shape), ops.broadcast_to(slope, shape)
        return ops.concatenate([queries, first[..., None], second[..., None]], axis=-1)

    def alibi_keys(self, k_tile, i, j):
        """Tile (i, j)'s `(B, Hkv, bk, D)` keys with the fold's features."""
        if self.alibi_slopes is None:
            return k_tile
        offset = self.mask.query_offset
        if not isinstance(offset, int):
            offset = ops.cast(offset, "int32")
        columns = j * self.k_block + ops.arange(self.k_block, dtype="int32")
        relative = columns - (offset + i * self.q_block)
        relative = ops.broadcast_to(ops.cast(relative, "float32"), ops.shape(k_tile)[:-1])
        ones = ops.ones_like(relative)
        return ops.concatenate([k_tile, ones[..., None], relative[..., None]], axis=-1)

    def logits(self, q_tile, k_tile, i, j, weights=(), masked=True):
        """Tile (i, j)'s masked logits (the plain and modified strategies)."""
        logits = ops.einsum("bhgqd,bhkd->bhgqk", q_tile, self.alibi_keys(k_tile, i, j))
        if self.kind != PLAIN:  # the capped strategy's too, for exact statistics
            logits = self.modifier.apply(logits, *self.tile_indices(i, j), weights=weights)
        return online_softmax.mask_logits(logits, self.tile_mask(i, j, masked))

    def queries_over_cap(self, q_alibi, i):
        """Query block `i` divided by the cap (a folded ALiBi's features too)."""
        return _take(q_alibi, i) * (1.0 / self.modifier.soft_cap)

    def cap_tanh(self, q_over_cap, k_tile, i, j):
        """`tanh(logits / c)` of tile (i, j) from queries already divided by
        `c` (a folded ALiBi's features included: the cap applies to the
        biased logits)."""
        keys = self.alibi_keys(k_tile, i, j)
        return ops.tanh(ops.einsum("bhgqd,bhkd->bhgqk", q_over_cap, keys))

    def capped_logits(self, q_over_cap, k_tile, i, j, weights=(), masked=True):
        """`c tanh(logits / c)`, masked (`logits` of the capped strategy)."""
        capped = self.modifier.soft_cap * self.cap_tanh(q_over_cap, k_tile, i, j)
        return online_softmax.mask_logits(capped, self.tile_mask(i, j, masked))

    # ------------------------------------------------------- the sweeps
    def over_plan(self, i, step, state):
        """`step(j, state, masked)` folded over the key blocks query block
        `i` visits: the plan's full tiles (no mask evaluated), then its
        partial ones. Under XLA, one loop over both kinds, each tile masked:
        XLA fuses the mask into the tile's exponential, so skipping it saves
        less than a second loop costs (JAX, 4096 tokens: 1.03x the one loop)."""
        if under_xla():
            (_, full_counts, full), (_, partial_counts, partial) = self.plan.kinds()
            both = [
                self._visits(_take(counts, i), _take(indices, i))
                for counts, indices in ((full_counts, full), (partial_counts, partial))
            ]
            count = _take(full_counts, i) + _take(partial_counts, i)
            order = ops.sort(ops.concatenate(both, axis=0))  # the visited blocks first

            def every(t, state):
                return step(_take(order, t), state, True)

            if self.nk == 1:  # visited or not: no loop to compile (ring attention's parts)
                return ops.cond(count > 0, lambda: every(0, state), lambda: state)
            return sequential_fori_loop(0, count, every, state)
        for kind, counts, indices in self.plan.kinds():
            row = _take(indices, i)

            def body(t, state, row=row, masked=kind == tiling.PARTIAL):
                return step(_take(row, t), state, masked)

            state = sequential_fori_loop(
                0, _take(counts, i), body, state, parallel_iterations=_KEY_PARALLEL
            )
        return state

    def _visits(self, count, row):
        """`row` with the slots past `count` moved past every block."""
        used = ops.arange(self.nk, dtype="int32") < count
        return ops.where(used, row, self.nk + ops.arange(self.nk, dtype="int32"))

    def initial_state(self, row_shape, value_dim, sinks):
        """The running softmax before any key: a learned sink is a key with
        logit `sink[h]` and a zero value, so the state starts from it."""
        state = online_softmax.initial_state(row_shape, value_dim)
        if not sinks:
            return state
        sink = ops.reshape(sinks[0], (1, self.num_kv_heads, self.groups, 1))
        return (ops.broadcast_to(sink, row_shape), ops.ones(row_shape, "float32"), state[2])

    def run(self, plan):
        """`(B, Tq, H, Dv)` float32, and the statistics when asked."""
        self.plan = plan
        self.check_mods()
        attend = online_softmax.recomputing_gradient(self.forward, self.backward, closure_free=True)
        out = attend(self.q, self.k, self.v, *self.sink_inputs, *self.score_weights)
        if not self.stats:
            return _from_query_blocks(out, self.q_len), None
        out, lse, peak = out
        lse = ops.where(ops.equal(lse, online_softmax.NO_KEY_LSE), float("-inf"), lse)
        peak = ops.stop_gradient(peak)
        statistics = {"logsumexp": self._by_head(lse), "max": self._by_head(peak)}
        return _from_query_blocks(out, self.q_len), statistics

    def _by_head(self, x):  # (nq, B, Hkv, G, bq) -> (B, H, Tq)
        x = ops.transpose(x, (1, 2, 3, 0, 4))
        return ops.reshape(x, (-1, self.num_heads, self.nq * self.q_block))[:, :, : self.q_len]

    def forward(self, q, k, v, *extra):
        sinks, weights = extra[: len(self.sink_inputs)], extra[len(self.sink_inputs) :]
        row_shape = (ops.shape(q)[1], self.num_kv_heads, self.groups, self.q_block)
        value_dim = v.shape[-1]
        q_alibi = self.alibi_queries(q)
        fixed = None
        # Rows whose logits are bounded (|q| max|k| <= FIXED_SHIFT_MAX) skip
        # the running maximum: the shift is folded into the logits' matmul,
        # [q, -shift] . [k, 1], and each tile costs exp and sum only. A query
        # block takes that path when all its rows qualify (NaN/inf inputs
        # never do). The statistics read the exact running maximum.
        if self.modifier is None and self.alibi_slopes is None and not self.stats:
            shift = online_softmax.logit_bound(q, ops.expand_dims(k, 3), key_axis=(0, 4))
            bounded = ops.reshape(shift <= online_softmax.FIXED_SHIFT_MAX, (self.nq, -1))
            fixed = (
                shift,
                online_softmax.append_column(q, -shift),
                online_softmax.append_column(k, ops.ones_like(k[..., 0])),
                ops.all(bounded, axis=1),
            )

        def query_step(i, buffers):
            state = self._forward_rows(i, q_alibi, k, v, fixed, sinks, weights, row_shape)
            out, lse = online_softmax.finish(state)
            written = (loops.write_block(buffers[0], i, out), loops.write_block(buffers[1], i, lse))
            if self.stats:  # the running maximum, -inf where nothing was seen
                peak = ops.where(ops.not_equal(state[1], 0.0), state[0], float("-inf"))
                written += (loops.write_block(buffers[2], i, peak),)
            return written

        row_buffer = ops.zeros((self.nq,) + row_shape, dtype="float32")
        out_buffer = ops.zeros((self.nq,) + row_shape + (value_dim,), dtype="float32")
        buffers = (loops.block_buffer(out_buffer), loops.block_buffer(row_buffer))
        buffers += (loops.block_buffer(row_buffer),) if self.stats else ()
        results = sequential_fori_loop(
            0, self.nq, query_step, buffers, parallel_iterations=_QUERY_PARALLEL
        )
        out, lse = loops.stack_blocks(results[0]), loops.stack_blocks(results[1])
        if not self.stats:
            return out, (out, lse)
        return (out, lse, loops.stack_blocks(results[2])), (out, lse)

    def _forward_rows(self, i, q_alibi, k, v, fixed, sinks, weights, row_shape):
        """The running softmax state of query block `i` after its key blocks."""
        value_dim = v.shape[-1]

        def key_loop(update, queries, keys, init, logits=self.logits):
            """The key blocks folded into `init` by `update` (the online
            softmax's running-max or fixed-shift step)."""

            def key_step(j, state, masked):
                v_tile, keep = _take(v, j), self.kept(i, j)

                def weighted_sum(probs):
                    # Dropped from `P @ V` only: the running sum `l` counts
                    # every key (the full row's normaliser). A product with
                    # the 0/1 bits, not a `where`: 0.83x the dropout's time
                    # in TF graph mode (8192 tokens).
                    if keep is not None:
                        probs = probs * ops.cast(keep, "float32")
                    return ops.einsum("bhgqk,bhkd->bhgqd", probs, v_tile)

                tile = logits(queries, _take(keys, j), i, j, weights, masked)
                return update(state, tile, weighted_sum)

            return self.over_plan(i, key_step, init)

        if self.kind == CAPPED and not self.stats:  # bounded by the cap: shift 0
            init = online_softmax.fixed_shift_state(ops.zeros(row_shape), value_dim)
            queries = self.queries_over_cap(q_alibi, i)
            return key_loop(
                online_softmax.update_fixed_shift, queries, k, init, logits=self.capped_logits
            )
        if fixed is None:  # changed logits or a sink: no bound holds
            init = self.initial_state(row_shape, value_dim, sinks)
            return key_loop(online_softmax.update, _take(q_alibi, i), k, init)
        shift, q_shift, k_one, bounded = fixed
        return ops.cond(
            _take(bounded, i),
            lambda: key_loop(
                online_softmax.update_fixed_shift,
                _take(q_shift, i),
                k_one,
                online_softmax.fixed_shift_state(_take(shift, i), value_dim),
            ),
            lambda: key_loop(
                online_softmax.update,
                _take(q_alibi, i),
                k,
                online_softmax.initial_state(row_shape, value_dim),
            ),
        )

    def backward(self, inputs, saved, d_out):
        q, k, v = inputs[:3]
        weights = inputs[3 + len(self.sink_inputs) :]
        out, lse = saved
        d_lse = None
        if self.stats:  # (d out, d lse, d max): the maximum has none
            d_out, d_lse = d_out[0], d_out[1]
        delta = online_softmax.output_delta(out, d_out)  # (nq, B, Hkv, G, bq)
        if d_lse is not None:
            # d lse / d logits = P: the row term becomes delta - d lse.
            delta = delta - ops.where(ops.equal(lse, online_softmax.NO_KEY_LSE), 0.0, d_lse)
        # One extra feature folds the row terms into the matmuls:
        # [q, -lse] . [k, 1] = logits - lse and [dO, -delta] . [v, 1] = dP - delta,
        # saving two elementwise passes over every tile.
        q_alibi = self.alibi_queries(q)
        rows = (
            q,
            d_out,
            q_alibi,
            online_softmax.append_column(q_alibi, -lse),
            online_softmax.append_column(d_out, -delta),
            lse,
        )
        columns = (
            k,
            online_softmax.append_column(k, ops.ones_like(k[..., 0])),
            online_softmax.append_column(v, ops.ones_like(v[..., 0])),
        )

        def query_step(i, buffers):
            dq_buffer, dk_buffer, dv_buffer, d_weights = buffers
            dq, dk_buffer, dv_buffer, d_weights = self._backward_rows(
                i, rows, columns, weights, (dk_buffer, dv_buffer, d_weights)
            )
            return loops.write_block(dq_buffer, i, dq), dk_buffer, dv_buffer, d_weights

        initial = tuple(loops.block_buffer(ops.zeros_like(x)) for x in (q, k, v))
        *grads, d_weights = sequential_fori_loop(
            0,
            self.nq,
            query_step,
            initial + (tuple(ops.zeros_like(w) for w in weights),),
            parallel_iterations=_QUERY_PARALLEL,
        )
        grads = tuple(loops.stack_blocks(g) for g in grads)
        if self.sink_inputs:
            # d sink[h] = -sum over rows of p_sink * delta (the sink's value is 0).
            sink = ops.reshape(inputs[3], (1, 1, self.num_kv_heads, self.groups, 1))
            d_sink = -ops.sum(ops.exp(sink - lse) * delta, axis=(0, 1, 4))
            grads += (ops.reshape(d_sink, (self.num_heads,)),)
        return grads + tuple(d_weights)

    def _backward_rows(self, i, rows, columns, weights, state):
        """dQ of query block `i`, and its tiles' dK, dV and weight gradients
        added to `state = (dk_buffer, dv_buffer, d_weights)`."""
        q, d_out, q_alibi, q_lse, d_out_delta, lse = rows
        q_tile, d_out_tile = _take(q, i), _take(d_out, i)
        d_out_delta_tile = _take(d_out_delta, i)
        row_factor = None
        if self.kind == CAPPED:
            # P = exp(c t) * exp(-lse): the row factor (<= exp(c); 0 for a row
            # without keys) joins dO and delta, so a tile takes no pass for
            # `- lse` (dV = exp(c t)^T (r dO), dS = exp(c t) r (dP - delta)).
            row_factor = ops.expand_dims(ops.exp(-_take(lse, i)), -1)
            d_out_tile, d_out_delta_tile = d_out_tile * row_factor, d_out_delta_tile * row_factor
        rows_i = dict(
            q=q_tile,
            alibi=_take(q_alibi, i),
            over_cap=self.queries_over_cap(q_alibi, i) if self.kind == CAPPED else None,
            lse=_take(q_lse, i),
            row_lse=_take(lse, i),
            d_out_delta=d_out_delta_tile,
        )

        def key_step(j, state, masked):
            dq, dk_buffer, dv_buffer, d_weights = state
            probs, d_logits_of, probs_kept = self._tile_probabilities(
                i, j, rows_i, columns, weights, masked
            )
            d_logits, tile_d_weights = d_logits_of(probs)
            d_weights = tuple(a + b for a, b in zip(d_weights, tile_d_weights, strict=True))
            k_tile = _take(columns[0], j)
            dq = dq + ops.einsum("bhgqk,bhkd->bhgqd", d_logits, k_tile)
            dk = loops.read_block(dk_buffer, j) + self.keys_gradient(d_logits, q_tile)
            dv = loops.read_block(dv_buffer, j) + self.keys_gradient(probs_kept, d_out_tile)
            dk_buffer, dv_buffer = (
                loops.write_block(dk_buffer, j, dk),
                loops.write_block(dv_buffer, j, dv),
            )
            return dq, dk_buffer, dv_buffer, d_weights

        dk_buffer, dv_buffer, d_weights = state
        initial = (ops.zeros_like(q_tile), dk_buffer, dv_buffer, d_weights)
        return self.over_plan(i, key_step, initial)

    def _tile_probabilities(self, i, j, rows, columns, weights, masked):
        """Tile (i, j)'s recomputed probabilities, the function from them to
        `(d logits, d weights)`, and the probabilities dropout kept."""
        k, k_one, v_one = columns
        k_tile = _take(k, j)
        allowed = self.tile_mask(i, j, masked)
        capped = applied = raw = None
        if self.kind == CAPPED:  # the derivative below reads tanh(logits / c) again
            capped = self.cap_tanh(rows["over_cap"], k_tile, i, j)
            changed = online_softmax.mask_logits(self.modifier.soft_cap * capped, allowed)
            probs = ops.exp(changed)  # times the row factor, folded into dO
        elif self.kind == MODIFIED:  # the change comes between the matmul and the lse
            raw = ops.einsum("bhgqd,bhkd->bhgqk", rows["alibi"], self.alibi_keys(k_tile, i, j))
            applied = self.modifier.apply(raw, *self.tile_indices(i, j), weights=weights)
            changed = online_softmax.mask_logits(applied, allowed)
            probs = ops.exp(changed - ops.expand_dims(rows["row_lse"], -1))
        elif self.alibi_slopes is None:
            probs = ops.exp(
                online_softmax.mask_logits(
                    ops.einsum("bhgqd,bhkd->bhgqk", rows["lse"], _take(k_one, j)), allowed
                )
            )
        else:  # [q, -slope r, slope, -lse] . [k, 1, j - i0, 1]
            keys = self.alibi_keys(k_tile, i, j)
            keys = online_softmax.append_column(keys, ops.ones_like(keys[..., 0]))
            logits = ops.einsum("bhgqd,bhkd->bhgqk", rows["lse"], keys)
            probs = ops.exp(online_softmax.mask_logits(logits, allowed))
        # dP - delta ([dO, -delta] . [v, 1]; v carries 1 / (1 - rate)).
        d_out_delta = rows["d_out_delta"]
        d_probs = ops.einsum("bhgqd,bhkd->bhgqk", d_out_delta, _take(v_one, j))
        probs_kept, keep = probs, self.kept(i, j)
        if keep is not None:  # D dP - delta: -delta where dropped
            d_probs = ops.where(keep, d_probs, d_out_delta[..., -1:])
            probs_kept = probs * ops.cast(keep, "float32")

        def d_logits_of(probs):
            d_logits = probs * d_probs
            if capped is not None:  # d c tanh(x / c) / dx = 1 - tanh(x / c)^2
                return d_logits * (1.0 - capped * capped), ()
            if applied is not None:
                indices = self.tile_indices(i, j)
                return self.modifier.gradient(
                    raw, *indices, d_logits, weights=weights, applied=applied
                )
            return d_logits, ()

        return probs, d_logits_of, probs_kept

    def keys_gradient(self, tile, rows):
        """`tile^T rows` summed over the groups: a tile's `dK` (from `dS`) or
        `dV` (from `P`). Under XLA the product is formed as
        `(rows^T tile)^T`: XLA:CPU lays a dot's operands out with the
        contracted axis where its GEMM wants it, and contracting the tile's
        query axis as the left operand copied the whole `(bq, bk)` tile
        transposed, in a fusion that recomputed `dS` from its inputs (3 reads
        with a soft cap's derivative, 2 without). Transposing the `(D, bk)`
        result instead: the same sums, 0.90x the plain kernel's time and a
        soft cap 1.08-1.09x over it instead of 1.66x / 1.41x (TF XLA / JAX,
        8192 tokens, benchmarks/RESULTS.md). TensorFlow's graph path is left
        as it was (no difference there)."""
        if under_xla():
            return ops.swapaxes(ops.einsum("bhgqd,bhgqk->bhdk", rows, tile), -1, -2)
        return ops.einsum("bhgqk,bhgqd->bhkd", tile, rows)
