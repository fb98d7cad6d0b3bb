"""Exact softmax attention with the sequence sharded over devices (JAX).

Ring attention (Liu et al., 2023, https://arxiv.org/abs/2310.01889): the
sequence axis of the query, key and value is split over one axis of a
device mesh. Each device keeps its query block; the key/value blocks (and
their padding mask) travel round the ring with `jax.lax.ppermute`, one hop
per step, inside `jax.shard_map`. After `N` steps (`N` devices on the axis)
every query block has met every key block, and the per-row online softmax
(running maximum, running sum, running weighted sum, as the blockwise kernel
`memory_efficient.py`) gives exactly `softmax(q k^T * scale + mask) v`.

Each step's (query block, key block) attention is the tiled engine's
(`tiled_engine.TiledSweep`, the blockwise kernel's), with the tile plan of
the block's absolute positions and its statistics; the steps are merged by
their rows' log-sum-exps (`online_softmax.merge_attention`). No device ever
holds more than one engine tile of logits, and the engine's recomputing
backward, inside JAX's own transpose of the ring (the transpose of a
`ppermute` is the reverse `ppermute`), keeps per-device memory linear in
`T/N`. Every rule and score modifier of the engine applies on the ring.

The masks come as one `AttentionMask`; a key block that lies wholly outside
what the device's queries may see (in their future, with the causal rule) is
skipped (`lax.cond`): its tile is never computed, though the block still
moves on round the ring.

JAX only: the collectives are JAX's. The engines' own pieces are used
throughout (`shard_map`, `ppermute`, the mesh of `keras.distribution`).
"""

import functools
import math

from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import checks
from keras_attention.ops import online_softmax
from keras_attention.ops import tiled_engine
from keras_attention.ops import tiling
from keras_attention.ops.score_modifier import ScoreModifier

# Queries and keys per tile of the engine inside each device's block.
_RING_TILE = 512


def _block_update(q, k, v, key_mask, rows, cols, mask, modifier=None, extra=None, key_tile=None):
    """A query block's attention over the key block a device holds, by the
    tiled engine: `(out (B, bq, H, Dv), {"logsumexp", "max"} (B, H, bq))`,
    both float32.

    `q`: `(B, bq, H, D)` (scaled), `k`/`v`: `(B, bk, H, D|Dv)`, `key_mask`:
    `(B, bk)` boolean or None; `rows`: the queries' absolute positions
    (contiguous), `cols` the keys' (a zigzag block's two halves), for the
    rules of the `AttentionMask` `mask` and the `ScoreModifier` `modifier`
    (without sinks: the ring adds them once). `extra`: `{"batch": (B,)
    global example indices, "query_ids" / "key_ids": the blocks' segment
    ids}`; `key_tile`: the engine's keys per tile (a zigzag half at most).
    The tile plan of these positions (`_part_plan`) skips the tiles the
    rules hide, and the engine's recomputing backward keeps memory linear.
    """
    extra = extra or {}
    part = mask.replace(
        query_offset=rows[0],
        key_positions=cols[None, :],
        key_mask=key_mask,
        query_segment_ids=extra.get("query_ids"),
        key_segment_ids=extra.get("key_ids"),
    )
    q_block = min(_RING_TILE, q.shape[1])
    k_block = min(_RING_TILE, key_tile or k.shape[1])
    sweep = tiled_engine.TiledSweep(
        q,
        k,
        v,
        part,
        scale=1.0,
        q_block=q_block,
        k_block=k_block,
        modifier=modifier,
        keep=None,
        stats=True,
        examples=extra.get("batch"),
    )
    return sweep.run(_part_plan(part, q.shape, k.shape, q_block, k_block, extra.get("batch")))


def _part_plan(part, q_shape, k_shape, q_block, k_block, examples):
    """The tile plan of one ring step's part (its own function: the tests
    count the tiles each device visits through it)."""
    batch, q_len, heads = q_shape[0], q_shape[1], q_shape[2]
    return tiling.build(part, q_len, k_shape[1], q_block, k_block, batch, heads, examples=examples)


