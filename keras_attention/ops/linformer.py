"""Linformer attention: keys and values projected along the sequence axis.

Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"
(https://arxiv.org/abs/2006.04768). Keys and values `(B, Tv, H, D)` are
mixed over time by learned `(max_length, k)` matrices into `k` summary
positions, and exact softmax attention runs over those: `O(Tq * k)`.
"""

import math

from keras import ops

from keras_attention.ops import checks
from keras_attention.ops import masking


def linformer_attention(
    query,
    key,
    value,
    key_projection,
    value_projection,
    *,
    key_mask=None,
    scale=None,
    dropout=None,
    return_weights=False,
):
    """Attention over sequence-projected keys and values.

    Args:
        query: `(B, Tq, H, D)`.
        key: `(B, Tv, H, D)`.
        value: `(B, Tv, H, Dv)`.
        key_projection, value_projection: `(max_length, k)` with
            `max_length >= Tv`; the first `Tv` rows are used.
        key_mask: `(B, Tv)` boolean or `None`. Masked keys and values are
            zeroed before the projection, so they contribute nothing.
        scale: score multiplier; default `1 / sqrt(D)`.
        dropout: callable applied to the `(B, H, Tq, k)` weights, or `None`.
        return_weights: also return the weights implied over the original
            positions, `P E^T` of shape `(B, H, Tq, Tv)` (the output equals
            these times `V` exactly; they are not a probability
            distribution, since `E` mixes positions).

    Returns:
        `output (B, Tq, H, Dv)`, and the implied weights on request.
    """
    owner = "linformer_attention"
    for name, x in (("query", query), ("key", key), ("value", value)):
        checks.tensor(owner, name, x, rank=4)
    for name, x in (("key_projection", key_projection), ("value_projection", value_projection)):
        checks.tensor(owner, name, x, rank=2)
    checks.same_size(owner, ("query", query, -1, "head size"), ("key", key, -1, None))
    checks.same_size(owner, ("key", key, 1, "length"), ("value", value, 1, None))
    checks.same_size(
        owner,
        ("key_projection", key_projection, 1, "projected length"),
        ("value_projection", value_projection, 1, None),
    )
    for name, projection in (
        ("key_projection", key_projection),
        ("value_projection", value_projection),
    ):
        rows, keys = projection.shape[0], key.shape[1]
        if rows is not None and keys is not None and rows < keys:
            raise ValueError(
                f"{owner}: `{name}` must have at least one row per key position "
                f"(max_length >= Tv). Received: {name} with shape "
                f"{tuple(projection.shape)}, key with shape {tuple(key.shape)}"
            )
    checks.mask(owner, "key_mask", key_mask, rank=2)
    scale = checks.scale(owner, scale)
    if dropout is not None and not callable(dropout):
        raise TypeError(
            f"{owner}: `dropout` must be a callable (such as a Dropout layer) or None. "
            f"Received: dropout={dropout!r}"
        )
    return_weights = checks.flag(owner, "return_weights", return_weights)
    dtype = query.dtype
    length = key.shape[1] if key.shape[1] is not None else ops.shape(key)[1]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    key_projection = ops.cast(key_projection[:length], dtype)  # (Tv, k)
    value_projection = ops.cast(value_projection[:length], dtype)
    # A `where`, not a product: a masked NaN contributes nothing.
    key = masking.zero_masked(key, key_mask)
    value = masking.zero_masked(value, key_mask)
    projected_key = ops.einsum("bthd,tk->bkhd", key, key_projection)
    projected_value = ops.einsum("bthd,tk->bkhd", value, value_projection)
    wide = masking.score_dtype(dtype)  # logits in float32 under half precision
    logits = ops.einsum(
        "bqhd,bkhd->bhqk",
        ops.cast(query, wide) * ops.cast(scale, wide),
        ops.cast(projected_key, wide),
    )
    weights = ops.cast(masking.masked_softmax(logits), dtype)  # float32 softmax
    dropped = weights if dropout is None else dropout(weights)
    output = ops.einsum("bhqk,bkhd->bqhd", dropped, projected_value)
    if not return_weights:
        return output
    implied = ops.einsum("bhqk,tk->bhqt", weights, value_projection)
    return output, implied
