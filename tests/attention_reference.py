"""float64 NumPy references of multi-head attention, written from the definitions.

`reference` is `keras_attention.MultiHeadAttention` (projections, grouped
heads, gate, output projection) with the #36 score modifiers (`modifier`:
"soft_cap", "alibi", "sinks", "score_mod", "all", or a tuple of them);
`positional` the
causal / sliding-window / written-cache rules. Shared by the combinations
test and the layer tests of the modifiers; never calls our ops.
"""

import keras
import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@keras.saving.register_keras_serializable(package="keras_attention_tests")
def score_mod(score, batch, head, q_idx, k_idx):
    """A `score_mod` that reads every index (#36), in `keras.ops`."""
    wave = keras.ops.cos(keras.ops.cast(q_idx - 2 * k_idx + head, score.dtype))
    return score + 0.5 * wave - 0.25 * keras.ops.cast(batch, score.dtype)


def _numpy_score_mod(score, batch, head, q_idx, k_idx):
    return score + 0.5 * np.cos(q_idx - 2 * k_idx + head) - 0.25 * batch


SOFT_CAP = 1.5  # small enough to bite on these random weights' logits


def paper_alibi_slopes(num_heads):
    """ALiBi's slopes (Press et al., 2021, their code), written afresh."""

    def geometric(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return geometric(num_heads)
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    return geometric(closest) + geometric(2 * closest)[0::2][: num_heads - closest]


def modifier_names(modifier):
    """The set of modifier names `modifier` stands for."""
    if modifier is None:
        return set()
    if modifier == "all":
        return {"soft_cap", "alibi", "sinks", "score_mod"}
    return {modifier} if isinstance(modifier, str) else set(modifier)


def modified_logits(logits, modifier, rows, weights):
    """The logits `(B, H, Tq, Tk)` changed as `modifier` says; `rows` are the
    queries' absolute positions."""
    modifier = modifier_names(modifier)
    if not modifier:
        return logits
    batch, heads, _, k_len = logits.shape
    b = np.arange(batch)[:, None, None, None]
    h = np.arange(heads)[None, :, None, None]
    q = np.asarray(rows)[None, None, :, None]
    k = np.arange(k_len)[None, None, None, :]
    if "alibi" in modifier:
        logits = logits - np.asarray(paper_alibi_slopes(heads))[h] * np.abs(q - k)
    if "score_mod" in modifier:
        logits = _numpy_score_mod(logits, b, h, q, k)
    if "soft_cap" in modifier:
        logits = SOFT_CAP * np.tanh(logits / SOFT_CAP)
    return logits


def reference(
    weights,
    query,
    key_value,
    allowed,
    num_heads,
    num_kv_heads,
    gate,
    modifier=None,
    rows=None,
    head_mask=None,
):
    """`(output (B, Tq, F), weights (B, H, Tq, Tk))` in float64.

    `query (B, Tq, F)`, `key_value (B, Tk, F)` (self-attention inputs for
    keys and values), `allowed (B, H, Tq, Tk)` boolean; `modifier` changes
    the logits (at absolute query positions `rows`, default `0..Tq-1`), and
    with sinks one more logit per head joins each row's denominator. A row
    with nothing allowed has zero weights and a zero context: its output is
    the output projection's bias. `head_mask` (`(H,)` or `(B, H)`) scales
    each head's context before the output projection (the weights returned
    are unscaled).
    """
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    q = np.einsum("btf,fhd->bthd", query, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("btf,fhd->bthd", key_value, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("btf,fhd->bthd", key_value, w["value/kernel"]) + w["value/bias"]
    groups = num_heads // num_kv_heads
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    rows = np.arange(query.shape[1]) if rows is None else rows
    logits = modified_logits(logits, modifier, rows, w)
    logits = np.where(allowed, logits, -np.inf)
    peak = np.max(logits, axis=-1, keepdims=True)
    sinks = None
    if "sinks" in modifier_names(modifier):
        sinks = w["sinks"][None, :, None, None]
        peak = np.maximum(peak, sinks)
    exp = np.exp(logits - np.where(np.isfinite(peak), peak, 0.0))
    total = exp.sum(-1, keepdims=True)
    if sinks is not None:  # zero rows stay zero: the sink has no value
        total = total + np.exp(sinks - peak)
    probs = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    context = np.einsum("bhqk,bkhd->bqhd", probs, v)
    if gate:
        context = context * sigmoid(
            np.einsum("btf,fhd->bthd", query, w["gate/kernel"]) + w["gate/bias"]
        )
    if head_mask is not None:
        scale = np.asarray(head_mask, np.float64)
        context = context * (
            scale[None, None, :, None] if scale.ndim == 1 else scale[:, None, :, None]
        )
    output = np.einsum("bqhd,hdo->bqo", context, w["attention_output/kernel"])
    return output + w["attention_output/bias"], probs


def positional(
    rows,
    cols,
    causal,
    window,
    key_length=None,
    prefix=None,
    sink_tokens=None,
    mask_mod=False,
    batch=1,
    heads=1,
):
    """`(B|1, H|1, Tq, Tk)` boolean: the positional rules at absolute query
    positions `rows` and key positions `cols`. `prefix` (with `causal`): an
    int or one per example; `sink_tokens` (with `window`); `mask_mod=True`
    applies `numpy_mask_mod` over `batch` examples and `heads` heads."""
    q = np.asarray(rows)[None, None, :, None]
    k = np.asarray(cols)[None, None, None, :]
    allowed = np.ones((1, 1, q.shape[2], k.shape[3]), bool)
    if causal:
        seen = k <= q
        if prefix is not None:
            seen = seen | (k < np.reshape(prefix, (-1, 1, 1, 1)))
        allowed = allowed & seen
    if window is not None:
        allowed = allowed & ((np.abs(q - k) < window) | (k < (sink_tokens or 0)))
    if key_length is not None:
        allowed = allowed & (k < key_length)
    if mask_mod:
        b = np.arange(batch)[:, None, None, None]
        h = np.arange(heads)[None, :, None, None]
        allowed = allowed & numpy_mask_mod(b, h, q, k)
    return allowed


@keras.saving.register_keras_serializable(package="keras_attention_tests")
def mask_mod(batch, head, q_idx, k_idx):
    """A `mask_mod` that reads every index (#36), in `keras.ops`."""
    return keras.ops.not_equal((q_idx + 2 * k_idx + head + batch) % 3, 0)


def numpy_mask_mod(batch, head, q_idx, k_idx):
    return (q_idx + 2 * k_idx + head + batch) % 3 != 0
