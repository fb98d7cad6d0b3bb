"""Exact attention that forms the `(B, H, Tq, Tk)` logits: three kernels.

- `dense_attention`: ours, written out (logits in float32 under half
  precision, the masked softmax of `online_softmax`, dropout on the weights);
  the kernel that returns weights.
- `shifted_attention`: the output only, the softmax's normalisation moved
  after the weighted sum: logits shifted by their row maximum, exponentiated
  in one pass, times `[v, 1]` (the row sums in the same matmul), divided at
  `(B, Tq, H, Dv)`. No `(B, H, Tq, Tk)` division forward and one product
  backward, where a softmax's gradient takes several passes: the kernel for
  TensorFlow's XLA, whose softmax fusions were the slow part there
  (benchmarks/RESULTS.md).
- `composite_attention`: `keras.ops.dot_product_attention`, what Keras'
  layer runs when no weights are needed; with `flash_attention=True` the
  backend's fused kernel (JAX on GPU/TPU, torch CUDA).

All take the projected heads, `query (B, Tq, H, D)`, `key (B, Tk, Hkv, D)`,
`value (B, Tk, Hkv, Dv)` (grouped heads are not repeated where the backend
allows), and one `AttentionMask`. A row with no visible key gets zero weights
and a zero output on all three.

Each takes `modifier`, a `ScoreModifier` (soft cap, ALiBi, learned sinks, a
user `score_mod`) applied to the `(B, H, Tq, Tk)` logits before the mask;
Keras' `dot_product_attention` cannot apply one, so `composite_attention`
refuses it (the selector never sends it one).

`selected_weights` gives the exact weights of some heads and query rows only,
for a call that asks for them beside an output from any kernel.
"""

import keras
from keras import ops

from keras_attention.ops import masking
from keras_attention.ops import multi_head
from keras_attention.ops import online_softmax
from keras_attention.ops.masking import score_dtype

NO_TERM = float("-inf")  # the statistics of a row with nothing in its softmax


def _length(x, axis):
    return x.shape[axis] if x.shape[axis] is not None else ops.shape(x)[axis]


def _dense_mask(mask, query, key):
    """The `AttentionMask`'s dense form for `(B, Tq, H, D)` queries."""
    return mask.dense(
        _length(query, 1), _length(key, 1), batch_size=ops.shape(query)[0], heads=query.shape[2]
    )


def modified_logits(logits, mask, modifier, query_offset=0, heads=None):
    """`(B, H, Tq, Tk)` logits changed by the `ScoreModifier` `modifier`.

    Query row `i` is at absolute position `mask.query_offset + query_offset
    + i`; `heads` are the head numbers of the logits' head axis (default:
    all, in order).
    """
    if modifier is None or not modifier.changes_logits:
        return logits
    shape = ops.shape(logits)
    batch = ops.reshape(ops.arange(shape[0], dtype="int32"), (-1, 1, 1, 1))
    if heads is None:
        heads = ops.arange(logits.shape[1], dtype="int32")
    head = ops.reshape(ops.convert_to_tensor(heads, dtype="int32"), (1, -1, 1, 1))
    rows = ops.reshape(mask.query_positions(query_offset, logits.shape[2]), (1, 1, -1, 1))
    cols = mask.key_columns(logits.shape[3])[:, None, None, :]
    return modifier.apply(logits, batch, head, rows, cols)


def softmax_with_sinks(logits, allowed, sinks, fused=True):
    """The masked softmax of `(B, H, Tq, Tk)` logits, with one more logit per
    head (`sinks`, `(H,)`, or None) in each row's denominator; the weights of
    the keys only (a row may sum to less than 1)."""
    if sinks is None:
        return online_softmax.masked_softmax(logits, allowed, fused=fused)
    shape = ops.shape(logits)
    column = ops.broadcast_to(
        ops.reshape(ops.cast(sinks, logits.dtype), (1, -1, 1, 1)),
        (shape[0], logits.shape[1], shape[2], 1),
    )
    if allowed is not None:
        allowed = ops.concatenate(
            [ops.broadcast_to(allowed, shape), ops.ones_like(column, dtype="bool")], axis=-1
        )
    logits = ops.concatenate([logits, column], axis=-1)
    return online_softmax.masked_softmax(logits, allowed, fused=fused)[..., :-1]