def _block_positions(index, block, parts, num_devices):
    """Absolute positions of device `index`'s block, part by part.

    One part: the contiguous block `index`. Two parts (zigzag): half-blocks
    `index` and `2N - 1 - index` of `2N`, so that under the causal rule every
    device has the same work (see `ring_attention`).
    """
    import jax.numpy as jnp

    if parts == 1:
        return [index * block + jnp.arange(block, dtype=jnp.int32)]
    half = block // 2
    return [
        index * half + jnp.arange(half, dtype=jnp.int32),
        (2 * num_devices - 1 - index) * half + jnp.arange(half, dtype=jnp.int32),
    ]


def _ring(
    q,
    k,
    v,
    key_mask,
    query_mask,
    *,
    axis,
    num_devices,
    mask,
    parts,
    modifier=None,
    batch_axis=None,
    query_ids=None,
    key_ids=None,
    sinks=None,
    weights=(),
    stats=False,
):
    """The per-device program: `q`/`k`/`v` are this device's blocks.

    With `parts=2` (zigzag), each block is two half-blocks far apart in the
    sequence; every (query half, key half) tile is folded in on its own and
    skipped when the description hides it whole. Key segment ids travel
    round the ring with the keys; sinks and the score_mod's weights are the
    same on every device.
    """
    import jax.numpy as jnp
    from jax import lax

    index = lax.axis_index(axis)
    batch, q_block, heads, _ = q.shape
    k_block, value_dim = k.shape[1], v.shape[-1]
    q_size, k_size = q_block // parts, k_block // parts
    offset = mask.query_offset
    rows = [offset + r for r in _block_positions(index, q_block, parts, num_devices)]
    q_parts = [q[:, p * q_size : (p + 1) * q_size] for p in range(parts)]
    id_parts = [
        None if query_ids is None else query_ids[:, p * q_size : (p + 1) * q_size]
        for p in range(parts)
    ]
    # The examples' global indices (a `mask_mod`, a prefix per example).
    examples = jnp.arange(batch, dtype=jnp.int32)
    if batch_axis is not None:
        examples = examples + lax.axis_index(batch_axis) * batch
    row_shape = (batch, heads, q_size)
    # The merged attention of each query part so far: a learned sink is a
    # part of its own (logit `sink[h]`, a zero value), counted once.
    start = jnp.full(row_shape, -jnp.inf, jnp.float32)
    if sinks is not None:
        start = jnp.broadcast_to(jnp.reshape(sinks, (1, heads, 1)), row_shape)
    merged = [
        (
            jnp.zeros((batch, q_size, heads, value_dim), jnp.float32),
            {"logsumexp": start, "max": start},
        )
        for _ in range(parts)
    ]
    if modifier is not None:
        modifier = ScoreModifier(
            soft_cap=modifier.soft_cap,
            alibi_slopes=modifier.alibi_slopes,
            score_mod=modifier.score_mod,
            score_mod_weights=tuple(weights),
        )
    # Device i sends to i + 1: at step s, device i holds the block of i - s.
    permutation = [(i, (i + 1) % num_devices) for i in range(num_devices)]

    def nothing(q_part):
        empty = jnp.full(row_shape, -jnp.inf, jnp.float32)
        return jnp.zeros(q_part.shape[:3] + (value_dim,), jnp.float32), {
            "logsumexp": empty,
            "max": empty,
        }

    def visible(rows, cols):
        """Whether a row of `rows` may see a key of `cols` (both contiguous)."""
        start, stop = mask.key_range(rows[0], rows[-1])
        seen = cols[-1] >= start
        return seen if stop is None else jnp.logical_and(seen, cols[0] < stop)

    def attend(q_part, k, v, rows, cols, key_mask, q_ids, k_ids):
        extra = {"batch": examples, "query_ids": q_ids, "key_ids": k_ids}
        return _block_update(
            q_part, k, v, key_mask, rows, cols, mask, modifier, extra, key_tile=k_size
        )

    for step in range(num_devices):
        source = (index - step) % num_devices
        cols = _block_positions(source, k_block, parts, num_devices)
        every_col = cols[0] if parts == 1 else jnp.concatenate(cols)
        for qp in range(parts):
            operands = (q_parts[qp], k, v, rows[qp], every_col, key_mask, id_parts[qp], key_ids)
            if mask.has_positional:
                seen = [visible(rows[qp], c) for c in cols]
                part = lax.cond(
                    functools.reduce(jnp.logical_or, seen),
                    attend,
                    lambda q_part, *rest: nothing(q_part),
                    *operands,
                )
            else:
                part = attend(*operands)
            merged[qp] = online_softmax.merge_attention(
                [merged[qp][0], part[0]], [merged[qp][1], part[1]]
            )
        if step < num_devices - 1:
            k, v = lax.ppermute((k, v), axis, permutation)
            if key_mask is not None:
                key_mask = lax.ppermute(key_mask, axis, permutation)
            if key_ids is not None:
                key_ids = lax.ppermute(key_ids, axis, permutation)
    out = jnp.concatenate([m[0] for m in merged], axis=1)  # (B, bq, H, Dv)
    if query_mask is not None:
        out = jnp.where(query_mask[:, :, None, None], out, 0.0)
    if not stats:
        return out
    return (out,) + _row_statistics(merged, query_mask)


