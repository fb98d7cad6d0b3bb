"""Multi-head dot-product attention over projected heads, exact version.

Shapes follow `keras.layers.MultiHeadAttention`: projected queries are
`(B, Tq, H, D)`, keys `(B, Tk, Hkv, D)` and values `(B, Tk, Hkv, Dv)`, where
`Hkv` divides `H` (grouped-query attention when `Hkv < H`). Query head `h`
uses key/value head `h // (H // Hkv)`, the convention of
`keras.layers.GroupedQueryAttention` (heads repeated consecutively).

Grouped heads are never repeated in memory: the query is viewed as
`(B, Tq, Hkv, G, D)` with `G = H // Hkv` and the group axis rides along.
"""

from keras import ops


def repeat_key_value_heads(x, num_heads):
    """Repeats `(B, T, Hkv, D)` key/value heads to `(B, T, num_heads, D)`.

    For kernels that need one key/value head per query head; head `h` gets
    key/value head `h // (num_heads // Hkv)`.
    """
    groups = num_heads // x.shape[2]
    if groups == 1:
        return x
    return ops.repeat(x, groups, axis=2)


def _split_groups(query, num_key_value_heads):
    # (B, Tq, H, D) -> (B, Tq, Hkv, G, D)
    shape = ops.shape(query)
    groups = query.shape[2] // num_key_value_heads
    return ops.reshape(query, (-1, shape[1], num_key_value_heads, groups, query.shape[-1]))


def multi_head_logits(query, key):
    """Attention logits `(B, H, Tq, Tk)` from `(B, Tq, H, D)` and `(B, Tk, Hkv, D)`.

    The caller applies any scaling to `query` first (cheaper than scaling the
    `(B, H, Tq, Tk)` logits).
    """
    num_heads, num_kv_heads = query.shape[2], key.shape[2]
    if num_heads == num_kv_heads:
        return ops.einsum("bqhd,bkhd->bhqk", query, key)
    grouped = _split_groups(query, num_kv_heads)
    logits = ops.einsum("bqhgd,bkhd->bhgqk", grouped, key)  # (B, Hkv, G, Tq, Tk)
    shape = ops.shape(logits)
    return ops.reshape(logits, (-1, num_heads, shape[3], shape[4]))


def multi_head_weighted_sum(weights, value):
    """`(B, H, Tq, Tk)` weights times `(B, Tk, Hkv, Dv)` values -> `(B, Tq, H, Dv)`."""
    num_heads, num_kv_heads = weights.shape[1], value.shape[2]
    if num_heads == num_kv_heads:
        return ops.einsum("bhqk,bkhd->bqhd", weights, value)
    groups = num_heads // num_kv_heads
    shape = ops.shape(weights)
    grouped = ops.reshape(weights, (-1, num_kv_heads, groups, shape[2], shape[3]))
    output = ops.einsum("bhgqk,bkhd->bqhgd", grouped, value)  # (B, Tq, Hkv, G, Dv)
    return ops.reshape(output, (-1, shape[2], num_heads, value.shape[-1]))
