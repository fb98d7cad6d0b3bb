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

The pattern is a `TilePlan` (`sparse_tile_plan`: the visited key blocks of
each query block, full or partial under the mask) and the usual call is one
sweep of the tiled engine over it (`tiled_engine.py`, the blockwise kernel's
forward and recomputing backward, its score modifiers and dropout), so time
and memory grow linearly in the sequence length. Dense weights, a dropout
callable, an explicit pair mask or a `mask_mod` take the gathered path
instead: keys gathered block by block, one small dense matmul per query
block. No `L x L` matrix is formed unless the dense weights are asked for. A
key block that appears twice in a query block's plan (a random block falling
inside the window, say) is counted once.

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
    mask,
    q_len,
    k_len,
    block_size,
    window_blocks,
    global_blocks,
    random_plan,
    tokens,
    apart=0,
    batch_size=None,
    num_heads=None,
):
    """`sparse_tile_plan` without the checks of its lengths and tokens; the
    first `apart` rows (the global blocks', attended by another call) visit
    nothing of their own."""
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
    rows = tuple(range(apart, min(global_blocks * block_size, q_len)))
    rows += tuple(t for t in tokens if t >= apart)
    q_block, k_block = min(block_size, q_len), min(block_size, k_len)  # nq, nk unchanged
    blocks = ops.any(hits, axis=1)
    if apart:
        blocks = ops.logical_and(blocks, (ops.arange(nq) * block_size >= apart)[:, None])
    return tiling.from_pattern(
        mask, q_len, k_len, q_block, k_block, blocks, rows, tokens, batch_size, num_heads
    )


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


def _block_softmax(logits, allowed, sinks):
    """The masked softmax of `(B, H, n, bs, K)` logits, with the sink logits
    `(H,)` (or None) in each row's denominator: the keys' weights."""
    if sinks is None:
        return online_softmax.masked_softmax(logits, allowed)
    shape = ops.shape(logits)
    allowed = ops.broadcast_to(allowed, tuple(ops.shape(allowed)[:2]) + tuple(shape[2:]))
    weights = dense_attention.softmax_with_sinks(_as_rows(logits), _as_rows(allowed), sinks)
    return ops.reshape(weights, shape)


def _sweeps(query, key, mask, dropout, return_weights):
    """Whether the call runs on the tiled engine: static lengths, and a
    softmax the backward can replay (no dropout callable: a fresh mask per
    call), no dense weights. A pair mask and a `mask_mod` are evaluated per
    tile there, as by the blockwise kernel."""
    static = isinstance(query.shape[1], int) and isinstance(key.shape[1], int)
    return static and dropout is None and not return_weights


