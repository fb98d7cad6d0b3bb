"""Exact softmax attention with the sequence sharded over devices (JAX).

Ring attention (Liu et al., 2023, https://arxiv.org/abs/2310.01889): the
sequence axis of the query, key and value is split over one axis of a
device mesh. Each device keeps its query block; the key/value blocks (and
their padding mask) travel round the ring with `jax.lax.ppermute`, one hop
per step, inside `jax.shard_map`. After `N` steps (`N` devices on the axis)
every query block has met every key block, and the per-row online softmax
(running maximum, running sum, running weighted sum, as the blockwise kernel
`memory_efficient.py`) gives exactly `softmax(q k^T * scale + mask) v`.

No device ever holds more than one `(T/N, T/N)` tile of logits, and each
step is checkpointed (`jax.checkpoint`): the backward pass, JAX's own
transpose of the ring (the transpose of a `ppermute` is the reverse
`ppermute`), recomputes each tile instead of storing it, so per-device
memory grows as `T/N`.

With `use_causal_mask=True`, a key block that lies entirely in the future of
the device's query block is skipped (`lax.cond`): its tile is never
computed, though the block still moves on round the ring.

JAX only: the collectives are JAX's. The engines' own pieces are used
throughout (`shard_map`, `ppermute`, the mesh of `keras.distribution`).
"""

import math

_INITIAL_MAX = -1e30  # finite: exp(m_old - m_new) is never exp(-inf + inf)


def _block_update(state, q, k, v, key_mask, q_start, k_start, causal):
    """One key/value block folded into the running softmax of a query block.

    `q`: `(B, bq, H, D)` (scaled), `k`/`v`: `(B, bk, H, D|Dv)`, `key_mask`:
    `(B, bk)` boolean or None; `q_start`/`k_start`: global positions of the
    blocks' first rows (for the causal mask).
    """
    import jax.numpy as jnp
    from jax import lax

    running_max, running_sum, acc = state
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    allowed = None
    if key_mask is not None:
        allowed = key_mask[:, None, None, :]
    if causal:
        rows = q_start + jnp.arange(q.shape[1])[:, None]
        cols = k_start + jnp.arange(k.shape[1])[None, :]
        future = (rows >= cols)[None, None]
        allowed = future if allowed is None else jnp.logical_and(allowed, future)
    if allowed is not None:
        logits = jnp.where(allowed, logits, -jnp.inf)
    # The shift cancels in the softmax: no gradient through the maximum.
    new_max = lax.stop_gradient(jnp.maximum(running_max, jnp.max(logits, axis=-1)))
    probs = jnp.exp(logits - new_max[..., None])
    correction = jnp.exp(running_max - new_max)
    running_sum = running_sum * correction + jnp.sum(probs, axis=-1)
    acc = acc * correction[..., None] + jnp.einsum("bhqk,bkhd->bhqd", probs, v)
    return new_max, running_sum, acc


