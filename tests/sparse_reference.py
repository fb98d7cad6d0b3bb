"""NumPy dense reference for block-sparse attention.

`reference_pattern` builds the `(Tq, Tv)` pattern token by token from the
documented rule (window, global blocks, random plan, global tokens, causal),
independently of the gather-based kernel; `reference_attention` is plain
dense softmax attention under a boolean mask.
"""

import math

import numpy as np


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


def reference_attention(query, key, value, allowed, dropped=None):
    """Dense softmax attention in float64; `allowed` is (B, Tq, Tv).
    `dropped` (B, H, Tq, Tv): dropout's `keep / (1 - rate)` on the weights
    in the output (the weights returned are before it)."""
    q = query.astype(np.float64).transpose(0, 2, 1, 3)
    k = key.astype(np.float64).transpose(0, 2, 1, 3)
    v = value.astype(np.float64).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    mask = allowed[:, None]
    scores = np.where(mask, scores, -np.inf)
    top = np.max(np.where(mask, scores, -1e300), axis=-1, keepdims=True)
    exp = np.where(mask, np.exp(scores - top), 0.0)
    total = exp.sum(-1, keepdims=True)
    weights = np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)
    kept = weights if dropped is None else weights * dropped
    return (kept @ v).transpose(0, 2, 1, 3), weights


def reference_gradients(query, key, value, allowed, cotangent, dropped=None):
    """Gradients of `sum(out * cotangent)` for `reference_attention`.

    Written out by hand in float64 (not by autodiff): with weights `P`,
    `dV = P^T G`, `dP = G V^T`, `dS = P * (dP - rowsum(dP * P))`,
    `dQ = dS K / sqrt(D)`, `dK = dS^T Q / sqrt(D)`. Rows with no allowed key
    have `P = 0`, so they pass no gradient. With `dropped` (`D`), the
    weights are `P D` in the output: `dV = (P D)^T G`, and `dP = D (G V^T)`
    goes through the softmax as above.
    """
    _, weights = reference_attention(query, key, value, allowed)
    scale = 1.0 / math.sqrt(query.shape[-1])
    q = query.astype(np.float64).transpose(0, 2, 1, 3)
    k = key.astype(np.float64).transpose(0, 2, 1, 3)
    v = value.astype(np.float64).transpose(0, 2, 1, 3)
    g = cotangent.astype(np.float64).transpose(0, 2, 1, 3)
    dropped = 1.0 if dropped is None else dropped
    d_value = (weights * dropped).transpose(0, 1, 3, 2) @ g
    d_weights = (g @ v.transpose(0, 1, 3, 2)) * dropped
    d_scores = weights * (d_weights - (d_weights * weights).sum(-1, keepdims=True))
    d_query = d_scores @ k * scale
    d_key = d_scores.transpose(0, 1, 3, 2) @ q * scale
    return [x.transpose(0, 2, 1, 3) for x in (d_query, d_key, d_value)]