def _swept_attention(query, key, value, mask, pattern, **options):
    """Block-sparse attention on the tiled engine: one sweep over the
    pattern's `TilePlan` (`sparse_tile_plan`) for the block rows, the global
    tokens' columns and rows, and one of exact attention for the global
    blocks' rows, each a forward and a recomputing backward with every
    `memory_efficient_attention` feature (score modifiers, dropout's keep
    bits at absolute positions, segment ids compared per tile). Masked query
    rows are computed as any other (the caller zeroes them)."""
    mask = mask.replace(query_mask=None)
    attend = memory_efficient.memory_efficient_attention
    if masking.is_statically_empty(query, key):
        return attend(query, key, value, mask=mask, **options)  # zeros, -inf statistics
    block_size, window_blocks, global_blocks, random_plan, tokens = pattern
    # The global blocks' rows see every key: exact attention in the engine's
    # default, larger tiles (at 8192 tokens in TF graph mode their 64 x 64
    # tiles of the pattern's plan cost 1.26x the old kernel, 1.04x without).
    apart = min(global_blocks * block_size, query.shape[1])
    plan = _pattern_plan(
        mask,
        query.shape[1],
        key.shape[1],
        block_size,
        window_blocks,
        global_blocks,
        random_plan,
        tuple(sorted(set(tokens or ()))),
        apart,
        ops.shape(query)[0],
        query.shape[2],
    )
    output = attend(query, key, value, mask=mask, tile_plan=plan, **options)
    if not apart:
        return output
    rows = attend(query[:, :apart], key, value, mask=mask.rows(0, apart), **options)
    if not options.get("return_statistics"):
        return ops.concatenate([rows, output[:, apart:]], axis=1)
    (rows, row_statistics), (output, statistics) = rows, output
    statistics = {
        name: ops.concatenate([row_statistics[name], stat[:, :, apart:]], axis=2)
        for name, stat in statistics.items()
    }
    return ops.concatenate([rows, output[:, apart:]], axis=1), statistics


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
    `(L, S * block_size)` logits for the whole sequence; used with a dropout
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

    key_positions, block_mask = _gathered_mask(
        index, slot_valid, key_valid, attention_mask, q_block_positions, block_size, nk, rules
    )
    logits = ops.einsum("bhiqd,bhikd->bhiqk", q_blocks, gathered_k)
    mask = block_mask[:, None]  # (B or 1, 1, nq, bs, S * bs)
    columns = key_positions  # (nq, S * bs [+ G]): each row's keys, for the modifier
    if token_k is not None:
        token_logits = ops.einsum("bhiqd,bhgd->bhiqg", q_blocks, token_k)
        logits = ops.concatenate([logits, token_logits], axis=-1)
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
        logits = _modified(modifier, ops.cast(logits, "float32"), indices)
    sinks = None if modifier is None else modifier.sinks()
    weights = ops.cast(_block_softmax(logits, mask, sinks), q.dtype)
    dropped = weights if dropout is None else dropout(weights)
    if keep_bits is not None:
        keep = _gathered_keep(
            keep_bits,
            q_block_positions,
            key_positions,
            token_positions,
            (batch, heads, nq, block_size),
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


def _gathered_mask(
    index, slot_valid, key_valid, attention_mask, q_block_positions, block_size, nk, rules
):
    """The gathered keys' absolute positions `(nq, S * bs)` and which of them
    each query sees, `(B or 1, nq, 1 or bs, S * bs)`: valid slots and keys,
    the positional rules, an explicit mask's gathered blocks."""
    nq, num_slots = _length(index, 0), index.shape[1]
    flat_index = ops.reshape(index, (-1,))
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
    return key_positions, block_mask


def _gathered_keep(keep_bits, q_block_positions, key_positions, token_positions, blocks):
    """The dropout keep bits of the gathered keys (then the global tokens'),
    `(B, H, nq, bs, S * bs [+ G])`, from their absolute positions; `blocks`
    is `(B, H, nq, bs)`."""
    batch, heads, nq, block_size = blocks
    rows = keep_bits.rows(ops.reshape(q_block_positions, (-1,)))
    rows = ops.reshape(rows, (batch, heads, nq, block_size, 1))
    columns = ops.reshape(keep_bits.columns(key_positions), (1, 1, nq, 1, -1))
    keep = keep_bits.keep(rows, columns)
    if token_positions is not None:
        keep = ops.concatenate([keep, keep_bits.keep(rows, keep_bits.columns(token_positions))], -1)
    return keep


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
    modifier=None,
    dropout=None,
    return_weights=False,
    dropout_rate=0.0,
    dropout_seed=None,
    return_statistics=False,
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
            (packed documents), the pair mask and a `mask_mod` (a head's own
            too) are evaluated per tile on the memory-linear path (no
            `(Tq, Tv)` mask), and a tile of the pattern they leave empty is
            skipped. With a `dropout` callable or dense weights (the
            gathered path), segment ids and a `mask_mod` (one for every
            head) join the pair mask. A prefix length is refused (the causal
            pattern never holds the blocks it would open).
        scale: score multiplier; default `1 / sqrt(D)`.
        modifier: a `ScoreModifier` (soft cap, ALiBi, learned sinks, a
            `score_mod` with its weights), or None. Every path applies it to
            the scaled logits at their absolute positions: on the engine's
            path with the blockwise kernel's indices (a tile's rows and
            keys); on the gathered path a gathered key block's `k_idx` are
            its keys' positions, `(1, 1, rows, keys)`, the global tokens'
            and global rows' `(1, 1, 1, keys)`, in the 4-D contract of
            `ops.mods`. A sink is a key with logit
            `sink[h]` and a zero value in every row; the weights returned
            are the keys'. Gradients flow to the sink logits and the
            `score_mod`'s weights (the engine returns them from its own
            backward).
        dropout: callable applied to the attention weights before they
            multiply the values (e.g. a `Dropout` layer), or `None`; it needs
            the weights stored (the gathered path). `dropout_rate` drops them
            inside the kernel instead.
        return_weights: also return the weights scattered into a dense
            `(B, H, Tq, Tv)` array. This is `O(Tq * Tv)`: for visualisation.
        dropout_rate, dropout_seed: dropout inside the kernel (training):
            weight `(b, h, i, j)` is kept where `ops.dropout_keep_mask(seed,
            B, H, Tq, Tv, rate)` is (the blockwise kernel's bits, at the
            absolute positions), and scaled by `1 / (1 - rate)`; the
            engine computes each tile's bits again in its backward, so it
            stays linear in memory. The seed is an integer or
            an integer scalar tensor (a new one per training step).
        return_statistics: also return each row's log-sum-exp and maximum
            over the keys the pattern and the mask let it see (and the sink),
            `{"logsumexp", "max"}` of `(B, H, Tq)` float32, `-inf` where a
            row sees nothing, as `memory_efficient_attention` returns them
            (`merge_attention` combines parts). On the tiled engine's path
            only: not with dense weights, a `dropout` callable or unknown
            lengths (ValueError).

    Returns:
        `output (B, Tq, H, Dv)` and, with `return_weights`, the weights;
        with `return_statistics`, `(output, statistics)`.

    Memory: with static lengths, no dropout callable and no dense weights
    asked for (the usual training and serving case, `dropout_rate`, pair
    masks and `mask_mod` included), the call is one sweep of the
    tiled engine over `sparse_tile_plan`'s tiles under a custom gradient that
    recomputes each tile's probabilities in the backward, so forward +
    backward holds only `O(L * D)` tensors plus one tile's logits; the
    global blocks' rows are exact attention on the same engine. Otherwise (a dropout
    callable's mask cannot be replayed in the backward) the block rows go
    through autodiff over the gathered keys, `O(L * S * bs)` memory, and the
    global rows through a dense `(R, Tv)` strip. Both paths give the same
    result.
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
    scale = checks.scale(owner, scale)
    modifier = _checked_modifier(owner, modifier, query.shape[2])
    dropout_rate = _checked_dropout(owner, dropout, dropout_rate, dropout_seed)
    mask = _checked_mask(owner, mask)
    return_statistics = checks.flag(owner, "return_statistics", return_statistics)
    pattern = (block_size, window_blocks, global_blocks, random_plan, global_tokens)
    options = dict(
        scale=scale, modifier=modifier, dropout_rate=dropout_rate, dropout_seed=dropout_seed
    )
    if _sweeps(query, key, mask, dropout, return_weights):
        return _swept_attention(
            query, key, value, mask, pattern, return_statistics=return_statistics, **options
        )
    if return_statistics:
        raise ValueError(
            f"{owner}: `return_statistics=True` needs the tiled engine's path: static "
            "lengths, no `dropout` callable, no dense weights. Received: "
            f"return_weights={return_weights}, dropout={dropout!r}, lengths "
            f"{query.shape[1]} and {key.shape[1]}"
        )
    return _gathered_attention(
        query, key, value, mask, pattern, dropout=dropout, return_weights=return_weights, **options
    )