def _ring(q, k, v, key_mask, query_mask, *, axis, num_devices, causal):
    """The per-device program: `q`/`k`/`v` are this device's blocks."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    index = lax.axis_index(axis)
    batch, q_block, heads, _ = q.shape
    k_block, value_dim = k.shape[1], v.shape[-1]
    rows = (batch, heads, q_block)
    state = (
        jnp.full(rows, _INITIAL_MAX, jnp.float32),
        jnp.zeros(rows, jnp.float32),
        jnp.zeros(rows + (value_dim,), jnp.float32),
    )
    q_start = index * q_block
    # Device i sends to i + 1: at step s, device i holds the block of i - s.
    permutation = [(i, (i + 1) % num_devices) for i in range(num_devices)]
    update = jax.checkpoint(
        lambda state, k, v, m, k_start: _block_update(
            state, q, k, v, m, q_start, k_start, causal),
    )
    for step in range(num_devices):
        source = (index - step) % num_devices
        k_start = source * k_block
        if causal:
            # Skip a block whose first key is after this block's last query.
            visible = k_start <= q_start + q_block - 1
            state = lax.cond(
                visible,
                lambda state, k, v, m, start: update(state, k, v, m, start),
                lambda state, k, v, m, start: state,
                state, k, v, key_mask, k_start,
            )
        else:
            state = update(state, k, v, key_mask, k_start)
        if step < num_devices - 1:
            k, v = lax.ppermute((k, v), axis, permutation)
            if key_mask is not None:
                key_mask = lax.ppermute(key_mask, axis, permutation)
    _, running_sum, acc = state
    # A row with no allowed key (sum 0) gets zeros, never NaN.
    attended = running_sum != 0.0
    out = jnp.where(
        attended[..., None],
        acc / jnp.where(attended, running_sum, 1.0)[..., None],
        0.0,
    )
    out = jnp.transpose(out, (0, 2, 1, 3))  # (B, bq, H, Dv)
    if query_mask is not None:
        out = jnp.where(query_mask[:, :, None, None], out, 0.0)
    return out


def ring_attention(
    query,
    key,
    value,
    *,
    mesh,
    sequence_axis="sequence",
    batch_axis=None,
    scale=None,
    query_mask=None,
    key_mask=None,
    use_causal_mask=False,
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
        query_mask: `(B, Tq)` boolean, `False` rows get zero output.
        key_mask: `(B, Tk)` boolean, `False` keys are never attended.
        use_causal_mask: query `i` attends keys `j <= i` only.

    Returns:
        `(B, Tq, H, Dv)` in the dtype of `query`; rows with no allowed key
        are zeros.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    num_devices = mesh.shape[sequence_axis]
    dtype = query.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    q = jnp.asarray(query, jnp.float32) * scale
    k = jnp.asarray(key, jnp.float32)
    v = jnp.asarray(value, jnp.float32)
    sequences = P(batch_axis, sequence_axis)
    blocks = P(batch_axis, sequence_axis, None, None)
    masks = [
        None if mask is None else jnp.asarray(mask, bool)
        for mask in (key_mask, query_mask)
    ]
    present = [mask is not None for mask in masks]

    def per_device(q, k, v, *given):
        given = iter(given)
        key_mask, query_mask = (next(given) if p else None for p in present)
        return _ring(q, k, v, key_mask, query_mask, axis=sequence_axis,
                     num_devices=num_devices, causal=use_causal_mask)

    program = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(blocks, blocks, blocks) + (sequences,) * sum(present),
        out_specs=blocks,
        check_vma=False,
    )
    out = program(q, k, v, *(mask for mask in masks if mask is not None))
    return out.astype(dtype)


def check_sequence_mesh(error, argument, axis, query_shape, key_shape):
    """The current distribution's `DeviceMesh`, checked for ring attention.

    `error(message)` formats the caller's message (naming its class). Raises
    a ValueError naming `argument`, the mesh and the shapes when there is no
    JAX distribution, the mesh lacks `axis`, or its size does not divide a
    (static) sequence length.
    """
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError(error(
            f"`{argument}` (ring attention) needs the JAX backend. Received: "
            f"{argument}={axis!r}, KERAS_BACKEND={keras.backend.backend()!r}"))
    distribution = keras.distribution.distribution()
    if distribution is None:
        raise ValueError(error(
            f"`{argument}={axis!r}` needs a keras.distribution whose device "
            "mesh has that axis (e.g. `with keras.distribution.ModelParallel("
            "...).scope():`). Received: no distribution set"))
    mesh = distribution.device_mesh
    described = (f"DeviceMesh(shape={tuple(mesh.shape)}, "
                 f"axis_names={tuple(mesh.axis_names)})")
    if axis not in mesh.axis_names:
        raise ValueError(error(
            f"`{argument}` must name an axis of the device mesh {described}. "
            f"Received: {argument}={axis!r}"))
    size = dict(zip(mesh.axis_names, mesh.shape))[axis]
    for name, shape in (("projected query", query_shape),
                        ("projected key", key_shape)):
        length = shape[1]
        if length is None or length % size:
            raise ValueError(error(
                f"the mesh axis {axis!r} of size {size} ({described}) must "
                f"divide the {name} length. Received: {argument}={axis!r}, "
                f"{name} with shape {tuple(shape)}"))
    return mesh
