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

from keras_attention.ops import masking


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
    in_range = ops.logical_and(
        ops.greater_equal(index, 0), ops.less(index, num_key_blocks)
    )
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


def _pad_time(x, length, axis=1, value=0):
    """Pads `x` with `value` along `axis` up to `length`."""
    pad = length - _length(x, axis)
    widths = [[0, 0] for _ in range(len(x.shape))]
    widths[axis] = [0, pad]
    return ops.pad(x, widths, constant_values=value)


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
    causal=False,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    scale=None,
    dropout=None,
    return_weights=False,
):
    """Block-sparse softmax attention over projected multi-head tensors.

    Args:
        query: `(B, Tq, H, D)`.
        key: `(B, Tv, H, D)`.
        value: `(B, Tv, H, Dv)`.
        block_size: tokens per block. Lengths need not be multiples: the
            inputs are padded internally and the padding is masked.
        window_blocks, global_blocks, random_plan, causal: the pattern, see
            `block_plan`.
        global_tokens: tuple of token positions that are global in both
            directions (Longformer), or `None`. Positions past the sequence
            are ignored.
        query_mask: `(B, Tq)` boolean, or `None`. Masked query rows still get
            weights (the caller zeroes them); they do not change other rows.
        key_mask: `(B, Tv)` boolean, or `None`.
        attention_mask: `(B or 1, Tq, Tv)` boolean, or `None`. Honoured inside
            the pattern; it is itself `O(Tq * Tv)`.
        scale: score multiplier; default `1 / sqrt(D)`.
        dropout: callable applied to the attention weights before they
            multiply the values (e.g. a `Dropout` layer), or `None`.
        return_weights: also return the weights scattered into a dense
            `(B, H, Tq, Tv)` array. This is `O(Tq * Tv)`: for visualisation.

    Returns:
        `output (B, Tq, H, Dv)` and, with `return_weights`, the weights.
    """
    del query_mask  # Rows are independent; the caller zeroes masked rows.
    dtype = query.dtype
    head_dim = query.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    query_length = _length(query, 1)
    key_length = _length(key, 1)
    nq = _ceil_div(query_length, block_size)
    nk = _ceil_div(key_length, block_size)
    padded_query_length = nq * block_size
    padded_key_length = nk * block_size

    # (B, H, T, D) with the time axis padded to whole blocks.
    q = ops.transpose(_pad_time(query, padded_query_length), (0, 2, 1, 3))
    k = ops.transpose(_pad_time(key, padded_key_length), (0, 2, 1, 3))
    v = ops.transpose(_pad_time(value, padded_key_length), (0, 2, 1, 3))
    q = q * ops.cast(scale, dtype)
    batch, heads = ops.shape(q)[0], q.shape[1]

    key_valid = ops.less(ops.arange(padded_key_length), key_length)[None, :]
    if key_mask is not None:
        key_valid = ops.logical_and(
            key_valid,
            _pad_time(masking.to_bool_mask(key_mask), padded_key_length, value=False),
        )  # (B or 1, Tkp)
    if attention_mask is not None:
        attention_mask = masking.to_bool_mask(attention_mask)
        attention_mask = _pad_time(
            attention_mask, padded_query_length, axis=1, value=False
        )
        attention_mask = _pad_time(
            attention_mask, padded_key_length, axis=2, value=False
        )  # (B, Tqp, Tkp)
    query_positions = ops.arange(padded_query_length, dtype="int32")

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
    key_positions = (
        index[:, :, None] * block_size + ops.arange(block_size, dtype="int32")
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
    q_block_positions = ops.reshape(query_positions, (nq, block_size))
    if causal:
        block_mask = ops.logical_and(
            block_mask,
            ops.less_equal(
                key_positions[:, None, :], q_block_positions[:, :, None]
            )[None],
        )
    if attention_mask is not None:
        # (B, nq, bs, nk, bs) gathered to (B, nq, bs, S, bs).
        blocked = ops.reshape(
            attention_mask, (-1, nq, block_size, nk, block_size)
        )
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

    # Longformer global tokens as extra keys for every block row.
    tokens = tuple(sorted(set(global_tokens or ())))
    if tokens:
        token_positions = ops.convert_to_tensor(tokens, dtype="int32")  # (G,)
        token_index = ops.minimum(token_positions, padded_key_length - 1)
        token_valid = ops.take(key_valid, token_index, axis=1)  # (B or 1, G)
        token_valid = ops.logical_and(
            token_valid, ops.less(token_positions, key_length)[None]
        )
        token_block = token_positions // block_size
        covered = ops.any(
            ops.logical_and(
                ops.equal(index[:, :, None], token_block[None, None, :]),
                slot_valid[:, :, None],
            ),
            axis=1,
        )  # (nq, G): the token is already inside one of the row's blocks
        token_mask = ops.logical_and(
            token_valid[:, None, :], ops.logical_not(covered)[None]
        )[:, :, None, :]  # (B or 1, nq, 1, G)
        if causal:
            token_mask = ops.logical_and(
                token_mask,
                ops.less_equal(
                    token_positions[None, None, :], q_block_positions[:, :, None]
                )[None],
            )
        if attention_mask is not None:
            columns = ops.take(attention_mask, token_index, axis=2)  # (B, Tqp, G)
            token_mask = ops.logical_and(
                token_mask, ops.reshape(columns, (-1, nq, block_size, len(tokens)))
            )
        token_k = ops.take(k, token_index, axis=2)  # (B, H, G, D)
        token_v = ops.take(v, token_index, axis=2)
        token_scores = ops.einsum("bhiqd,bhgd->bhiqg", q_blocks, token_k)
        scores = ops.concatenate([scores, token_scores], axis=-1)
        full = (batch, nq, block_size)
        mask = ops.concatenate(
            [
                ops.broadcast_to(block_mask, full + (num_slots * block_size,)),
                ops.broadcast_to(token_mask, full + (len(tokens),)),
            ],
            axis=-1,
        )[:, None]
    weights = masking.masked_softmax(scores, mask)
    dropped = weights if dropout is None else dropout(weights)
    block_weights = dropped[..., : num_slots * block_size]
    output = ops.einsum("bhiqk,bhikd->bhiqd", block_weights, gathered_v)
    if tokens:
        output = output + ops.einsum(
            "bhiqg,bhgd->bhiqd", dropped[..., num_slots * block_size :], token_v
        )
    output = ops.reshape(output, (batch, heads, padded_query_length, v.shape[-1]))

    # ---------------------------------------------------- global query rows
    # Queries in the first `global_blocks` blocks and at `global_tokens`
    # attend to every key: a dense `(R, Tv)` strip, still linear in length.
    rows = tuple(sorted(set(range(global_blocks * block_size)) | set(tokens)))
    row_weights = None
    if rows:
        row_positions = ops.convert_to_tensor(rows, dtype="int32")  # (R,)
        row_index = ops.minimum(row_positions, padded_query_length - 1)
        row_q = ops.take(q, row_index, axis=2)  # (B, H, R, D)
        row_scores = ops.einsum("bhrd,bhkd->bhrk", row_q, k)
        row_mask = key_valid[:, None, :]  # (B or 1, 1, Tkp)
        if causal:
            row_mask = ops.logical_and(
                row_mask,
                ops.less_equal(
                    ops.arange(padded_key_length, dtype="int32")[None, :],
                    row_positions[:, None],
                )[None],
            )
        if attention_mask is not None:
            row_mask = ops.logical_and(
                row_mask, ops.take(attention_mask, row_index, axis=1)
            )
        row_weights = masking.masked_softmax(row_scores, row_mask[:, None])
        row_dropped = row_weights if dropout is None else dropout(row_weights)
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
    slot_one_hot = ops.one_hot(index, nk, dtype=weights.dtype) * ops.cast(
        slot_valid, weights.dtype
    )[:, :, None]  # (nq, S, nk)
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
