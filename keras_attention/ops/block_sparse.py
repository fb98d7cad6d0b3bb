"""Block-sparse softmax attention (BigBird and Longformer patterns).

The sequence is cut into blocks of `block_size` tokens. Query block `i`
attends to a few key blocks chosen by a *plan*:

- a sliding window of `window_blocks` blocks around block `i` (only blocks
  `i - window_blocks + 1 ... i` in the causal variant),
- the first `global_blocks` blocks (global keys), and
- `random_blocks` random blocks drawn from a stored integer plan.

Queries in the first `global_blocks` blocks are global too: they attend to
every key. Longformer-style `global_tokens` (token positions) are global in
both directions: every query attends to them and they attend to every key.

Keys are gathered block by block and each query block does one small dense
matmul against its `S * block_size` gathered keys, so time and memory grow
linearly in the sequence length; no `L x L` matrix is formed unless the
dense weights are asked for. A key block that appears twice in a query
block's plan (a random block falling inside the window, say) is counted once.

All masks are boolean, `True` = may attend. Masked keys get weight exactly
zero; a query with no visible key gets zero weights and a zero output.
"""

import math

from keras import ops

from keras_attention import validation
from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import checks
from keras_attention.ops import dense_attention
from keras_attention.ops import dropout as dropouts
from keras_attention.ops import loops
from keras_attention.ops import masking
from keras_attention.ops import memory_efficient
from keras_attention.ops import online_softmax
from keras_attention.ops import tiling
from keras_attention.ops.score_modifier import ScoreModifier


def _length(x, axis):
    """The static length of `x` along `axis` if known, else a scalar tensor."""
    static = x.shape[axis]
    return static if static is not None else ops.shape(x)[axis]


