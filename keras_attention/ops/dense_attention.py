"""Exact attention that forms the `(B, H, Tq, Tk)` logits: three kernels.

- `dense_attention`: ours, written out (logits in float32 under half
  precision, the masked softmax of `online_softmax`, dropout on the weights);
  the kernel that returns weights.
- `shifted_attention`: the output only, without a softmax: each row's
  logits are shifted by a bound known before the matmul (`online_softmax.
  logit_bound`, as the blockwise kernel's fixed-shift path), exponentiated
  in one pass and normalised after the weighted sum, whose extra ones column
  gives the row sums. One elementwise pass over the logits forward and one
  backward, where a softmax takes a max, an exp, a sum and a division
  forward and as many backward; the kernel for TensorFlow's XLA, whose
  softmax fusions are the slow part there (benchmarks/RESULTS.md). A call
  whose rows are not all bounded runs `dense_attention` instead.
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

from keras_attention.ops import masking
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


def shifted_attention(query, key, value, mask, *, scale):
    """Materialised exact attention with a fixed shift per row: the output.

    Same arguments and result as `dense_attention(...)[0]` without dropout
    (the weights are never normalised, so none are returned). When every row
    satisfies `|q| max_j |k_j| <= online_softmax.FIXED_SHIFT_MAX` (after
    `scale`) and every value is finite, `exp(q . k - bound)` cannot overflow,
    and the largest term of a row is at least `exp(-2 * FIXED_SHIFT_MAX)`, a
    normal float32; otherwise (large or non-finite logits) the call runs
    `dense_attention`'s softmax. A row with no visible key gets zeros.
    """
    if masking.is_statically_empty(query, key):
        return masking.empty_attention(query, value)
    dtype = value.dtype
    wide = score_dtype(query.dtype)
    query = ops.cast(query, wide) * ops.cast(scale, wide)
    key = ops.cast(key, wide)
    value = ops.cast(value, wide)
    num_heads, num_kv_heads = query.shape[2], key.shape[2]
    # Per row: |q_i| * max_j |k_j| >= |q_i . k_j| (Cauchy-Schwarz), (B, H, Tq).
    query_norm = ops.sqrt(ops.sum(ops.square(query), axis=-1))  # (B, Tq, H)
    key_norm = ops.max(ops.sqrt(ops.sum(ops.square(key), axis=-1)), axis=1)  # (B, Hkv)
    key_norm = ops.repeat(key_norm, num_heads // num_kv_heads, axis=1)
    shift = ops.stop_gradient(
        ops.transpose(query_norm * ops.expand_dims(key_norm, 1), (0, 2, 1)))
    bounded = ops.logical_and(
        ops.all(shift <= online_softmax.FIXED_SHIFT_MAX),
        ops.all(ops.isfinite(value)))

    def shifted():
        logits = multi_head.multi_head_logits(query, key) - ops.expand_dims(shift, -1)
        allowed = mask.dense(_length(query, 1), _length(key, 1))
        terms = ops.exp(online_softmax.mask_logits(logits, allowed))
        # [v, 1]: the weighted sum and the row sum in one matmul.
        sums = multi_head.multi_head_weighted_sum(
            terms, online_softmax.append_column(value, ops.ones_like(value[..., 0])))
        total = sums[..., -1:]
        attended = ops.not_equal(total, 0.0)
        output = sums[..., :-1] / ops.where(attended, total, 1.0)
        return ops.cast(ops.where(attended, output, 0.0), dtype)

    def softmax():
        return ops.cast(_softmax_attention(query, key, value, mask), dtype)

    return ops.cond(bounded, shifted, softmax)


def _softmax_attention(query, key, value, mask):
    """`dense_attention`'s output for scaled, widened heads (no dropout)."""
    logits = multi_head.multi_head_logits(query, key)
    allowed = mask.dense(_length(query, 1), _length(key, 1))
    return multi_head.multi_head_weighted_sum(
        online_softmax.masked_softmax(logits, allowed), value)


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