def _row_statistics(merged, query_mask):
    """`(logsumexp, max)`, each `(B, H, bq)`, of the device's rows (the
    definition of `dense_attention.row_statistics`: `-inf` for a row with no
    key, a row its query mask hides included)."""
    import jax
    import jax.numpy as jnp

    lse = jnp.concatenate([m[1]["logsumexp"] for m in merged], axis=2)
    peak = jax.lax.stop_gradient(jnp.concatenate([m[1]["max"] for m in merged], axis=2))
    if query_mask is not None:
        hidden = jnp.logical_not(query_mask[:, None, :])
        lse, peak = jnp.where(hidden, -jnp.inf, lse), jnp.where(hidden, -jnp.inf, peak)
    return lse, peak


BALANCES = ("auto", "zigzag", "contiguous")


def _check_arguments(
    query, key, value, mesh, sequence_axis, batch_axis, scale, mask, balance, modifier=None
):
    """`ring_attention`'s arguments, before JAX sees them: a typo in
    `balance` would silently lose the load balancing, and a length the mesh
    does not divide would surface as `shard_map`'s error. Returns the mask
    (an empty `AttentionMask` for None)."""
    owner = "ring_attention"
    checks.choice(owner, "balance", balance, BALANCES)
    checks.scale(owner, scale)
    if mask is not None and not isinstance(mask, attention_masks.AttentionMask):
        raise TypeError(
            f"{owner}: `mask` must be an AttentionMask (see AttentionMask.from_tensors) "
            f"or None. Received: mask={mask!r}"
        )

    for name, x in (("query", query), ("key", key), ("value", value)):
        checks.tensor(owner, name, x, rank=4)
    checks.same_size(owner, ("query", query, -1, "head size"), ("key", key, -1, None))
    checks.same_size(owner, ("key", key, 1, "length"), ("value", value, 1, None))
    checks.same_size(owner, ("query", query, 2, "number of heads"), ("key", key, 2, None))
    checks.same_size(owner, ("key", key, 2, "number of heads"), ("value", value, 2, None))
    if not (hasattr(mesh, "shape") and hasattr(mesh, "axis_names")) or isinstance(
        mesh, (str, bytes)
    ):
        raise TypeError(
            f"{owner}: `mesh` must be a jax.sharding.Mesh (e.g. "
            f"`DeviceMesh.backend_mesh`). Received: mesh={mesh!r}"
        )
    sizes = dict(mesh.shape)
    described = f"mesh of shape {sizes}"
    for name, axis in (("sequence_axis", sequence_axis), ("batch_axis", batch_axis)):
        if axis is None and name == "batch_axis":
            continue
        if axis not in mesh.axis_names:
            raise ValueError(
                f"{owner}: `{name}` must name an axis of the {described}. Received: {name}={axis!r}"
            )
    size = sizes[sequence_axis]
    for name, x in (("query", query), ("key", key)):
        length = x.shape[1]
        if length is not None and length % size:
            raise ValueError(
                f"{owner}: the mesh axis {sequence_axis!r} of size {size} ({described}) "
                f"must divide the {name} length. Received: {name} with shape "
                f"{tuple(x.shape)}, sequence_axis={sequence_axis!r}"
            )
    if batch_axis is not None:
        batch = query.shape[0]
        if batch is not None and batch % sizes[batch_axis]:
            raise ValueError(
                f"{owner}: the mesh axis {batch_axis!r} of size {sizes[batch_axis]} "
                f"({described}) must divide the batch size. Received: query with shape "
                f"{tuple(query.shape)}, batch_axis={batch_axis!r}"
            )
    if mask is None:
        mask = attention_masks.AttentionMask()
    if mask.pair_mask is not None or mask.key_positions is not None:
        raise ValueError(
            "ring_attention takes query and key masks and positional rules "
            "only; a (Tq, Tk) pair mask would be whole on every device, and the "
            "ring places keys at their indices (no `key_positions`)."
        )
    if modifier is not None and not isinstance(modifier, ScoreModifier):
        raise TypeError(
            "ring_attention: `modifier` must be a ScoreModifier or None. "
            f"Received: modifier={modifier!r}"
        )
    return mask