def row_statistics(logits, allowed, sinks=None):
    """`{"logsumexp", "max"}`, each `(B, H, Tq)` float32: over every term of
    a row's softmax denominator (its visible keys' modified logits and the
    sink logit); `-inf` for a row with no term. The same on every kernel."""
    logits = online_softmax.mask_logits(ops.cast(logits, "float32"), allowed)
    if sinks is not None:
        shape = ops.shape(logits)
        column = ops.broadcast_to(
            ops.reshape(ops.cast(sinks, "float32"), (1, -1, 1, 1)),
            (shape[0], logits.shape[1], shape[2], 1),
        )
        logits = ops.concatenate([logits, column], axis=-1)
    return _statistics(logits)


def _statistics(logits):
    peak = online_softmax.row_max(logits, axis=-1, keepdims=True)
    seen = ops.greater(peak, online_softmax.MASKED_LOGIT / 2)
    shift = ops.stop_gradient(ops.where(seen, peak, 0.0))
    terms = ops.where(seen, ops.exp(logits - shift), 0.0)
    total = ops.sum(terms, axis=-1, keepdims=True)
    lse = ops.where(seen, shift + ops.log(ops.where(seen, total, 1.0)), NO_TERM)
    peak = ops.where(seen, peak, NO_TERM)
    return {"logsumexp": ops.squeeze(lse, -1), "max": ops.squeeze(ops.stop_gradient(peak), -1)}


def dense_attention(
    query, key, value, mask, *, scale, dropout=None, modifier=None, return_statistics=False
):
    """Materialised exact attention: `(output (B, Tq, H, Dv), weights)`.

    Args:
        query, key, value: projected heads (see the module docstring).
        mask: an `AttentionMask`.
        scale: multiplies the logits.
        dropout: a callable on the weights (training), or None.
        modifier: a `ScoreModifier`, or None.
        return_statistics: also return `row_statistics` (each row's
            log-sum-exp and maximum logit).

    Returns:
        The output and the `(B, H, Tq, Tk)` weights before dropout (and the
        statistics).
    """
    wide = score_dtype(query.dtype)
    logits = multi_head.multi_head_logits(
        ops.cast(query, wide) * ops.cast(scale, wide), ops.cast(key, wide)
    )
    logits = modified_logits(logits, mask, modifier)
    allowed = _dense_mask(mask, query, key)
    sinks = None if modifier is None else modifier.sinks(logits.dtype)
    weights = ops.cast(softmax_with_sinks(logits, allowed, sinks), value.dtype)
    dropped = weights if dropout is None else dropout(weights)
    output = multi_head.multi_head_weighted_sum(dropped, value)
    if return_statistics:
        return output, weights, row_statistics(logits, allowed, sinks)
    return output, weights


