"""Plain NumPy attention, written independently of keras_attention.ops."""

import numpy as np


def softmax_with_mask(scores, mask=None):
    """Softmax over the last axis; masked entries get 0; all-masked rows get 0."""
    scores = np.asarray(scores, dtype=np.float64)
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    mask = np.broadcast_to(mask, scores.shape)
    shifted = np.where(mask, scores, -np.inf)
    row_max = np.max(shifted, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exp = np.where(mask, np.exp(scores - row_max), 0.0)
    total = exp.sum(-1, keepdims=True)
    return np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)


def attend(scores, value, mask=None):
    weights = softmax_with_mask(scores, mask)
    return weights @ np.asarray(value, np.float64), weights


def combined_mask(batch, tq, tv, query_mask=None, value_mask=None, causal=False):
    mask = np.ones((batch, tq, tv), dtype=bool)
    if query_mask is not None:
        mask &= np.asarray(query_mask, bool)[:, :, None]
    if value_mask is not None:
        mask &= np.asarray(value_mask, bool)[:, None, :]
    if causal:
        mask &= np.tril(np.ones((tq, tv), dtype=bool))[None]
    return mask


def random_mask(rng, batch, length, keep_first=True):
    """A random padding-style mask with at least one True per row."""
    mask = rng.random((batch, length)) > 0.35
    if keep_first:
        mask[:, 0] = True
    return mask