def _checked_dropout(owner, dropout, dropout_rate, dropout_seed):
    """The checked `dropout_rate`: a callable `dropout` or a rate with its
    seed, not both."""
    if dropout is not None and not callable(dropout):
        raise TypeError(
            f"{owner}: `dropout` must be a callable (such as a Dropout layer) or None. "
            f"Received: dropout={dropout!r}"
        )
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
    return dropout_rate


def _checked_modifier(owner, modifier, heads):
    """The `ScoreModifier` (None when it changes nothing), checked."""
    if modifier is not None and not isinstance(modifier, ScoreModifier):
        raise TypeError(
            f"{owner}: `modifier` must be a ScoreModifier or None. Received: modifier={modifier!r}"
        )
    if modifier is not None:
        for name, per_head in (
            ("alibi_slopes", modifier.alibi_slopes),
            ("sink_logits", modifier.sink_logits),
        ):
            if per_head is not None and per_head.shape[0] not in (None, heads):
                raise ValueError(
                    f"{owner}: the ScoreModifier's `{name}` must hold one number per "
                    f"head ({heads}). Received: {name} with shape "
                    f"{tuple(per_head.shape)}"
                )
        if modifier.is_empty:
            modifier = None
    return modifier


def _checked_mask(owner, mask):
    """The `AttentionMask`, checked against what the pattern takes."""
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
    return mask


