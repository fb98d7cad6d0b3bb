"""NumPy dense reference for block-sparse attention.

`reference_pattern` builds the `(Tq, Tv)` pattern token by token from the
documented rule (window, global blocks, random plan, global tokens, causal),
independently of the gather-based kernel; `reference_attention` is plain
dense softmax attention under a boolean mask, its logits changed by the
score modifiers of `tests/attention_reference.py` (soft cap, ALiBi, learned
sinks, `score_mod`, the weighted `learned_alibi`) when asked.
"""

import math

import numpy as np

from tests.attention_reference import SOFT_CAP
from tests.attention_reference import modified_logits
from tests.attention_reference import modifier_names


def reference_pattern(
    tq,
    tv,
    block_size,
    window_blocks,
    global_blocks=0,
    plan=None,
    tokens=(),
    causal=False,
):
    nk = math.ceil(tv / block_size)
    allowed = np.zeros((tq, tv), bool)
    for qpos in range(tq):
        i = qpos // block_size
        if causal:
            window = range(i - window_blocks + 1, i + 1)
        else:
            window = range(i - window_blocks // 2, i - window_blocks // 2 + window_blocks)
        blocks = {j for j in window if 0 <= j < nk}
        blocks |= {j for j in range(global_blocks) if j < nk}
        if plan is not None and plan.shape[1]:
            limit = min(i + 1, nk) if causal else nk
            blocks |= {int(u) % limit for u in plan[i % len(plan)]}
        for kpos in range(tv):
            allowed[qpos, kpos] = (
                kpos // block_size in blocks
                or kpos in tokens
                or qpos in tokens
                or qpos < global_blocks * block_size
            ) and (kpos <= qpos or not causal)
    return allowed


def _softmax(query, key, allowed, modifier=None, weights=None):
    """`(logits before the soft cap, weights, sink share)` in float64, `(B,
    H, Tq, Tv)` / `(B, H, Tq, 1)`: the scaled logits changed by `modifier`
    (`modified_logits`, queries and keys at positions `0, 1, ...`), and the
    softmax over the allowed keys with `weights["sinks"]` `(H,)` as one more
    logit per head in each row's denominator (a key with a zero value)."""
    names = modifier_names(modifier)
    weights = weights or {}
    q = query.astype(np.float64).transpose(0, 2, 1, 3)
    k = key.astype(np.float64).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    rows = np.arange(q.shape[2])
    before_cap = modified_logits(scores, names - {"soft_cap"}, rows, weights)
    scores = SOFT_CAP * np.tanh(before_cap / SOFT_CAP) if "soft_cap" in names else before_cap
    mask = allowed[:, None] if allowed.ndim == 3 else allowed
    scores = np.where(mask, scores, -np.inf)
    top = np.max(np.where(mask, scores, -1e300), axis=-1, keepdims=True)
    sinks = None
    if "sinks" in names:
        sinks = np.asarray(weights["sinks"], np.float64)[None, :, None, None]
        top = np.maximum(top, sinks)
    exp = np.where(mask, np.exp(scores - top), 0.0)
    total = exp.sum(-1, keepdims=True)
    sink_exp = 0.0 if sinks is None else np.exp(sinks - top)
    total = total + sink_exp
    probs = np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)
    share = np.divide(sink_exp + 0 * total, total, out=np.zeros_like(total), where=total > 0)
    return before_cap, probs, share


def reference_attention(query, key, value, allowed, dropped=None, modifier=None, weights=None):
    """Dense softmax attention in float64; `allowed` is (B, Tq, Tv).
    `dropped` (B, H, Tq, Tv): dropout's `keep / (1 - rate)` on the weights
    in the output (the weights returned are before it). `modifier` and
    `weights` (`{"sinks": (H,), "slopes": (H,)}`) as `_softmax`; the weights
    returned are the keys' (with sinks a row sums to less than 1)."""
    _, weights, _ = _softmax(query, key, allowed, modifier, weights)
    v = value.astype(np.float64).transpose(0, 2, 1, 3)
    kept = weights if dropped is None else weights * dropped
    return (kept @ v).transpose(0, 2, 1, 3), weights


def reference_gradients(
    query, key, value, allowed, cotangent, dropped=None, modifier=None, weights=None
):
    """Gradients of `sum(out * cotangent)` for `reference_attention`.

    Written out by hand in float64 (not by autodiff): with weights `P`,
    `dV = P^T G`, `dP = G V^T`, `dS = P * (dP - rowsum(dP * P))`,
    `dQ = dS K / sqrt(D)`, `dK = dS^T Q / sqrt(D)`. Rows with no allowed key
    have `P = 0`, so they pass no gradient. With `dropped` (`D`), the
    weights are `P D` in the output: `dV = (P D)^T G`, and `dP = D (G V^T)`
    goes through the softmax as above. With a `modifier`, `dS` goes through
    the soft cap's `1 - tanh(x / c)^2` (the other changes add to the logit);
    with `weights` given, a fourth item holds their gradients: `sinks`
    `-sum p_sink rowsum(dP * P)` (the sink's value is zero) and `slopes`
    (`learned_alibi`) `-sum dS_before_cap |i - j|`, each `(H,)`.
    """
    before_cap, probs, share = _softmax(query, key, allowed, modifier, weights)
    scale = 1.0 / math.sqrt(query.shape[-1])
    q = query.astype(np.float64).transpose(0, 2, 1, 3)
    k = key.astype(np.float64).transpose(0, 2, 1, 3)
    v = value.astype(np.float64).transpose(0, 2, 1, 3)
    g = cotangent.astype(np.float64).transpose(0, 2, 1, 3)
    dropped = 1.0 if dropped is None else dropped
    d_value = (probs * dropped).transpose(0, 1, 3, 2) @ g
    d_weights = (g @ v.transpose(0, 1, 3, 2)) * dropped
    delta = (d_weights * probs).sum(-1, keepdims=True)
    d_scores = probs * (d_weights - delta)
    if "soft_cap" in modifier_names(modifier):
        d_scores = d_scores * (1.0 - np.tanh(before_cap / SOFT_CAP) ** 2)
    d_query = d_scores @ k * scale
    d_key = d_scores.transpose(0, 1, 3, 2) @ q * scale
    grads = [x.transpose(0, 2, 1, 3) for x in (d_query, d_key, d_value)]
    if weights is None:
        return grads
    distance = np.abs(np.arange(q.shape[2])[:, None] - np.arange(k.shape[2])[None])
    return grads + [
        {
            "sinks": -(share * delta).sum(axis=(0, 2, 3)),
            "slopes": -(d_scores * distance).sum(axis=(0, 2, 3)),
        }
    ]
