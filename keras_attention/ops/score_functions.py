"""Score functions: how much query `i` should look at key `j`.

Each returns logits of shape `(B, Tq, Tk)` from a query `(B, Tq, dq)` and a key
`(B, Tk, dk)`. They are pure functions over `keras.ops`; the layers own the
weights and pass them in.
"""

from keras import ops

from keras_attention.ops import checks
from keras_attention.ops import masking


def _query_key(owner, query, key, query_name="query", key_name="key"):
    """Checks the `(B, Tq, dq)` query and `(B, Tk, dk)` key of a score op."""
    checks.tensor(owner, query_name, query, rank=3)
    checks.tensor(owner, key_name, key, rank=3)


def dot_score(query, key, scale=None):
    """`q . k`, optionally multiplied by `scale` (e.g. `1 / sqrt(d)`).

    Under half precision the logits are float32 (`masking.score_dtype`):
    `q . k` of large inputs overflows float16 before the softmax.
    """
    _query_key("dot_score", query, key)
    checks.same_size("dot_score", ("query", query, -1, "features"), ("key", key, -1, None))
    scale = checks.scale("dot_score", scale)
    wide = masking.score_dtype(query.dtype)
    logits = ops.einsum("bqd,bkd->bqk", ops.cast(query, wide), ops.cast(key, wide))
    if scale is not None:
        logits = logits * ops.cast(scale, logits.dtype)
    return logits


def general_score(query, key, kernel):
    """`q^T W k` with `kernel` of shape `(dq, dk)` (Luong's "general")."""
    _query_key("general_score", query, key)
    checks.tensor("general_score", "kernel", kernel, rank=2)
    checks.same_size("general_score", ("query", query, -1, "size"), ("kernel", kernel, 0, None))
    checks.same_size("general_score", ("key", key, -1, "size"), ("kernel", kernel, 1, None))
    return dot_score(ops.matmul(query, kernel), key)


def low_rank_score(query, key, query_kernel, key_kernel):
    """`(U q) . (V k)`: the rank-`r` factorisation `W = U^T V` of `q^T W k`.

    `query_kernel` is `(dq, r)` and `key_kernel` is `(dk, r)`.
    """
    owner = "low_rank_score"
    _query_key(owner, query, key)
    checks.tensor(owner, "query_kernel", query_kernel, rank=2)
    checks.tensor(owner, "key_kernel", key_kernel, rank=2)
    checks.same_size(owner, ("query", query, -1, "size"), ("query_kernel", query_kernel, 0, None))
    checks.same_size(owner, ("key", key, -1, "size"), ("key_kernel", key_kernel, 0, None))
    checks.same_size(
        owner, ("query_kernel", query_kernel, 1, "rank"), ("key_kernel", key_kernel, 1, None)
    )
    return dot_score(ops.matmul(query, query_kernel), ops.matmul(key, key_kernel))


def additive_score(projected_query, projected_key, score_vector):
    """`v^T tanh(Wq q + Wk k)` given the two projections already computed.

    Projecting first keeps the `(B, Tq, Tk, units)` intermediate at `units`
    wide, the smallest it can be, instead of `dq + dk` wide.

    Args:
        projected_query: `(B, Tq, units)`, `Wq q` (plus any bias).
        projected_key: `(B, Tk, units)`, `Wk k`.
        score_vector: `(units,)`, the vector `v`.
    """
    owner = "additive_score"
    _query_key(owner, projected_query, projected_key, "projected_query", "projected_key")
    checks.tensor(owner, "score_vector", score_vector, rank=1)
    for name, x in (("projected_query", projected_query), ("projected_key", projected_key)):
        checks.same_size(owner, (name, x, -1, "units"), ("score_vector", score_vector, 0, None))
    hidden = ops.tanh(
        ops.expand_dims(projected_query, 2) + ops.expand_dims(projected_key, 1)
    )  # (B, Tq, Tk, units)
    return ops.einsum("bqku,u->bqk", hidden, score_vector)


def weighted_sum(weights, value):
    """The attention output: `(B, Tq, Tk) x (B, Tk, dv) -> (B, Tq, dv)`."""
    checks.tensor("weighted_sum", "weights", weights, rank=3)
    checks.tensor("weighted_sum", "value", value, rank=3)
    checks.same_size("weighted_sum", ("weights", weights, 2, "keys"), ("value", value, 1, None))
    return ops.einsum("bqk,bkd->bqd", weights, value)