def _gathered_attention(
    query,
    key,
    value,
    mask,
    pattern,
    *,
    scale,
    modifier,
    dropout,
    return_weights,
    dropout_rate,
    dropout_seed,
):
    """Block-sparse attention by autodiff over the gathered key blocks (the
    general path: dense weights, a dropout callable, unknown lengths), the
    global rows as a dense `(R, Tv)` strip."""
    block_size, window_blocks, global_blocks, random_plan, global_tokens = pattern
    mask = _joined_pair_mask(mask, query, key)
    if masking.is_statically_empty(query, key):
        # No query, or nothing to attend to: the zeros of a fully masked row.
        return masking.empty_attention(query, value, return_weights=return_weights)
    lengths = _length(query, 1), _length(key, 1)
    sweep = _Gathered(query, key, value, mask, block_size, scale, dropout_rate, dropout_seed)
    index, slot_valid = block_plan(
        sweep.nq,
        sweep.nk,
        window_blocks=window_blocks,
        global_blocks=global_blocks,
        random_plan=random_plan,
        causal=mask.causal,
    )
    tokens = tuple(sorted(set(global_tokens or ())))
    token_k, token_v, token_mask, token_positions = sweep.global_columns(tokens, index, slot_valid)
    output, weights = _gathered_block_rows(
        sweep.q,
        sweep.k,
        sweep.v,
        index,
        slot_valid,
        sweep.key_valid,
        sweep.attention_mask,
        sweep.q_block_positions,
        token_k,
        token_v,
        token_mask,
        block_size=block_size,
        rules=sweep.rules,
        dropout=dropout,
        keep_bits=sweep.keep_bits,
        token_positions=token_positions,
        modifier=modifier,
        query_length=lengths[0],
        key_length=lengths[1],
    )
    # Queries in the first `global_blocks` blocks and at `global_tokens`
    # attend to every key: a dense `(R, Tv)` strip, still linear in length.
    rows = tuple(sorted(set(range(global_blocks * block_size)) | set(tokens)))
    row_weights = None
    if rows:
        output, row_weights = sweep.global_rows(output, rows, modifier, dropout, lengths)
    output = ops.transpose(output[:, :, : lengths[0]], (0, 2, 1, 3))
    if not return_weights:
        return output
    dense = sweep.dense_weights(weights, index, slot_valid, token_positions, rows, row_weights)
    return output, dense[:, :, : lengths[0], : lengths[1]]


def _joined_pair_mask(mask, query, key):
    """`mask` with packed documents and a `mask_mod` joined into its pair
    mask (the gathered path compares them densely, `O(Tq * Tv)`)."""
    if not (mask.has_segments or mask.mask_mod is not None):
        return mask
    extra = attention_masks.AttentionMask(
        query_segment_ids=mask.query_segment_ids,
        key_segment_ids=mask.key_segment_ids,
        mask_mod=mask.mask_mod,
        query_offset=mask.query_offset,
    ).dense(_length(query, 1), _length(key, 1), ops.shape(query)[0], query.shape[2])
    if extra.shape[1] != 1:
        raise ValueError(
            "block_sparse_attention: a `mask_mod` that depends on the head gives a "
            "per-head mask, which the block-sparse pattern's gathered path (dense "
            "weights, a dropout callable, unknown lengths) does not take. Received: "
            f"a mask_mod whose mask has shape {tuple(extra.shape)}"
        )
    pair = extra if mask.pair_mask is None else ops.logical_and(mask.pair_mask, extra)
    return mask.replace(pair_mask=pair, query_segment_ids=None, key_segment_ids=None, mask_mod=None)