def zigzag_order(length, num_devices):
    """The sequence order that gives device `i` half-blocks `i` and `2N-1-i`."""
    import numpy as np

    half = length // (2 * num_devices)
    blocks = []
    for i in range(num_devices):
        blocks += [
            np.arange(i * half, (i + 1) * half),
            np.arange((2 * num_devices - 1 - i) * half, (2 * num_devices - i) * half),
        ]
    return np.concatenate(blocks)


def ring_attention(
    query,
    key,
    value,
    *,
    mesh,
    sequence_axis="sequence",
    batch_axis=None,
    scale=None,
    mask=None,
    balance="auto",
    modifier=None,
    return_statistics=False,
):
    """Exact multi-head softmax attention, the sequence sharded over `mesh`.

    Args:
        query: `(B, Tq, H, D)` projected queries.
        key: `(B, Tk, H, D)` projected keys (one key head per query head).
        value: `(B, Tk, H, Dv)` projected values.
        mesh: a `jax.sharding.Mesh` (e.g. `DeviceMesh.backend_mesh`).
        sequence_axis: the mesh axis the sequences are split over; its size
            `N` must divide `Tq` and `Tk`.
        batch_axis: a mesh axis the batch is split over, or None.
        scale: multiplies the logits; defaults to `1 / sqrt(D)`.
        mask: an `AttentionMask` (`AttentionMask.from_tensors` builds one
            from Keras' spellings) with any rule but a pair mask (which
            would be whole on every device): query/key masks, segment ids
            (the keys' travel round the ring), positional rules, a prefix
            per example and a `mask_mod` (its batch index is the global
            one); or None. Query rows its query mask hides get zero output.
        balance: `"auto"` (zigzag under the causal rule for self-attention
            whose length `2N` divides, else contiguous), `"zigzag"` or
            `"contiguous"`. Zigzag gives device `i` the half-blocks `i` and
            `2N - 1 - i`, as context-parallel training does, so that every
            device computes the same number of tiles under the causal rule
            (`2N + 1` half-tiles each); contiguous blocks give device `i`
            `i + 1` tiles.
        modifier: a `ScoreModifier` (soft cap, ALiBi, learned sinks, a
            `score_mod` and its weights, applied to each tile at its
            absolute positions and global example indices), or None.
        return_statistics: also return each row's log-sum-exp and maximum,
            `(B, H, Tq)` float32, from the ring's running softmax (as the
            other exact kernels define them: `-inf` for a row with no key;
            the log-sum-exp carries its gradient), e.g. for
            `ops.merge_attention`.

    Returns:
        `(B, Tq, H, Dv)` in the dtype of `query`; rows with no allowed key
        are zeros. With `return_statistics`, `(output, {"logsumexp",
        "max"})`.
    """
    mask = _check_arguments(
        query, key, value, mesh, sequence_axis, batch_axis, scale, mask, balance, modifier
    )
    import jax.numpy as jnp

    num_devices = mesh.shape[sequence_axis]
    dtype = query.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    q = jnp.asarray(query, jnp.float32) * scale
    k = jnp.asarray(key, jnp.float32)
    v = jnp.asarray(value, jnp.float32)
    sequence_inputs, shared_inputs = _device_inputs(mask, modifier, q.shape[0])
    weights = () if modifier is None else modifier.weights()
    positional = mask.replace(
        query_mask=None, key_mask=None, query_segment_ids=None, key_segment_ids=None
    )

    parts = _parts(balance, mask, q.shape[1], k.shape[1], num_devices)
    order = None
    if parts == 2:
        order = zigzag_order(q.shape[1], num_devices)
        q, k, v = (jnp.take(x, order, axis=1) for x in (q, k, v))
        sequence_inputs = {name: jnp.take(x, order, axis=1) for name, x in sequence_inputs.items()}
    names = sorted(sequence_inputs)
    shared = sorted(shared_inputs)

    def per_device(q, k, v, sequence_values, shared_values, weights):
        given = dict(zip(names, sequence_values, strict=True))
        common = dict(zip(shared, shared_values, strict=True))
        rules = positional
        if "prefix" in common:
            rules = rules.replace(prefix_length=common["prefix"])
        return _ring(
            q,
            k,
            v,
            given.get("key_mask"),
            given.get("query_mask"),
            axis=sequence_axis,
            num_devices=num_devices,
            mask=rules,
            parts=parts,
            modifier=modifier,
            batch_axis=batch_axis,
            query_ids=given.get("query_ids"),
            key_ids=given.get("key_ids"),
            sinks=common.get("sinks"),
            weights=weights,
            stats=return_statistics,
        )

    program = _sharded(
        per_device, mesh, batch_axis, sequence_axis, (names, shared, weights), return_statistics
    )
    out = program(
        q,
        k,
        v,
        tuple(sequence_inputs[n] for n in names),
        tuple(shared_inputs[n] for n in shared),
        tuple(weights),
    )
    return _in_sequence_order(out, order, dtype, return_statistics)