def shifted_attention(query, key, value, mask, *, scale, modifier=None, return_statistics=False):
    """Materialised exact attention, normalised after the weighted sum.

    Same arguments and result as `dense_attention(...)[0]` without dropout
    (with `return_statistics`, `(output, row_statistics)`).
    Each row's logits are shifted by their maximum (a constant to autodiff:
    the shift cancels), exponentiated in one pass, and multiplied by the
    values with an extra ones column, which gives the row sums in the same
    matmul; the `(B, Tq, H, Dv)` result is divided by them. The weights are
    never normalised, so none are returned; the backward pass is the
    matmuls' and one product with the stored exponentials. A row with no
    visible key gets zeros (and zero gradients); a NaN logit it may see makes
    it NaN, as the softmax kernels do.
    """
    if masking.is_statically_empty(query, key) and not return_statistics:
        return masking.empty_attention(query, value)
    dtype = value.dtype
    wide = score_dtype(query.dtype)
    query = ops.cast(query, wide) * ops.cast(scale, wide)
    logits = multi_head.multi_head_logits(query, ops.cast(key, wide))
    logits = modified_logits(logits, mask, modifier)
    allowed = _dense_mask(mask, query, key)
    logits = online_softmax.mask_logits(logits, allowed)
    shift = online_softmax.row_max(logits, axis=-1, keepdims=True)
    sinks = None if modifier is None else modifier.sinks(logits.dtype)
    if sinks is not None:  # (1, H, 1, 1): the sink is one more logit of the row
        sinks = ops.reshape(sinks, (1, -1, 1, 1))
        shift = ops.maximum(shift, sinks)
    # A row with no visible key has shift -inf: 0 instead (its terms are 0).
    shift = ops.stop_gradient(ops.where(ops.isfinite(shift), shift, 0.0))
    terms = ops.exp(logits - shift)
    value = ops.cast(value, wide)
    sums = multi_head.multi_head_weighted_sum(
        terms, online_softmax.append_column(value, ops.ones_like(value[..., 0]))
    )
    total = sums[..., -1:]
    attended = ops.not_equal(total, 0.0)  # before the sink: a row with no key is 0
    if sinks is not None:  # the sink's term, (B, H, Tq, 1) -> (B, Tq, H, 1)
        total = total + ops.transpose(ops.exp(sinks - shift), (0, 2, 1, 3))
    output = sums[..., :-1] / ops.where(attended, total, 1.0)
    output = ops.cast(ops.where(attended, output, 0.0), dtype)
    if not return_statistics:
        return output
    # The row sums came with the weighted sum: log-sum-exp = shift + log(total).
    total = ops.transpose(total[..., 0], (0, 2, 1))  # (B, H, Tq)
    seen = ops.greater(total, 0.0)
    lse = ops.where(seen, shift[..., 0] + ops.log(ops.where(seen, total, 1.0)), NO_TERM)
    peak = online_softmax.row_max(logits, axis=-1)
    if sinks is not None:
        peak = ops.maximum(peak, sinks[..., 0])
    peak = ops.where(seen, ops.stop_gradient(peak), NO_TERM)
    return output, {"logsumexp": ops.cast(lse, "float32"), "max": ops.cast(peak, "float32")}


def composite_attention(query, key, value, mask, *, scale, num_heads, flash_attention=None):
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
            query,
            key,
            value,
            scale=scale,
            is_causal=mask.causal,
            flash_attention=flash_attention,
        )
        return ops.cast(output, dtype)
    allowed = _dense_mask(mask, query, key)
    heads = num_heads if allowed.shape[1] != 1 else 1
    allowed = ops.broadcast_to(
        allowed, (ops.shape(query)[0], heads, _length(query, 1), _length(key, 1))
    )
    output = ops.dot_product_attention(
        query,
        key,
        value,
        mask=allowed,
        scale=scale,
        flash_attention=flash_attention,
    )
    # The backends spread a row with no allowed key uniformly: zero it.
    attended = ops.transpose(ops.any(allowed, axis=-1), (0, 2, 1))  # (B, Tq, H|1)
    output = ops.where(attended[..., None], output, ops.zeros((), output.dtype))
    return ops.cast(output, dtype)


def selected_weights(
    query, key, mask, *, scale, num_heads, heads=None, rows=None, dtype=None, modifier=None
):
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
    allowed = mask.dense(
        _length(query, 1),
        _length(key, 1),
        batch_size=ops.shape(query)[0],
        heads=num_heads if heads is None else heads,
    )
    query = ops.cast(query, "float32") * scale
    logits = ops.einsum("bqhd,bkhd->bhqk", query, ops.cast(key, "float32"))
    logits = modified_logits(logits, mask, modifier, heads=heads)
    sinks = None if modifier is None else modifier.sinks()
    if sinks is not None and heads is not None:
        sinks = ops.take(sinks, heads, axis=0)
    weights = softmax_with_sinks(logits, allowed, sinks, fused=False)
    return weights if dtype is None else ops.cast(weights, dtype)