class _Gathered:
    """One call of the gathered path: the inputs padded to whole blocks and
    laid out `(B, H, T, D)`, the queries scaled, the keys' validity, and the
    steps that read them (the global columns and rows, the dense weights)."""

    def __init__(self, query, key, value, mask, block_size, scale, dropout_rate, dropout_seed):
        dtype = self.dtype = query.dtype
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        self.block_size = block_size
        self.query_length, self.key_length = _length(query, 1), _length(key, 1)
        self.nq = _ceil_div(self.query_length, block_size)
        self.nk = _ceil_div(self.key_length, block_size)
        self.padded_query_length = self.nq * block_size
        self.padded_key_length = self.nk * block_size
        # NaN/Inf at a key reaches only the queries whose blocks and masks see it.
        key, value = masking.confine_nonfinite(key, value)
        q = ops.transpose(_pad_time(query, self.padded_query_length), (0, 2, 1, 3))
        self.k = ops.transpose(_pad_time(key, self.padded_key_length), (0, 2, 1, 3))
        self.v = ops.transpose(_pad_time(value, self.padded_key_length), (0, 2, 1, 3))
        self.q = q * ops.cast(scale, dtype)
        self.batch, self.heads = ops.shape(q)[0], q.shape[1]
        self.keep_bits = None
        if dropout_rate > 0.0:
            self.keep_bits = dropouts.KeepBits(dropout_seed, dropout_rate, self.batch, self.heads)
        # Rows are independent (the caller zeroes masked query rows); the
        # positional rules are the description's, evaluated inside the pattern.
        self.rules = mask.replace(query_mask=None, key_mask=None, pair_mask=None)
        key_valid = ops.less(ops.arange(self.padded_key_length), self.key_length)[None, :]
        if mask.key_mask is not None:
            key_valid = ops.logical_and(
                key_valid,
                _pad_time(masking.to_bool_mask(mask.key_mask), self.padded_key_length, value=False),
            )
        self.key_valid = key_valid  # (B or 1, Tkp)
        attention_mask = None if mask.pair_mask is None else mask.pair_mask[:, 0]
        if attention_mask is not None:
            attention_mask = masking.to_bool_mask(attention_mask)
            attention_mask = _pad_time(
                attention_mask, self.padded_query_length, axis=1, value=False
            )
            attention_mask = _pad_time(attention_mask, self.padded_key_length, axis=2, value=False)
        self.attention_mask = attention_mask  # (B, Tqp, Tkp) or None
        positions = ops.arange(self.padded_query_length, dtype="int32")
        self.q_block_positions = ops.reshape(positions, (self.nq, block_size))

    def global_columns(self, tokens, index, slot_valid):
        """Longformer's global tokens as extra keys for every block row:
        `(keys, values, mask, positions)`, each None without tokens."""
        if not tokens:
            return None, None, None, None
        positions = ops.convert_to_tensor(tokens, dtype="int32")  # (G,)
        token_index = ops.minimum(positions, self.padded_key_length - 1)
        valid = ops.take(self.key_valid, token_index, axis=1)  # (B or 1, G)
        valid = ops.logical_and(valid, ops.less(positions, self.key_length)[None])
        covered = ops.any(
            ops.logical_and(
                ops.equal(index[:, :, None], (positions // self.block_size)[None, None, :]),
                slot_valid[:, :, None],
            ),
            axis=1,
        )  # (nq, G): the token is already inside one of the row's blocks
        token_mask = ops.logical_and(valid[:, None, :], ops.logical_not(covered)[None])[
            :, :, None, :
        ]  # (B or 1, nq, 1, G)
        if self.rules.has_positional:
            token_mask = ops.logical_and(
                token_mask,
                self.rules.allows(self.q_block_positions[:, :, None], positions[None, None, :])[
                    None
                ],
            )
        if self.attention_mask is not None:
            columns = ops.take(self.attention_mask, token_index, axis=2)  # (B, Tqp, G)
            token_mask = ops.logical_and(
                token_mask, ops.reshape(columns, (-1, self.nq, self.block_size, len(tokens)))
            )
        token_k = ops.take(self.k, token_index, axis=2)  # (B, H, G, D)
        token_v = ops.take(self.v, token_index, axis=2)
        return token_k, token_v, token_mask, positions

    def global_rows(self, output, rows, modifier, dropout, lengths):
        """`output` with the global rows' dense `(R, Tv)` strips written in,
        and their weights `(B, H, R, Tkp)`."""
        dtype, keys = self.dtype, self.padded_key_length
        row_positions = ops.convert_to_tensor(rows, dtype="int32")  # (R,)
        row_index = ops.minimum(row_positions, self.padded_query_length - 1)
        row_q = ops.take(self.q, row_index, axis=2)  # (B, H, R, D)
        row_mask = self.key_valid[:, None, :]  # (B or 1, 1, Tkp)
        if self.rules.has_positional:
            row_mask = ops.logical_and(
                row_mask,
                self.rules.positional(row_positions, ops.arange(keys, dtype="int32"))[None],
            )
        if self.attention_mask is not None:
            row_mask = ops.logical_and(row_mask, ops.take(self.attention_mask, row_index, axis=1))
        row_scores = ops.einsum("bhrd,bhkd->bhrk", row_q, self.k)
        if modifier is not None and modifier.changes_logits:
            indices = _block_indices(
                self.batch, self.heads, row_positions, ops.arange(keys, dtype="int32"), *lengths
            )
            row_scores = modifier.apply(ops.cast(row_scores, "float32"), *indices)
        row_weights = dense_attention.softmax_with_sinks(
            row_scores, row_mask[:, None], None if modifier is None else modifier.sinks()
        )
        row_weights = ops.cast(row_weights, dtype)
        row_dropped = row_weights if dropout is None else dropout(row_weights)
        if self.keep_bits is not None:
            bits = self.keep_bits
            keep = bits.keep(
                bits.rows(row_positions)[..., None], bits.columns(ops.arange(keys, dtype="int32"))
            )
            row_dropped = ops.where(keep, row_weights, 0.0) * bits.scale
        row_output = ops.einsum("bhrk,bhkd->bhrd", row_dropped, self.v)
        # Scatter the rows back with a one-hot matrix (rows past the end of
        # the sequence one-hot to nothing).
        self.scatter = ops.one_hot(row_positions, self.padded_query_length, dtype=dtype)
        self.is_row = ops.sum(self.scatter, axis=0)  # (Tqp,)
        output = output * (1 - self.is_row)[None, None, :, None] + ops.einsum(
            "rt,bhrd->bhtd", self.scatter, row_output
        )
        return output, row_weights

    def dense_weights(self, weights, index, slot_valid, token_positions, rows, row_weights):
        """The block rows', global columns' and global rows' weights
        scattered into one dense `(B, H, Tqp, Tkp)` array (`O(Tq * Tv)`)."""
        batch, heads, bs = self.batch, self.heads, self.block_size
        num_slots = index.shape[1]
        slot_one_hot = (
            ops.one_hot(index, self.nk, dtype=weights.dtype)
            * ops.cast(slot_valid, weights.dtype)[:, :, None]
        )  # (nq, S, nk)
        per_slot = ops.reshape(
            weights[..., : num_slots * bs], (batch, heads, self.nq, bs, num_slots, bs)
        )
        dense = ops.einsum("bhiqsk,isj->bhiqjk", per_slot, slot_one_hot)
        dense = ops.reshape(dense, (batch, heads, self.padded_query_length, self.padded_key_length))
        if token_positions is not None:
            token_one_hot = ops.one_hot(
                token_positions, self.padded_key_length, dtype=weights.dtype
            )
            token_weights = ops.reshape(
                weights[..., num_slots * bs :],
                (batch, heads, self.padded_query_length, token_positions.shape[0]),
            )
            dense = dense + ops.einsum("bhqg,gk->bhqk", token_weights, token_one_hot)
        if rows:
            scatter = ops.cast(self.scatter, weights.dtype)
            dense = dense * (1 - ops.cast(self.is_row, weights.dtype))[:, None] + ops.einsum(
                "rt,bhrk->bhtk", scatter, row_weights
            )
        return dense