def _sharded(per_device, mesh, batch_axis, sequence_axis, inputs, return_statistics):
    """`per_device` as one program over `mesh`: queries, keys and values split
    by (batch, sequence), then the per-token inputs split the same way, the
    shared inputs and the modifier's weights whole on every device (`inputs`:
    the three lists' names or values, for their lengths)."""
    import jax
    from jax.sharding import PartitionSpec as P

    names, shared, weights = inputs
    sequences = P(batch_axis, sequence_axis)
    blocks = P(batch_axis, sequence_axis, None, None)
    rows = P(batch_axis, None, sequence_axis)  # (B, H, Tq) statistics
    return jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(
            blocks,
            blocks,
            blocks,
            tuple(sequences for _ in names),
            tuple(P() for _ in shared),
            tuple(P() for _ in weights),
        ),
        out_specs=(blocks, rows, rows) if return_statistics else blocks,
        check_vma=False,
    )


def _in_sequence_order(out, order, dtype, return_statistics):
    """The program's results back in sequence order (undoing the zigzag
    placement `order`), the output in `dtype`."""
    import jax.numpy as jnp
    import numpy as np

    back = None if order is None else np.argsort(order)
    statistics = None
    if return_statistics:
        out, lse, peak = out
        if back is not None:
            lse, peak = (jnp.take(x, back, axis=2) for x in (lse, peak))
        statistics = {"logsumexp": lse, "max": peak}
    if back is not None:
        out = jnp.take(out, back, axis=1)
    out = out.astype(dtype)
    return out if statistics is None else (out, statistics)


