"""Exact attention that forms the `(B, H, Tq, Tk)` logits: two kernels.

- `dense_attention`: ours, written out (logits in float32 under half
  precision, the masked softmax of `online_softmax`, dropout on the weights);
  the kernel that returns weights, and the one XLA fuses best.
- `composite_attention`: `keras.ops.dot_product_attention`, what Keras'
  layer runs when no weights are needed; with `flash_attention=True` the
  backend's fused kernel (JAX on GPU/TPU, torch CUDA).

Both take the projected heads, `query (B, Tq, H, D)`, `key (B, Tk, Hkv, D)`,
`value (B, Tk, Hkv, Dv)` (grouped heads are not repeated where the backend
allows), and one `AttentionMask`. A row with no visible key gets zero weights
and a zero output on both.

`selected_weights` gives the exact weights of some heads and query rows only,
for a call that asks for them beside an output from any kernel.
"""

import keras
from keras import ops

from keras_attention.ops import multi_head
from keras_attention.ops.masking import score_dtype
from keras_attention.ops import online_softmax


def _length(x, axis):
    return x.shape[axis] if x.shape[axis] is not None else ops.shape(x)[axis]


def dense_attention(query, key, value, mask, *, scale, dropout=None):
    """Materialised exact attention: `(output (B, Tq, H, Dv), weights)`.

    Args:
        query, key, value: projected heads (see the module docstring).
        mask: an `AttentionMask`.
        scale: multiplies the logits.
        dropout: a callable on the weights (training), or None.

    Returns:
        The output and the `(B, H, Tq, Tk)` weights before dropout.
    """
    wide = score_dtype(query.dtype)
    logits = multi_head.multi_head_logits(
        ops.cast(query, wide) * ops.cast(scale, wide), ops.cast(key, wide)
    )
    allowed = mask.dense(_length(query, 1), _length(key, 1))
    weights = ops.cast(online_softmax.masked_softmax(logits, allowed), value.dtype)
    dropped = weights if dropout is None else dropout(weights)
    return multi_head.multi_head_weighted_sum(dropped, value), weights


def composite_attention(query, key, value, mask, *, scale, num_heads,
                        flash_attention=None):
    """`keras.ops.dot_product_attention` under one `AttentionMask`.

    `flash_attention=False` is the backend's composite (materialised)
    kernel, with logits in float32 under half precision as `dense_attention`;
    `True` / `None` let the backend pick its fused kernel.
    """
    dtype = query.dtype
    if flash_attention is False:
        wide = score_dtype(dtype)
        if wide != str(getattr(dtype, "name", dtype)):
            query, key, value = (ops.cast(x, wide) for x in (query, key, value))
    if keras.backend.backend() != "jax":  # only JAX takes grouped heads
        key = multi_head.repeat_key_value_heads(key, num_heads)
        value = multi_head.repeat_key_value_heads(value, num_heads)
    if mask.is_empty or mask.causal_only:  # the kernel's own causal mode
        output = ops.dot_product_attention(
            query, key, value, scale=scale, is_causal=mask.causal,
            flash_attention=flash_attention,
        )
        return ops.cast(output, dtype)
    allowed = mask.dense(_length(query, 1), _length(key, 1))
    heads = num_heads if allowed.shape[1] != 1 else 1
    allowed = ops.broadcast_to(
        allowed, (ops.shape(query)[0], heads, _length(query, 1), _length(key, 1))
    )
    output = ops.dot_product_attention(
        query, key, value, mask=allowed, scale=scale,
        flash_attention=flash_attention,
    )
    # The backends spread a row with no allowed key uniformly: zero it.
    attended = ops.transpose(ops.any(allowed, axis=-1), (0, 2, 1))  # (B, Tq, H|1)
    output = ops.where(attended[..., None], output, ops.zeros((), output.dtype))
    return ops.cast(output, dtype)


def selected_weights(query, key, mask, *, scale, num_heads, heads=None,
                     rows=None, dtype=None):
    """Exact weights of the query `heads` and `rows = (start, stop)` only.

    Each selected row's softmax is over all keys, so only
    `(B, len(heads), stop - start, Tk)` is ever formed.
    """
    if rows is not None:
        start, stop = rows
        query = query[:, start:stop]
        mask = mask.rows(start, stop)
    groups = num_heads // key.shape[2]
    if heads is not None:
        query = ops.take(query, heads, axis=2)
        key = ops.take(key, [h // groups for h in heads], axis=2)
        mask = mask.heads(heads)
    else:
        key = multi_head.repeat_key_value_heads(key, num_heads)
    allowed = mask.dense(_length(query, 1), _length(key, 1))
    query = ops.cast(query, "float32") * scale
    logits = ops.einsum("bqhd,bkhd->bhqk", query, ops.cast(key, "float32"))
    weights = online_softmax.masked_softmax(logits, allowed, fused=False)
    return weights if dtype is None else ops.cast(weights, dtype)