def _ceil_div(a, b):
    if isinstance(a, int):
        return -(-a // b)
    return (a + b - 1) // b


def window_offsets(window_blocks, causal):
    """Block offsets of the sliding window, e.g. `(-1, 0, 1)` for 3 blocks.

    With an even count the extra block is on the left; the causal window
    looks only backwards: `(-window_blocks + 1, ..., 0)`.
    """
    if causal:
        return tuple(range(-window_blocks + 1, 1))
    left = window_blocks // 2
    right = window_blocks - 1 - left
    return tuple(range(-left, right + 1))


def covers_every_key(
    num_query_blocks, num_key_blocks, *, window_blocks, global_blocks=0, causal=False
):
    """Whether the window and global blocks alone let every query block see
    every key block it may (every earlier one, when causal).

    Then the sparse pattern is no restriction at all (random blocks and
    global tokens only add keys already seen) and exact attention is the same
    answer. Python ints only: with an unknown length the answer is `False`.
    """
    if not (isinstance(num_query_blocks, int) and isinstance(num_key_blocks, int)):
        return False
    offsets = window_offsets(window_blocks, causal)
    for row in range(num_query_blocks):
        if row < global_blocks:
            continue  # a global query block attends to everything
        needed = range(min(row + 1, num_key_blocks) if causal else num_key_blocks)
        seen = {row + offset for offset in offsets} | set(range(global_blocks))
        if not seen.issuperset(needed):
            return False
    return True


def block_plan(
    num_query_blocks,
    num_key_blocks,
    *,
    window_blocks,
    global_blocks=0,
    random_plan=None,
    causal=False,
):
    """Which key blocks each query block attends to.

    Args:
        num_query_blocks, num_key_blocks: ints or scalar tensors.
        window_blocks: size of the sliding window in blocks.
        global_blocks: the first `global_blocks` key blocks are visible to
            every query block.
        random_plan: integer tensor `(P, random_blocks)` of non-negative
            draws, or `None`. Query block `i` uses row `i mod P`; a draw `u`
            selects key block `u mod n`, where `n` is the number of key
            blocks (`min(i + 1, n)` in the causal variant, so random blocks
            lie in the past).
        causal: whether the window looks only backwards.

    Returns:
        `(block_index, block_valid)`, both `(num_query_blocks, S)`: int32 key
        block indices (clipped into range) and a boolean that is `False` for
        slots out of range or repeating an earlier slot of the same row.
    """
    owner = "block_plan"
    num_query_blocks = checks.length(owner, "num_query_blocks", num_query_blocks)
    num_key_blocks = checks.length(owner, "num_key_blocks", num_key_blocks)
    window_blocks = checks.non_negative_int(owner, "window_blocks", window_blocks)
    global_blocks = checks.non_negative_int(owner, "global_blocks", global_blocks)
    checks.tensor(owner, "random_plan", random_plan, rank=2, allow_none=True)
    if random_plan is not None and "int" not in str(random_plan.dtype):
        raise TypeError(
            f"{owner}: `random_plan` must hold integers. Received: random_plan with "
            f"dtype {random_plan.dtype}"
        )
    causal = checks.flag(owner, "causal", causal)
    rows = ops.arange(num_query_blocks, dtype="int32")[:, None]  # (nq, 1)
    slots = [rows + offset for offset in window_offsets(window_blocks, causal)]
    slots += [ops.zeros_like(rows) + g for g in range(global_blocks)]
    if random_plan is not None and random_plan.shape[-1]:
        plan = ops.cast(random_plan, "int32")
        plan_rows = ops.shape(plan)[0]
        draws = ops.take(plan, ops.mod(rows[:, 0], plan_rows), axis=0)  # (nq, r)
        limit = ops.full_like(rows, num_key_blocks)
        if causal:
            limit = ops.minimum(limit, rows + 1)
        slots.append(ops.mod(draws, ops.maximum(limit, 1)))
    index = ops.concatenate(slots, axis=1)  # (nq, S)
    in_range = ops.logical_and(ops.greater_equal(index, 0), ops.less(index, num_key_blocks))
    # Slot t repeats slot s < t of the same row: counting it twice would
    # give that key block double weight in the softmax.
    num_slots = index.shape[1]
    same = ops.logical_and(
        ops.equal(index[:, :, None], index[:, None, :]),
        in_range[:, None, :],
    )  # (nq, S, S): slot s equals an in-range slot t
    earlier = ops.less(
        ops.arange(num_slots)[None, :], ops.arange(num_slots)[:, None]
    )  # (S, S): t < s
    repeated = ops.any(ops.logical_and(same, earlier[None]), axis=2)
    valid = ops.logical_and(in_range, ops.logical_not(repeated))
    index = ops.clip(index, 0, ops.maximum(num_key_blocks - 1, 0))
    return index, valid


def sparse_tile_plan(
    mask,
    query_length,
    key_length=None,
    *,
    block_size,
    window_blocks,
    global_blocks=0,
    random_plan=None,
    global_tokens=None,
):
    """The `TilePlan` of the block-sparse pattern under `mask`.

    Query block `i` visits the key blocks of `block_plan` (the window, the
    global blocks, its random blocks; backwards when `mask` is causal), the
    key blocks holding a global token, and every key block when it holds a
    global query row (the first `global_blocks` blocks, the global tokens).
    Each visited tile is *full* when the pattern lets every pair through and
    `mask` (causal, window, key mask, padding, segment ids) provably hides
    none, else *partial*; a tile `mask` hides entirely is skipped.

    The plan carries the pattern (`TilePlan.pattern`): the blockwise kernel
    given it (`memory_efficient_attention(..., tile_plan=plan)`) computes
    block-sparse attention, as `block_sparse_attention` does.

    Args:
        mask: an `AttentionMask` (or None) whose rules are the same in every
            head: no `mask_mod`, prefix length, per-head mask or key
            positions.
        query_length, key_length: static ints (`key_length` defaults to
            `query_length`).
        block_size, window_blocks, global_blocks, random_plan, global_tokens:
            the pattern, as `block_sparse_attention` takes it.

    Returns:
        A `TilePlan` with query and key blocks of `block_size`.
    """
    owner = "sparse_tile_plan"
    mask = attention_masks.AttentionMask() if mask is None else mask
    if not isinstance(mask, attention_masks.AttentionMask):
        raise TypeError(
            f"{owner}: `mask` must be an AttentionMask or None. Received: mask={mask!r}"
        )
    if (
        mask.mask_mod is not None
        or mask.prefix_length is not None
        or mask.per_head
        or mask.key_positions is not None
    ):
        raise ValueError(
            f"{owner}: the pattern's plan takes rules that are the same in every example "
            "and head. Received: an AttentionMask with a mask_mod, prefix length, "
            "per-head mask or key positions"
        )
    query_length = checks.positive_int(owner, "query_length", query_length)
    key_length = checks.positive_int(
        owner, "key_length", query_length if key_length is None else key_length
    )
    block_size = checks.positive_int(owner, "block_size", block_size)
    window_blocks = checks.non_negative_int(owner, "window_blocks", window_blocks)
    global_blocks = checks.non_negative_int(owner, "global_blocks", global_blocks)
    checks.tensor(owner, "random_plan", random_plan, rank=2, allow_none=True)
    tokens = _checked_tokens(owner, global_tokens)
    return _pattern_plan(
        mask,
        query_length,
        key_length,
        block_size,
        window_blocks,
        global_blocks,
        random_plan,
        tokens,
    )


def _checked_tokens(owner, global_tokens):
    if global_tokens is not None and (
        not isinstance(global_tokens, (list, tuple))
        or not all(validation.is_int(t) and t >= 0 for t in global_tokens)
    ):
        raise ValueError(
            f"{owner}: `global_tokens` must be a tuple of non-negative token positions "
            f"or None. Received: global_tokens={global_tokens!r}"
        )
    return tuple(sorted(set(global_tokens or ())))


def _pattern_plan(
    mask, q_len, k_len, block_size, window_blocks, global_blocks, random_plan, tokens
):
    """`sparse_tile_plan` without the checks of its lengths and tokens."""
    nq, nk = -(-q_len // block_size), -(-k_len // block_size)
    index, valid = block_plan(
        nq,
        nk,
        window_blocks=window_blocks,
        global_blocks=global_blocks,
        random_plan=random_plan,
        causal=mask.causal,
    )
    # (nq, S) slots -> (nq, nk) table of the pattern's tiles.
    hits = ops.logical_and(ops.one_hot(index, nk, dtype="bool"), valid[:, :, None])
    rows = tuple(range(min(global_blocks * block_size, q_len))) + tokens
    q_block, k_block = min(block_size, q_len), min(block_size, k_len)  # nq, nk unchanged
    blocks = ops.any(hits, axis=1)
    return tiling.from_pattern(mask, q_len, k_len, q_block, k_block, blocks, rows, tokens)


def _pad_time(x, length, axis=1, value=0):
    """Pads `x` with `value` along `axis` up to `length`."""
    pad = length - _length(x, axis)
    widths = [[0, 0] for _ in range(len(x.shape))]
    widths[axis] = [0, pad]
    return ops.pad(x, widths, constant_values=value)


def _block_indices(batch, heads, row_positions, key_positions, query_length, key_length):
    """`(batch, head, q_idx, k_idx)` of `n` query blocks' logits, in the
    kernels' 4-D contract (`ops.mods`): `row_positions` `(n, bs)` are the
    rows' absolute positions (`q_idx` `(1, 1, n * bs, 1)`); `key_positions`
    are the positions of the keys each block gathered, `(n, K)` (`k_idx`
    `(1, 1, n * bs, K)`), or `(K,)` when every row sees the same keys
    (`(1, 1, 1, K)`). Past the end (padding) the last real position is
    repeated, so a `score_mod`'s lookups stay in range."""
    batch = ops.reshape(ops.arange(batch, dtype="int32"), (-1, 1, 1, 1))
    head = ops.reshape(ops.arange(heads, dtype="int32"), (1, -1, 1, 1))
    rows = ops.minimum(ops.reshape(row_positions, (1, 1, -1, 1)), query_length - 1)
    if len(key_positions.shape) == 1:
        cols = ops.reshape(key_positions, (1, 1, 1, -1))
    else:  # each block's keys, once per row of the block
        cols = ops.repeat(key_positions, row_positions.shape[-1], axis=0)
        cols = ops.reshape(cols, (1, 1, -1, key_positions.shape[-1]))
    cols = ops.minimum(cols, key_length - 1)
    return batch, head, ops.cast(rows, "int32"), ops.cast(cols, "int32")


def _as_rows(x):
    """`(B, H, n, bs, K)` -> `(B, H, n * bs, K)`: the 4-D logits of the
    `ScoreModifier` contract."""
    shape = ops.shape(x)
    return ops.reshape(x, (shape[0], shape[1], shape[2] * shape[3], shape[4]))


def _modified(modifier, logits, indices, weights=None):
    """`(B, H, n, bs, K)` logits of `n` query blocks changed by the
    `ScoreModifier` `modifier` at `_block_indices`' `indices`."""
    return ops.reshape(
        modifier.apply(_as_rows(logits), *indices, weights=weights), ops.shape(logits)
    )


def _modified_gradient(modifier, logits, indices, d_modified, weights, applied):
    """`(d logits, d weights)` of `_modified`, for a hand-written backward."""
    d_logits, d_weights = modifier.gradient(
        _as_rows(logits),
        *indices,
        _as_rows(d_modified),
        weights=weights,
        applied=_as_rows(applied),
    )
    return ops.reshape(d_logits, ops.shape(logits)), d_weights


def _block_softmax(logits, allowed, sinks):
    """The masked softmax of `(B, H, n, bs, K)` logits, with the sink logits
    `(H,)` (or None) in each row's denominator: the keys' weights."""
    if sinks is None:
        return online_softmax.masked_softmax(logits, allowed)
    shape = ops.shape(logits)
    allowed = ops.broadcast_to(allowed, tuple(ops.shape(allowed)[:2]) + tuple(shape[2:]))
    weights = dense_attention.softmax_with_sinks(_as_rows(logits), _as_rows(allowed), sinks)
    return ops.reshape(weights, shape)


def _at_rows(modifier, positions):
    """`modifier` for a kernel whose query row `r` is at absolute position
    `positions[r]` (the global rows, attended as rows `0 .. R - 1` by the
    blockwise kernel): its changes run inside one `score_mod` that reads
    the rows' real positions; the sinks and weights are the same."""
    if modifier is None or not modifier.changes_logits:
        return modifier

    def at_positions(score, batch, head, q_idx, k_idx, *weights):
        rows = ops.take(positions, q_idx)
        return modifier.apply(score, batch, head, rows, k_idx, weights=weights)

    return ScoreModifier(
        sink_logits=modifier.sink_logits,
        score_mod=at_positions,
        score_mod_weights=modifier.score_mod_weights,
    )


# Query rows per chunk of the recomputing kernel (rounded to whole blocks).
DEFAULT_CHUNK_ROWS = 1024


def _recomputed_block_rows(
    q,
    k,
    v,
    index,
    slot_valid,
    key_valid,
    *,
    block_size,
    chunk_blocks,
    rules,
    token_k=None,
    token_v=None,
    token_mask=None,
    query_segments=None,
    key_segments=None,
    keep_bits=None,
    token_positions=None,
    modifier=None,
    query_length=None,
    key_length=None,
):
    """Block rows of block-sparse attention in memory linear in the length.

    The query blocks are processed `chunk_blocks` at a time in a
    `fori_loop`; each chunk gathers its key blocks, forms its scores and
    softmax, and keeps only its output and the per-row log-sum-exp. The
    gradient is custom: the backward recomputes each chunk's probabilities
    from the stored log-sum-exp (as `memory_efficient_attention` does for
    exact attention), accumulates `dQ` per chunk and scatter-adds the
    gathered blocks' `dK`, `dV` with a segment sum. So neither the gathered
    `(L, S * block_size, D)` keys and values nor the `(L, S * block_size)`
    scores are ever held for the whole sequence.

    Args:
        q: float32 `(B, H, Tqp, D)`, already scaled, `Tqp = nq * block_size`.
        k, v: float32 `(B, H, Tkp, D)` / `(B, H, Tkp, Dv)`.
        index, slot_valid: the `(nq, S)` plan of `block_plan`.
        key_valid: boolean `(B or 1, Tkp)`.
        chunk_blocks: query blocks per chunk (need not divide `nq`).
        rules: the `AttentionMask` of the positional rules (causal), applied
            to the gathered keys at their absolute positions.
        token_k, token_v, token_mask: Longformer global tokens as extra keys
            of every row: `(B, H, G, D)`, `(B, H, G, Dv)` and boolean
            `(B or 1, nq, 1 or block_size, G)`; or all `None`.
        query_segments, key_segments: int32 `(B, Tqp)` / `(B, Tkp)` document
            ids (a query sees the gathered keys of its own document), or
            `None`.
        keep_bits: an `ops.dropout.KeepBits` (dropout in training), or None:
            each chunk's keep bits, at the absolute positions of its rows and
            gathered keys (`token_positions` for the global tokens), are
            computed in the forward and again in the backward; they act on
            `P @ V` only, and `v`, `token_v` carry `1 / (1 - rate)`.
        modifier: a `ScoreModifier` (or None): each chunk's logits are
            changed at the absolute positions of its rows and gathered keys
            (`query_length`, `key_length`: the real lengths), in the forward
            and again in the backward, which returns the gradients of the
            sink logits (a key with logit `sink[h]` and a zero value that
            starts every row's softmax) and of the `score_mod`'s weights.

    Returns:
        float32 `(B, H, Tqp, Dv)`. Rows with no visible key are zero.
    """
    heads, head_dim, value_dim = q.shape[1], q.shape[-1], v.shape[-1]
    nq, num_slots = index.shape
    nk = k.shape[2] // block_size
    bs = block_size
    chunk_blocks = max(1, min(chunk_blocks, nq))
    num_chunks = -(-nq // chunk_blocks)
    padded_blocks = num_chunks * chunk_blocks
    extra = padded_blocks - nq
    keys_per_row = num_slots * bs
    has_tokens = token_k is not None
    modify = modifier is not None and modifier.changes_logits
    # The kernel's inputs after the tokens: the sink logits, then the
    # `score_mod`'s weights (explicit, so the backward returns their gradients).
    sink_inputs = () if modifier is None or modifier.sink_logits is None else (modifier.sinks(),)
    score_weights = () if modifier is None else modifier.weights()

    # Chunk-major layouts, so each chunk is one `take` along axis 0.
    if extra:
        q = ops.pad(q, ((0, 0), (0, 0), (0, extra * bs), (0, 0)))
        index = ops.pad(index, ((0, extra), (0, 0)))
        slot_valid = ops.pad(slot_valid, ((0, extra), (0, 0)), constant_values=False)
    q = ops.reshape(q, (-1, heads, num_chunks, chunk_blocks, bs, head_dim))
    q = ops.transpose(q, (2, 0, 1, 3, 4, 5))  # (nc, B, H, C, bs, D)
    index = ops.reshape(index, (num_chunks, chunk_blocks * num_slots))
    slot_valid = ops.reshape(slot_valid, (num_chunks, chunk_blocks, num_slots))
    key_valid_blocks = ops.reshape(key_valid, (-1, nk, bs))  # (Bm, nk, bs)
    if has_tokens:
        if extra:
            token_mask = ops.pad(
                token_mask,
                ((0, 0), (0, extra), (0, 0), (0, 0)),
                constant_values=False,
            )
        token_mask = ops.reshape(
            token_mask,
            (-1, num_chunks, chunk_blocks) + tuple(token_mask.shape[2:]),
        )
        token_mask = ops.transpose(token_mask, (1, 0, 2, 3, 4))
        # (nc, Bm, C, 1 or bs, G)
    block_offsets = ops.arange(bs, dtype="int32")
    if keep_bits is not None:
        # Every row's and key's dropout key once; a chunk takes its slices.
        keep_rows = keep_bits.rows(ops.arange(padded_blocks * bs, dtype="int32"))
        keep_rows = ops.reshape(keep_rows, (-1, heads, num_chunks, chunk_blocks, bs))
        keep_rows = ops.transpose(keep_rows, (2, 0, 1, 3, 4))[..., None]  # (nc, B, H, C, bs, 1)
        keep_columns = ops.reshape(keep_bits.columns(ops.arange(nk * bs, dtype="int32")), (nk, bs))
        if has_tokens:
            token_columns = keep_bits.columns(token_positions)  # (G,)
    if query_segments is not None:
        if extra:
            query_segments = ops.pad(query_segments, ((0, 0), (0, extra * bs)))
        query_segments = ops.reshape(query_segments, (-1, num_chunks, chunk_blocks, bs))
        key_segment_blocks = ops.reshape(key_segments, (-1, nk, bs))

    def chunk_mask(c, chunk_index):
        """`(Bm, 1, C, 1 or bs, S * bs)` boolean mask of chunk `c`."""
        slots = ops.repeat(ops.take(slot_valid, c, axis=0), bs, axis=1)
        keys = ops.take(key_valid_blocks, chunk_index, axis=1)
        keys = ops.reshape(keys, (-1, chunk_blocks, keys_per_row))
        mask = ops.logical_and(slots[None], keys)[:, :, None, :]
        if rules.has_positional:
            key_positions = ops.reshape(
                chunk_index[:, None] * bs + block_offsets,
                (chunk_blocks, keys_per_row),
            )
            first = (c * chunk_blocks + ops.arange(chunk_blocks, dtype="int32")) * bs
            query_positions = first[:, None] + block_offsets  # (C, bs)
            mask = ops.logical_and(
                mask,
                rules.allows(query_positions[:, :, None], key_positions[:, None, :])[None],
            )
        if query_segments is not None:
            chunk_queries = ops.take(query_segments, c, axis=1)  # (B, C, bs)
            chunk_keys = ops.reshape(
                ops.take(key_segment_blocks, chunk_index, axis=1), (-1, chunk_blocks, keys_per_row)
            )
            mask = ops.logical_and(
                mask, ops.equal(chunk_queries[:, :, :, None], chunk_keys[:, :, None, :])
            )
        return mask[:, None]

    def chunk_keep(c, chunk_index):
        """`(0/1 keep of the gathered keys (B, H, C, bs, S * bs), of the
        tokens (B, H, C, bs, G) or None)` of chunk `c`, float32, or
        `(None, None)`."""
        if keep_bits is None:
            return None, None
        rows = ops.take(keep_rows, c, axis=0)
        columns = ops.reshape(
            ops.take(keep_columns, chunk_index, axis=0), (1, 1, chunk_blocks, 1, keys_per_row)
        )
        tokens = keep_bits.keep(rows, token_columns) if has_tokens else None
        as_float = lambda keep: None if keep is None else ops.cast(keep, "float32")  # noqa: E731
        return as_float(keep_bits.keep(rows, columns)), as_float(tokens)

    def dropped(probs, keep):
        # A product with the 0/1 bits: cheaper than a `where` in TF graphs.
        return probs if keep is None else probs * keep

    def gather(x_blocks, chunk_index):
        # (B, H, nk, bs, d) -> (B, H, C, S * bs, d)
        picked = ops.take(x_blocks, chunk_index, axis=2)
        return ops.reshape(picked, (-1, heads, chunk_blocks, keys_per_row, picked.shape[-1]))

    def chunk_indices(c, chunk_index):
        """The `ScoreModifier`'s indices of chunk `c`'s gathered keys and of
        its global tokens (`_block_indices`)."""
        first = (c * chunk_blocks + ops.arange(chunk_blocks, dtype="int32")) * bs
        rows = first[:, None] + block_offsets  # (C, bs)
        keys = ops.reshape(chunk_index[:, None] * bs + block_offsets, (chunk_blocks, keys_per_row))
        batch = ops.shape(q)[1]
        gathered = _block_indices(batch, heads, rows, keys, query_length, key_length)
        if not has_tokens:
            return gathered, None
        tokens = _block_indices(batch, heads, rows, token_positions, query_length, key_length)
        return gathered, tokens

    def scores_of(c, q_chunk, k_blocks, token_k, weights):
        """Chunk `c`'s gathered keys and masked logits (of the keys, of the
        tokens), and `(raw, changed)` logits of each with their indices."""
        chunk_index = ops.take(index, c, axis=0)
        k_chunk = gather(k_blocks, chunk_index)
        raw = ops.einsum("bhiqd,bhikd->bhiqk", q_chunk, k_chunk)
        indices = chunk_indices(c, chunk_index) if modify else (None, None)
        changed = _modified(modifier, raw, indices[0], weights) if modify else raw
        logits = online_softmax.mask_logits(changed, chunk_mask(c, chunk_index))
        token_logits = token_raw = token_changed = None
        if has_tokens:
            t_mask = ops.take(token_mask, c, axis=0)[:, None]  # (Bm, 1, C, ., G)
            token_raw = ops.einsum("bhiqd,bhgd->bhiqg", q_chunk, token_k)
            token_changed = token_raw
            if modify:
                token_changed = _modified(modifier, token_raw, indices[1], weights)
            token_logits = online_softmax.mask_logits(token_changed, t_mask)
        parts = ((raw, changed, indices[0]), (token_raw, token_changed, indices[1]))
        return chunk_index, k_chunk, logits, token_logits, parts

    def initial_state(row_shape, sinks):
        """The running softmax before any key: a learned sink is a key with
        logit `sink[h]` and a zero value, so the state starts from it."""
        state = online_softmax.initial_state(row_shape, value_dim)
        if not sinks:
            return state
        sink = ops.broadcast_to(ops.reshape(sinks[0], (1, heads, 1, 1)), row_shape)
        return (sink, ops.ones(row_shape, "float32"), state[2])

    def forward(q, k_blocks, v_blocks, token_k, token_v, *extra):
        sinks, weights = extra[: len(sink_inputs)], extra[len(sink_inputs) :]

        def step(c, buffers):
            out_buffer, lse_buffer = buffers
            q_chunk = ops.take(q, c, axis=0)
            chunk_index, _, scores, token_scores, _ = scores_of(
                c, q_chunk, k_blocks, token_k, weights
            )
            v_chunk = gather(v_blocks, chunk_index)
            keep, token_keep = chunk_keep(c, chunk_index)
            # The gathered blocks, then the global tokens: two blocks of keys
            # of one online softmax (dropout acts on P @ V, not on the sum).
            state = online_softmax.update(
                initial_state(rows, sinks),
                scores,
                lambda probs: ops.einsum("bhiqk,bhikd->bhiqd", dropped(probs, keep), v_chunk),
            )
            if has_tokens:
                state = online_softmax.update(
                    state,
                    token_scores,
                    lambda probs: ops.einsum(
                        "bhiqg,bhgd->bhiqd", dropped(probs, token_keep), token_v
                    ),
                )
            out, lse = online_softmax.finish(state)
            return (loops.write_block(out_buffer, c, out), loops.write_block(lse_buffer, c, lse))

        rows = (ops.shape(q)[1], heads, chunk_blocks, bs)
        out, lse = loops.sequential_fori_loop(
            0,
            num_chunks,
            step,
            (
                loops.block_buffer(ops.zeros((num_chunks,) + rows + (value_dim,), dtype="float32")),
                loops.block_buffer(ops.zeros((num_chunks,) + rows, dtype="float32")),
            ),
        )
        out, lse = loops.stack_blocks(out), loops.stack_blocks(lse)
        return out, (out, lse)

    def backward(inputs, saved, d_out):
        q, k_blocks, v_blocks, token_k, token_v = inputs[:5]
        weights = inputs[5 + len(sink_inputs) :]
        out, lse = saved
        delta = online_softmax.output_delta(out, d_out)  # (nc, B, H, C, bs)

        def unmodified(d_changed, part, d_weights):
            """The gradient w.r.t. the raw logits of `part` (`(raw, changed,
            indices)`), and the weights' gradients summed in."""
            if not modify:
                return d_changed, d_weights
            raw, changed, indices = part
            d_raw, part_d_weights = _modified_gradient(
                modifier, raw, indices, d_changed, weights, changed
            )
            return d_raw, tuple(a + b for a, b in zip(d_weights, part_d_weights, strict=True))

        def step(c, state):
            dq_buffer, dk_blocks, dv_blocks, dtoken_k, dtoken_v, d_weights = state
            q_chunk = ops.take(q, c, axis=0)
            d_out_chunk = ops.take(d_out, c, axis=0)
            chunk_lse = ops.take(lse, c, axis=0)
            chunk_delta = ops.take(delta, c, axis=0)
            chunk_index, k_chunk, scores, token_scores, parts = scores_of(
                c, q_chunk, k_blocks, token_k, weights
            )
            probs = online_softmax.probabilities(scores, chunk_lse)
            keep, token_keep = chunk_keep(c, chunk_index)
            # D dP (v carries 1 / (1 - rate)); delta = rowsum(dO O) = sum P D dP.
            d_probs = ops.einsum("bhiqd,bhikd->bhiqk", d_out_chunk, gather(v_blocks, chunk_index))
            d_scores = online_softmax.logits_gradient(probs, dropped(d_probs, keep), chunk_delta)
            d_scores, d_weights = unmodified(d_scores, parts[0], d_weights)
            dq = ops.einsum("bhiqk,bhikd->bhiqd", d_scores, k_chunk)

            def scatter(gathered):
                # (B, H, C, S * bs, d) summed into (nk, B, H, bs, d).
                gathered = ops.reshape(
                    gathered,
                    (-1, heads, chunk_blocks * num_slots, bs, gathered.shape[-1]),
                )
                return ops.segment_sum(
                    ops.transpose(gathered, (2, 0, 1, 3, 4)),
                    chunk_index,
                    num_segments=nk,
                )

            dk_blocks = dk_blocks + scatter(ops.einsum("bhiqk,bhiqd->bhikd", d_scores, q_chunk))
            dv_blocks = dv_blocks + scatter(
                ops.einsum("bhiqk,bhiqd->bhikd", dropped(probs, keep), d_out_chunk)
            )
            if has_tokens:
                token_probs = online_softmax.probabilities(token_scores, chunk_lse)
                d_token_probs = ops.einsum("bhiqd,bhgd->bhiqg", d_out_chunk, token_v)
                d_token_scores = online_softmax.logits_gradient(
                    token_probs, dropped(d_token_probs, token_keep), chunk_delta
                )
                d_token_scores, d_weights = unmodified(d_token_scores, parts[1], d_weights)
                dq = dq + ops.einsum("bhiqg,bhgd->bhiqd", d_token_scores, token_k)
                dtoken_k = dtoken_k + ops.einsum("bhiqg,bhiqd->bhgd", d_token_scores, q_chunk)
                dtoken_v = dtoken_v + ops.einsum(
                    "bhiqg,bhiqd->bhgd", dropped(token_probs, token_keep), d_out_chunk
                )
            return (
                loops.write_block(dq_buffer, c, dq),
                dk_blocks,
                dv_blocks,
                dtoken_k,
                dtoken_v,
                d_weights,
            )

        batch = ops.shape(q)[1]
        dq, dk_blocks, dv_blocks, dtoken_k, dtoken_v, d_weights = loops.sequential_fori_loop(
            0,
            num_chunks,
            step,
            (
                loops.block_buffer(ops.zeros_like(q)),
                ops.zeros((nk, batch, heads, bs, head_dim), dtype="float32"),
                ops.zeros((nk, batch, heads, bs, value_dim), dtype="float32"),
                ops.zeros_like(token_k),
                ops.zeros_like(token_v),
                tuple(ops.zeros_like(w) for w in weights),
            ),
        )
        dq = loops.stack_blocks(dq)
        # Back to the (B, H, nk, bs, d) layout of the key and value blocks.
        dk_blocks = ops.transpose(dk_blocks, (1, 2, 0, 3, 4))
        dv_blocks = ops.transpose(dv_blocks, (1, 2, 0, 3, 4))
        grads = (dq, dk_blocks, dv_blocks, dtoken_k, dtoken_v)
        if sink_inputs:
            # d sink[h] = -sum over rows of p_sink * delta (the sink's value is 0).
            sink = ops.reshape(inputs[5], (1, 1, heads, 1, 1))
            d_sink = -ops.sum(ops.exp(sink - lse) * delta, axis=(0, 1, 3, 4))
            grads += (d_sink,)
        return grads + tuple(d_weights)

    attend = online_softmax.recomputing_gradient(forward, backward)

    if not has_tokens:
        # Zero global tokens: (B, H, 0, d) placeholders keep one signature.
        token_k = ops.zeros_like(k[:, :, :0])
        token_v = ops.zeros_like(v[:, :, :0])
    if keep_bits is not None:  # the kept weights' 1 / (1 - rate); autodiff scales dV
        v, token_v = v * keep_bits.scale, token_v * keep_bits.scale
    k_blocks = ops.reshape(k, (-1, heads, nk, bs, head_dim))
    v_blocks = ops.reshape(v, (-1, heads, nk, bs, value_dim))
    if modify and modifier.score_mod is not None:
        # A user mod's result is checked once, here, on the first chunk: an
        # error raised inside the loops would be reported as the loop's.
        first = ops.zeros((ops.shape(q)[1], heads, chunk_blocks, bs, keys_per_row))
        _modified(modifier, first, chunk_indices(0, ops.take(index, 0, axis=0))[0], score_weights)
    out = attend(q, k_blocks, v_blocks, token_k, token_v, *sink_inputs, *score_weights)
    # (nc, B, H, C, bs, Dv)
    out = ops.transpose(out, (1, 2, 0, 3, 4, 5))
    out = ops.reshape(out, (-1, heads, padded_blocks * bs, value_dim))
    return out[:, :, : nq * bs]


def _gathered_block_rows(
    q,
    k,
    v,
    index,
    slot_valid,
    key_valid,
    attention_mask,
    q_block_positions,
    token_k,
    token_v,
    token_mask,
    *,
    block_size,
    rules,
    dropout,
    keep_bits=None,
    token_positions=None,
    modifier=None,
    query_length=None,
    key_length=None,
):
    """Block rows by autodiff over gathered keys and values (the general path).

    Holds the gathered `(L, S * block_size, D)` keys and values and the
    `(L, S * block_size)` scores for the whole sequence; used with a dropout
    callable, an explicit attention mask, dense weights or dynamic lengths.
    `keep_bits` (an `ops.dropout.KeepBits`) drops the weights with the bits
    of their absolute positions, as the recomputing path does; `modifier`
    (a `ScoreModifier`) changes the logits of the gathered keys and tokens
    at their absolute positions (float32), its sinks join each row's softmax.
    """
    batch, heads, head_dim = ops.shape(q)[0], q.shape[1], q.shape[-1]
    nq, num_slots = _length(index, 0), index.shape[1]
    nk = _length(k, 2) // block_size
    flat_index = ops.reshape(index, (-1,))
    k_blocks = ops.reshape(k, (batch, heads, nk, block_size, head_dim))
    v_blocks = ops.reshape(v, (batch, heads, nk, block_size, v.shape[-1]))
    gathered_k = ops.reshape(
        ops.take(k_blocks, flat_index, axis=2),
        (batch, heads, nq, num_slots * block_size, head_dim),
    )
    gathered_v = ops.reshape(
        ops.take(v_blocks, flat_index, axis=2),
        (batch, heads, nq, num_slots * block_size, v.shape[-1]),
    )
    q_blocks = ops.reshape(q, (batch, heads, nq, block_size, head_dim))

    # Mask (B or 1, nq, bs, S * bs) of the gathered keys.
    key_positions = index[:, :, None] * block_size + ops.arange(
        block_size, dtype="int32"
    )  # (nq, S, bs)
    key_positions = ops.reshape(key_positions, (nq, num_slots * block_size))
    slot_mask = ops.repeat(slot_valid, block_size, axis=1)  # (nq, S * bs)
    block_key_valid = ops.take(
        ops.reshape(key_valid, (-1, nk, block_size)), flat_index, axis=1
    )  # (B or 1, nq * S, bs)
    block_mask = ops.logical_and(
        slot_mask[None],
        ops.reshape(block_key_valid, (-1, nq, num_slots * block_size)),
    )[:, :, None, :]
    if rules.has_positional:
        block_mask = ops.logical_and(
            block_mask,
            rules.allows(q_block_positions[:, :, None], key_positions[:, None, :])[None],
        )
    if attention_mask is not None:
        # (B, nq, bs, nk, bs) gathered to (B, nq, bs, S, bs).
        blocked = ops.reshape(attention_mask, (-1, nq, block_size, nk, block_size))
        gather_index = ops.broadcast_to(
            index[None, :, None, :, None],
            (ops.shape(blocked)[0], nq, block_size, num_slots, block_size),
        )
        picked = ops.take_along_axis(blocked, gather_index, axis=3)
        block_mask = ops.logical_and(
            block_mask,
            ops.reshape(picked, (-1, nq, block_size, num_slots * block_size)),
        )
    scores = ops.einsum("bhiqd,bhikd->bhiqk", q_blocks, gathered_k)
    mask = block_mask[:, None]  # (B or 1, 1, nq, bs, S * bs)
    columns = key_positions  # (nq, S * bs [+ G]): each row's keys, for the modifier
    if token_k is not None:
        token_scores = ops.einsum("bhiqd,bhgd->bhiqg", q_blocks, token_k)
        scores = ops.concatenate([scores, token_scores], axis=-1)
        columns = ops.concatenate(
            [columns, ops.broadcast_to(token_positions[None], (nq, token_k.shape[2]))], axis=1
        )
        full = (batch, nq, block_size)
        mask = ops.concatenate(
            [
                ops.broadcast_to(block_mask, full + (num_slots * block_size,)),
                ops.broadcast_to(token_mask, full + (token_k.shape[2],)),
            ],
            axis=-1,
        )[:, None]
    if modifier is not None and modifier.changes_logits:
        indices = _block_indices(batch, heads, q_block_positions, columns, query_length, key_length)
        scores = _modified(modifier, ops.cast(scores, "float32"), indices)
    sinks = None if modifier is None else modifier.sinks()
    weights = ops.cast(_block_softmax(scores, mask, sinks), q.dtype)
    dropped = weights if dropout is None else dropout(weights)
    if keep_bits is not None:
        rows = keep_bits.rows(ops.reshape(q_block_positions, (-1,)))
        rows = ops.reshape(rows, (batch, heads, nq, block_size, 1))
        columns = ops.reshape(
            keep_bits.columns(key_positions), (1, 1, nq, 1, num_slots * block_size)
        )
        keep = keep_bits.keep(rows, columns)
        if token_k is not None:
            keep = ops.concatenate(
                [keep, keep_bits.keep(rows, keep_bits.columns(token_positions))], -1
            )
        dropped = ops.where(keep, weights, 0.0) * keep_bits.scale
    block_weights = dropped[..., : num_slots * block_size]
    output = ops.einsum("bhiqk,bhikd->bhiqd", block_weights, gathered_v)
    if token_k is not None:
        output = output + ops.einsum(
            "bhiqg,bhgd->bhiqd", dropped[..., num_slots * block_size :], token_v
        )
    output = ops.reshape(output, (batch, heads, nq * block_size, v.shape[-1]))
    return output, weights


def block_sparse_attention(
    query,
    key,
    value,
    *,
    block_size,
    window_blocks,
    global_blocks=0,
    random_plan=None,
    global_tokens=None,
    mask=None,
    scale=None,
    scores=None,
    dropout=None,
    return_weights=False,
    chunk_blocks=None,
    dropout_rate=0.0,
    dropout_seed=None,
):
    """Block-sparse softmax attention over projected multi-head tensors.

    Args:
        query: `(B, Tq, H, D)`.
        key: `(B, Tv, H, D)`.
        value: `(B, Tv, H, Dv)`.
        block_size: tokens per block. Lengths need not be multiples: the
            inputs are padded internally and the padding is masked.
        window_blocks, global_blocks, random_plan: the pattern, see
            `block_plan` (causal when `mask` is).
        global_tokens: tuple of token positions that are global in both
            directions (Longformer), or `None`. Positions past the sequence
            are ignored.
        mask: an `AttentionMask` (`AttentionMask.from_tensors` builds one
            from Keras' spellings), or None. Its key mask, its pair mask (one
            for every head; itself `O(Tq * Tv)`) and its positional rules
            (causal, window, sink tokens)
            mask keys inside the pattern, and the pattern looks backwards
            when it is causal. Masked query rows still get weights (the
            caller zeroes them); they do not change other rows. Segment ids
            (packed documents) are compared inside each chunk of gathered
            key blocks on the memory-linear path (no `(Tq, Tv)` mask); the
            pattern's blocks are fixed, so a block holding only other
            documents' keys is still computed and masked, not skipped. With
            a `mask_mod` (one for every head), a `dropout` callable, dense
            weights or a pair mask, segment ids join the pair mask. A prefix length is
            refused (the causal pattern never holds the blocks it would
            open).
        scale: score multiplier; default `1 / sqrt(D)`.
        scores: a `ScoreModifier` (soft cap, ALiBi, learned sinks, a
            `score_mod` with its weights), or None. Every path applies it to
            the scaled logits at their absolute positions: a gathered key
            block's `k_idx` are its keys' positions, `(1, 1, rows, keys)`,
            the global tokens' and global rows' `(1, 1, 1, keys)`, all in
            the 4-D contract of `ops.mods`. A sink is a key with logit
            `sink[h]` and a zero value in every row; the weights returned
            are the keys'. Gradients flow to the sink logits and the
            `score_mod`'s weights (the recomputing path returns them from
            its own backward).
        dropout: callable applied to the attention weights before they
            multiply the values (e.g. a `Dropout` layer), or `None`; it needs
            the weights stored (the gathered path). `dropout_rate` drops them
            inside the kernel instead.
        return_weights: also return the weights scattered into a dense
            `(B, H, Tq, Tv)` array. This is `O(Tq * Tv)`: for visualisation.
        chunk_blocks: query blocks per chunk of the recomputing kernel
            (default: `1024 // block_size` blocks, at least 1); it need not
            divide the number of blocks.
        dropout_rate, dropout_seed: dropout inside the kernel (training):
            weight `(b, h, i, j)` is kept where `ops.dropout_keep_mask(seed,
            B, H, Tq, Tv, rate)` is (the blockwise kernel's bits, at the
            absolute positions), and scaled by `1 / (1 - rate)`; the
            recomputing path computes each chunk's bits again in its
            backward, so it stays linear in memory. The seed is an integer or
            an integer scalar tensor (a new one per training step).

    Returns:
        `output (B, Tq, H, Dv)` and, with `return_weights`, the weights.

    Memory: with static lengths, no dropout callable, no explicit
    `attention_mask` and no dense weights asked for (the usual training
    and serving case, `dropout_rate` included),
    the block rows run through `_recomputed_block_rows`: chunks of query
    blocks in a loop under a custom gradient that recomputes each chunk's
    probabilities in the backward, so forward + backward holds only
    `O(L * D)` tensors plus one chunk's scores. Otherwise (a dropout
    callable's mask cannot be replayed in the backward) they go through
    autodiff over the gathered keys, `O(L * S * bs)` memory. Both paths give
    the same result.
    """
    owner = "block_sparse_attention"
    for name, x in (("query", query), ("key", key), ("value", value)):
        checks.tensor(owner, name, x, rank=4)
    checks.same_size(owner, ("query", query, -1, "head size"), ("key", key, -1, None))
    checks.same_size(owner, ("key", key, 1, "length"), ("value", value, 1, None))
    block_size = checks.positive_int(owner, "block_size", block_size)
    window_blocks = checks.non_negative_int(owner, "window_blocks", window_blocks)
    global_blocks = checks.non_negative_int(owner, "global_blocks", global_blocks)
    _checked_tokens(owner, global_tokens)
    return_weights = checks.flag(owner, "return_weights", return_weights)
    chunk_blocks = checks.positive_int(owner, "chunk_blocks", chunk_blocks, allow_none=True)
    scale = checks.scale(owner, scale)
    if dropout is not None and not callable(dropout):
        raise TypeError(
            f"{owner}: `dropout` must be a callable (such as a Dropout layer) or None. "
            f"Received: dropout={dropout!r}"
        )
    if scores is not None and not isinstance(scores, ScoreModifier):
        raise TypeError(
            f"{owner}: `scores` must be a ScoreModifier or None. Received: scores={scores!r}"
        )
    if scores is not None:
        for name, per_head in (
            ("alibi_slopes", scores.alibi_slopes),
            ("sink_logits", scores.sink_logits),
        ):
            if per_head is not None and per_head.shape[0] not in (None, query.shape[2]):
                raise ValueError(
                    f"{owner}: the ScoreModifier's `{name}` must hold one number per "
                    f"head ({query.shape[2]}). Received: {name} with shape "
                    f"{tuple(per_head.shape)}"
                )
        if scores.is_empty:
            scores = None
    dropout_rate = validation.validate_rate(owner, "dropout_rate", dropout_rate)
    if dropout_rate > 0.0:
        if dropout is not None or dropout_seed is None:
            raise ValueError(
                f"{owner}: `dropout_rate` > 0 drops inside the kernel and needs "
                "`dropout_seed` (an integer or an integer scalar tensor), and no "
                f"`dropout` callable. Received: dropout_rate={dropout_rate}, "
                f"dropout_seed={dropout_seed!r}, dropout={dropout!r}"
            )
        dropouts.check_seed(owner, "dropout_seed", dropout_seed)
    if mask is None:
        mask = attention_masks.AttentionMask()
    if not isinstance(mask, attention_masks.AttentionMask):
        raise TypeError(
            f"{owner}: `mask` must be an AttentionMask (see AttentionMask.from_tensors) "
            f"or None. Received: mask={mask!r}"
        )
    if mask.key_positions is not None:
        raise ValueError(
            f"{owner}: the block-sparse pattern is laid out on key indices; keys at "
            "other positions (`key_positions`) are not supported. Received: an "
            "AttentionMask with key_positions"
        )
    if mask.prefix_length is not None or mask.per_head:
        raise ValueError(
            f"{owner}: the block-sparse pattern takes one mask for every head, and its "
            "causal pattern never holds the blocks a prefix would open ahead of a "
            "query: prefix lengths and per-head masks are not supported. Received: an "
            f"AttentionMask with prefix_length={mask.prefix_length!r}, "
            f"per-head={mask.per_head}"
        )
    # Packed documents on the recomputing path (static lengths, no dropout
    # callable, no explicit pair mask, no dense weights, no `mask_mod`) are compared
    # inside each chunk of gathered key blocks: `O(L)` ids, no `(Tq, Tv)` mask.
    static = isinstance(query.shape[1], int) and isinstance(key.shape[1], int)
    inline_segments = (
        mask.has_segments
        and mask.mask_mod is None
        and mask.pair_mask is None
        and static
        and dropout is None
        and not return_weights
    )
    query_segments = key_segments = None
    if inline_segments:
        query_segments = ops.cast(mask.query_segment_ids, "int32")
        key_segments = ops.cast(mask.key_segment_ids, "int32")
        mask = mask.replace(query_segment_ids=None, key_segment_ids=None)
    if mask.has_segments or mask.mask_mod is not None:
        # Otherwise packed documents and a `mask_mod` join the explicit pair
        # mask (the general, O(Tq * Tv) path runs).
        extra = attention_masks.AttentionMask(
            query_segment_ids=mask.query_segment_ids,
            key_segment_ids=mask.key_segment_ids,
            mask_mod=mask.mask_mod,
            query_offset=mask.query_offset,
        ).dense(_length(query, 1), _length(key, 1), ops.shape(query)[0], query.shape[2])
        if extra.shape[1] != 1:
            raise ValueError(
                f"{owner}: a `mask_mod` that depends on the head gives a per-head mask, "
                "which the block-sparse pattern does not take. Received: a mask_mod "
                f"whose mask has shape {tuple(extra.shape)}"
            )
        pair = extra if mask.pair_mask is None else ops.logical_and(mask.pair_mask, extra)
        mask = mask.replace(
            pair_mask=pair, query_segment_ids=None, key_segment_ids=None, mask_mod=None
        )
    key_mask = mask.key_mask
    attention_mask = None if mask.pair_mask is None else mask.pair_mask[:, 0]
    causal = mask.causal
    # Rows are independent (the caller zeroes masked query rows); the
    # positional rules are the description's, evaluated inside the pattern.
    rules = mask.replace(query_mask=None, key_mask=None, pair_mask=None)
    dtype = query.dtype
    if masking.is_statically_empty(query, key):
        # No query, or nothing to attend to: the zeros of a fully masked row.
        return masking.empty_attention(query, value, return_weights=return_weights)
    head_dim = query.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    query_length = _length(query, 1)
    key_length = _length(key, 1)
    nq = _ceil_div(query_length, block_size)
    nk = _ceil_div(key_length, block_size)
    padded_query_length = nq * block_size
    padded_key_length = nk * block_size
    # NaN/Inf at a key reaches only the queries whose blocks and masks see it.
    key, value = masking.confine_nonfinite(key, value)

    # (B, H, T, D) with the time axis padded to whole blocks.
    q = ops.transpose(_pad_time(query, padded_query_length), (0, 2, 1, 3))
    k = ops.transpose(_pad_time(key, padded_key_length), (0, 2, 1, 3))
    v = ops.transpose(_pad_time(value, padded_key_length), (0, 2, 1, 3))
    q = q * ops.cast(scale, dtype)
    batch, heads = ops.shape(q)[0], q.shape[1]
    keep_bits = None
    if dropout_rate > 0.0:
        keep_bits = dropouts.KeepBits(dropout_seed, dropout_rate, batch, heads)

    key_valid = ops.less(ops.arange(padded_key_length), key_length)[None, :]
    if key_mask is not None:
        key_valid = ops.logical_and(
            key_valid,
            _pad_time(masking.to_bool_mask(key_mask), padded_key_length, value=False),
        )  # (B or 1, Tkp)
    if attention_mask is not None:
        attention_mask = masking.to_bool_mask(attention_mask)
        attention_mask = _pad_time(attention_mask, padded_query_length, axis=1, value=False)
        attention_mask = _pad_time(
            attention_mask, padded_key_length, axis=2, value=False
        )  # (B, Tqp, Tkp)
    query_positions = ops.arange(padded_query_length, dtype="int32")
    if query_segments is not None:
        query_segments = _pad_time(query_segments, padded_query_length)  # (B, Tqp)
        key_segments = _pad_time(key_segments, padded_key_length)  # (B, Tkp)

    # ---------------------------------------------------------- block rows
    index, slot_valid = block_plan(
        nq,
        nk,
        window_blocks=window_blocks,
        global_blocks=global_blocks,
        random_plan=random_plan,
        causal=causal,
    )
    num_slots = index.shape[1]
    q_block_positions = ops.reshape(query_positions, (nq, block_size))

    # Longformer global tokens as extra keys for every block row.
    tokens = tuple(sorted(set(global_tokens or ())))
    token_k = token_v = token_mask = token_positions = None
    if tokens:
        token_positions = ops.convert_to_tensor(tokens, dtype="int32")  # (G,)
        token_index = ops.minimum(token_positions, padded_key_length - 1)
        token_valid = ops.take(key_valid, token_index, axis=1)  # (B or 1, G)
        token_valid = ops.logical_and(token_valid, ops.less(token_positions, key_length)[None])
        token_block = token_positions // block_size
        covered = ops.any(
            ops.logical_and(
                ops.equal(index[:, :, None], token_block[None, None, :]),
                slot_valid[:, :, None],
            ),
            axis=1,
        )  # (nq, G): the token is already inside one of the row's blocks
        token_mask = ops.logical_and(token_valid[:, None, :], ops.logical_not(covered)[None])[
            :, :, None, :
        ]  # (B or 1, nq, 1, G)
        if rules.has_positional:
            token_mask = ops.logical_and(
                token_mask,
                rules.allows(q_block_positions[:, :, None], token_positions[None, None, :])[None],
            )
        if query_segments is not None:
            token_mask = ops.logical_and(
                token_mask,
                ops.equal(
                    ops.reshape(query_segments, (-1, nq, block_size, 1)),
                    ops.take(key_segments, token_index, axis=1)[:, None, None, :],
                ),
            )
        if attention_mask is not None:
            columns = ops.take(attention_mask, token_index, axis=2)  # (B, Tqp, G)
            token_mask = ops.logical_and(
                token_mask, ops.reshape(columns, (-1, nq, block_size, len(tokens)))
            )
        token_k = ops.take(k, token_index, axis=2)  # (B, H, G, D)
        token_v = ops.take(v, token_index, axis=2)

    # The recomputing kernel needs static lengths and a softmax it can
    # replay: a dropout callable (a fresh mask per call), dense weights and
    # explicit (already O(Tq * Tv)) attention masks take the gathered path
    # below; `dropout_rate`'s bits are recomputed there.
    recompute = (
        isinstance(nq, int)
        and isinstance(nk, int)
        and dropout is None
        and attention_mask is None
        and not return_weights
    )
    if recompute:
        as_float = lambda x: None if x is None else ops.cast(x, "float32")  # noqa: E731
        output = _recomputed_block_rows(
            as_float(q),
            as_float(k),
            as_float(v),
            index,
            slot_valid,
            key_valid,
            block_size=block_size,
            chunk_blocks=chunk_blocks or max(1, DEFAULT_CHUNK_ROWS // block_size),
            rules=rules,
            token_k=as_float(token_k),
            token_v=as_float(token_v),
            token_mask=token_mask,
            query_segments=query_segments,
            key_segments=key_segments,
            keep_bits=keep_bits,
            token_positions=token_positions,
            modifier=scores,
            query_length=query_length,
            key_length=key_length,
        )
        output = ops.cast(output, dtype)
    else:
        output, weights = _gathered_block_rows(
            q,
            k,
            v,
            index,
            slot_valid,
            key_valid,
            attention_mask,
            q_block_positions,
            token_k,
            token_v,
            token_mask,
            block_size=block_size,
            rules=rules,
            dropout=dropout,
            keep_bits=keep_bits,
            token_positions=token_positions,
            modifier=scores,
            query_length=query_length,
            key_length=key_length,
        )

    # ---------------------------------------------------- global query rows
    # Queries in the first `global_blocks` blocks and at `global_tokens`
    # attend to every key: a dense `(R, Tv)` strip, still linear in length.
    rows = tuple(sorted(set(range(global_blocks * block_size)) | set(tokens)))
    row_weights = None
    if rows:
        row_positions = ops.convert_to_tensor(rows, dtype="int32")  # (R,)
        row_index = ops.minimum(row_positions, padded_query_length - 1)
        row_q = ops.take(q, row_index, axis=2)  # (B, H, R, D)
        row_mask = key_valid[:, None, :]  # (B or 1, 1, Tkp)
        if rules.has_positional:
            row_mask = ops.logical_and(
                row_mask,
                rules.positional(row_positions, ops.arange(padded_key_length, dtype="int32"))[None],
            )
        if query_segments is not None:
            row_mask = ops.logical_and(
                row_mask,
                ops.equal(
                    ops.take(query_segments, row_index, axis=1)[:, :, None],
                    key_segments[:, None, :],
                ),
            )  # (B, R, Tkp): linear in the length
        if attention_mask is not None:
            row_mask = ops.logical_and(row_mask, ops.take(attention_mask, row_index, axis=1))
        if recompute:
            # Exact attention of R rows over all keys, blockwise with a
            # recomputing gradient: the (B, H, R, Tv) strip is never held.
            row_output = memory_efficient.memory_efficient_attention(
                ops.transpose(row_q, (0, 2, 1, 3)),
                ops.transpose(k, (0, 2, 1, 3)),
                ops.transpose(v, (0, 2, 1, 3)),
                mask=attention_masks.AttentionMask(
                    pair_mask=ops.broadcast_to(
                        row_mask, (ops.shape(row_mask)[0], len(rows), padded_key_length)
                    )
                ),
                scale=1.0,
                scores=_at_rows(scores, ops.minimum(row_positions, query_length - 1)),
                dropout_rate=dropout_rate,
                dropout_seed=dropout_seed,
                dropout_rows=row_positions,
            )
            row_output = ops.transpose(row_output, (0, 2, 1, 3))
        else:
            row_scores = ops.einsum("bhrd,bhkd->bhrk", row_q, k)
            if scores is not None and scores.changes_logits:
                indices = _block_indices(
                    batch,
                    heads,
                    row_positions,
                    ops.arange(padded_key_length, dtype="int32"),
                    query_length,
                    key_length,
                )
                row_scores = scores.apply(ops.cast(row_scores, "float32"), *indices)
            row_weights = dense_attention.softmax_with_sinks(
                row_scores, row_mask[:, None], None if scores is None else scores.sinks()
            )
            row_weights = ops.cast(row_weights, dtype)
            row_dropped = row_weights if dropout is None else dropout(row_weights)
            if keep_bits is not None:
                keep = keep_bits.keep(
                    keep_bits.rows(row_positions)[..., None],
                    keep_bits.columns(ops.arange(padded_key_length, dtype="int32")),
                )
                row_dropped = ops.where(keep, row_weights, 0.0) * keep_bits.scale
            row_output = ops.einsum("bhrk,bhkd->bhrd", row_dropped, v)
        # Scatter the rows back with a one-hot matrix (rows past the end of
        # the sequence one-hot to nothing).
        scatter = ops.one_hot(row_positions, padded_query_length, dtype=dtype)
        is_row = ops.sum(scatter, axis=0)  # (Tqp,)
        output = output * (1 - is_row)[None, None, :, None] + ops.einsum(
            "rt,bhrd->bhtd", scatter, row_output
        )

    output = ops.transpose(output[:, :, :query_length], (0, 2, 1, 3))
    if not return_weights:
        return output

    # ------------------------------------------- dense weights (O(Tq * Tv))
    slot_one_hot = (
        ops.one_hot(index, nk, dtype=weights.dtype)
        * ops.cast(slot_valid, weights.dtype)[:, :, None]
    )  # (nq, S, nk)
    per_slot = ops.reshape(
        weights[..., : num_slots * block_size],
        (batch, heads, nq, block_size, num_slots, block_size),
    )
    dense = ops.einsum("bhiqsk,isj->bhiqjk", per_slot, slot_one_hot)
    dense = ops.reshape(dense, (batch, heads, padded_query_length, padded_key_length))
    if tokens:
        token_one_hot = ops.one_hot(token_positions, padded_key_length, dtype=weights.dtype)
        token_weights = ops.reshape(
            weights[..., num_slots * block_size :],
            (batch, heads, padded_query_length, len(tokens)),
        )
        dense = dense + ops.einsum("bhqg,gk->bhqk", token_weights, token_one_hot)
    if rows:
        scatter = ops.cast(scatter, weights.dtype)
        dense = dense * (1 - ops.cast(is_row, weights.dtype))[:, None] + ops.einsum(
            "rt,bhrk->bhtk", scatter, row_weights
        )
    return output, dense[:, :, :query_length, :key_length]