def _device_inputs(mask, modifier, batch):
    """`(sequence_inputs, shared_inputs)`: the per-device program sees its own
    blocks of the masks and segment ids (split along the sequence); the rules
    travel as the description without them, and a per-example prefix and
    the sink logits as inputs the same on every device."""
    import jax.numpy as jnp

    sequence_inputs = {
        "key_mask": mask.key_mask,
        "query_mask": mask.query_mask,
        "key_ids": mask.key_segment_ids,
        "query_ids": mask.query_segment_ids,
    }
    sequence_inputs = {
        name: jnp.asarray(x, bool if name.endswith("mask") else jnp.int32)
        for name, x in sequence_inputs.items()
        if x is not None
    }
    if sequence_inputs.keys() & {"key_ids", "query_ids"}:
        for name in ("key_ids", "query_ids"):  # one per example, like the inputs
            ids = sequence_inputs[name]
            sequence_inputs[name] = jnp.broadcast_to(ids, (batch,) + ids.shape[1:])
    shared_inputs = {}
    prefix = mask.prefix_length
    if prefix is not None and not isinstance(prefix, int):
        shared_inputs["prefix"] = jnp.asarray(prefix, jnp.int32)
    sinks = None if modifier is None else modifier.sinks()
    if sinks is not None:
        shared_inputs["sinks"] = jnp.asarray(sinks, jnp.float32)
    return sequence_inputs, shared_inputs


def _parts(balance, mask, query_length, key_length, num_devices):
    """2 (zigzag) or 1 (contiguous) blocks per device. Zigzag placement
    balances the causal rule's work over the devices (a contiguous split
    gives the last device N times the first's tiles)."""
    zigzag = balance == "zigzag" or (balance == "auto" and mask.causal)
    even = key_length == query_length and query_length % (2 * num_devices) == 0
    return 2 if zigzag and even else 1


def check_sequence_mesh(error, argument, axis, query_shape, key_shape):
    """The current distribution's `DeviceMesh`, checked for ring attention.

    `error(message)` formats the caller's message (naming its class). Raises
    a ValueError naming `argument`, the mesh and the shapes when there is no
    JAX distribution, the mesh lacks `axis`, or its size does not divide a
    (static) sequence length.
    """
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError(
            error(
                f"`{argument}` (ring attention) needs the JAX backend. Received: "
                f"{argument}={axis!r}, KERAS_BACKEND={keras.backend.backend()!r}"
            )
        )
    distribution = keras.distribution.distribution()
    if distribution is None:
        raise ValueError(
            error(
                f"`{argument}={axis!r}` needs a keras.distribution whose device "
                "mesh has that axis (e.g. `with keras.distribution.ModelParallel("
                "...).scope():`). Received: no distribution set"
            )
        )
    mesh = distribution.device_mesh
    described = f"DeviceMesh(shape={tuple(mesh.shape)}, axis_names={tuple(mesh.axis_names)})"
    if axis not in mesh.axis_names:
        raise ValueError(
            error(
                f"`{argument}` must name an axis of the device mesh {described}. "
                f"Received: {argument}={axis!r}"
            )
        )
    size = dict(zip(mesh.axis_names, mesh.shape, strict=True))[axis]
    for name, shape in (("projected query", query_shape), ("projected key", key_shape)):
        length = shape[1]
        if length is None or length % size:
            raise ValueError(
                error(
                    f"the mesh axis {axis!r} of size {size} ({described}) must "
                    f"divide the {name} length. Received: {argument}={axis!r}, "
                    f"{name} with shape {tuple(shape)}"
                )
            )
    return mesh


def check_batch_axis(error, mesh, batch_axis, batch_size):
    """Raises a ValueError naming the mesh when the mesh axis the batch is
    split over does not divide a (static) batch size."""
    if batch_axis is None or batch_size is None:
        return
    size = dict(zip(mesh.axis_names, mesh.shape, strict=True))[batch_axis]
    if batch_size % size:
        raise ValueError(
            error(
                f"the batch is split over the mesh axis {batch_axis!r} of size "
                f"{size} (DeviceMesh(shape={tuple(mesh.shape)}, axis_names="
                f"{tuple(mesh.axis_names)})), which must divide the batch size. "
                f"Received: a batch of {batch_size}"
            )
        )
