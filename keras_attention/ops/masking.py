"""Mask helpers shared by every attention layer.

Masks here are boolean: `True` means "may attend". They are combined by logical
AND, and the softmax is computed in float32 so that float16 and bfloat16 models
never overflow or produce NaN for fully masked rows.
"""

from keras import ops

from keras_attention.ops import checks

# One masked softmax and one empty-safe row maximum, shared with the chunked
# kernels' online softmax.
from keras_attention.ops.online_softmax import masked_softmax  # noqa: F401
from keras_attention.ops.online_softmax import row_max  # noqa: F401


def to_bool_mask(mask):
    """Returns `mask` as a boolean tensor (`None` passes through)."""
    if mask is None:
        return None
    checks.mask("to_bool_mask", "mask", mask)
    if "bool" in str(mask.dtype):
        return mask
    return ops.not_equal(mask, 0)


def score_dtype(dtype):
    """The dtype logits are formed in: float32 for half-precision inputs.

    float16 overflows (max 65504) on large logits (`q . k` of inputs ~100)
    and bfloat16 keeps 8 bits of them; the softmax already runs in float32,
    so the logits are formed there too. Other dtypes are kept.
    """
    dtype = str(getattr(dtype, "name", dtype))
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def zero_masked(x, mask):
    """`x` with the positions where `mask` is False set to exactly zero.

    `x` is `(B, T, ...)` and `mask` `(B|1, T)` (or None). A `where`, not a
    product: `0 * NaN` is NaN, and a masked position must contribute nothing,
    whatever it holds, to the forward pass and to every gradient.
    """
    if mask is None:
        return x
    mask = to_bool_mask(mask)
    for _ in range(len(x.shape) - len(mask.shape)):
        mask = ops.expand_dims(mask, -1)
    return ops.where(mask, x, ops.zeros((), dtype=x.dtype))


def confine_nonfinite(key, value):
    """`(key, value)` whose NaN/Inf reach only the queries that see them.

    `key` is `(B, Tk, ..., D)` and `value` `(B, Tk, ..., Dv)`: one position
    per index of every axis but the last. A key hidden from a query by a
    per-query mask (`attention_mask`, causal, a sliding window, a sparse
    pattern) gets weight 0, but `0 * NaN` is NaN in the weighted sum, so a
    non-finite value would reach every query. Here a position whose key or
    value holds a non-finite number gets a NaN key and a zero value: a query
    that sees it gets a NaN logit, hence a NaN output (a diverging model
    stays visible), and one that does not has that logit replaced by the
    mask's `where` and adds `0 * 0`. Kernels must mask logits with `where`
    (ours and Keras' `dot_product_attention` do), not by adding a large
    negative number (`NaN - 1e9` is NaN).

    Cheap (`O(Tk * D)`, against the kernel's `O(Tq * Tk * D)`) and exact:
    finite inputs come back unchanged (`key + 0`), and applying it twice
    changes nothing. Only the forward pass is confined: the gradient with
    respect to a query still meets `0 * NaN` at a hidden NaN key.
    """
    # Tensors first: NumPy would warn on the `inf * 0` that is the point here.
    key, value = ops.convert_to_tensor(key), ops.convert_to_tensor(value)
    # `x * 0` is 0 for a finite x and NaN otherwise: the sum over the
    # features flags a position without the overflow a plain sum could hit.
    flag = ops.sum(key * 0, axis=-1) + ops.cast(ops.sum(value * 0, axis=-1), key.dtype)
    key = key + ops.expand_dims(ops.stop_gradient(flag), -1)
    value = ops.where(ops.isfinite(value), value, ops.zeros((), dtype=value.dtype))
    return key, value


def is_statically_empty(*tensors):
    """Whether any of `tensors` has a dimension known to be 0."""
    return any(0 in tuple(t.shape) for t in tensors if t is not None)


def empty_attention(query, value, return_weights=False):
    """The result of attention with no query or no key: zeros, right shapes.

    `query` is `(B, Tq, H, D)` and `value` `(B, Tk, Hkv, Dv)`; the output is
    `(B, Tq, H, Dv)` (what a row with every key masked gets), and the weights
    `(B, H, Tq, Tk)`.
    """
    batch, q_len = ops.shape(query)[0], ops.shape(query)[1]
    heads, k_len = query.shape[2], ops.shape(value)[1]
    output = ops.zeros((batch, q_len, heads, value.shape[-1]), dtype=query.dtype)
    if not return_weights:
        return output
    return output, ops.zeros((batch, heads, q_len, k_len), dtype=query.dtype)


def merge_masks(*masks):
    """ANDs together the masks that are not `None`; broadcasting applies.

    Returns `None` when every mask is `None`.
    """
    for index, mask in enumerate(masks):
        checks.mask("merge_masks", f"masks[{index}]", mask)
    given = [(f"masks[{i}]", m) for i, m in enumerate(masks) if m is not None]
    if len(given) > 1:
        checks.broadcastable("merge_masks", *zip(*given, strict=True))
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = to_bool_mask(mask)
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def causal_mask(query_length, key_length):
    """A `(1, Tq, Tk)` boolean lower-triangular mask: query `i` sees keys `j <= i`.

    This is the convention of `keras.layers.MultiHeadAttention`.
    """
    query_length = checks.length("causal_mask", "query_length", query_length)
    key_length = checks.length("causal_mask", "key_length", key_length)
    rows = ops.expand_dims(ops.arange(query_length), 1)
    cols = ops.expand_dims(ops.arange(key_length), 0)
    return ops.expand_dims(ops.greater_equal(rows, cols), 0)
