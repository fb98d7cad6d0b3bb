"""Test double: a weightless multi-head self-attention that records (B, H, T, T).

Stands in for MultiHeadAttention (branch `mha`) where a test only needs a layer
that reports per-head weights to `capture_attention`. Head h uses feature
slice h of the input as both query and key: softmax(x_h x_h^T / sqrt(d)).
"""

import numpy as np
from keras import ops

import keras_attention


class SplitHeadsAttention(keras_attention.layers.BaseAttention):
    """A user's own attention layer: it subclasses our public base and hands
    its weights to `capture_attention` through the base's `_record_attention`,
    as our layers do."""

    def __init__(self, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads

    def call(self, x, training=None):
        batch, length, features = x.shape
        depth = features // self.num_heads
        heads = ops.transpose(ops.reshape(x, (-1, length, self.num_heads, depth)), (0, 2, 1, 3))
        scores = ops.matmul(heads, ops.transpose(heads, (0, 1, 3, 2))) / np.sqrt(depth)
        weights = ops.softmax(scores, axis=-1)
        self._record_attention(weights)
        output = ops.matmul(weights, heads)
        return ops.reshape(ops.transpose(output, (0, 2, 1, 3)), (-1, length, features))


def reference_weights(x, num_heads):
    """The same weights in plain NumPy: (B, H, T, T)."""
    x = np.asarray(x, dtype="float64")
    batch, length, features = x.shape
    depth = features // num_heads
    heads = x.reshape(batch, length, num_heads, depth).transpose(0, 2, 1, 3)
    scores = heads @ heads.transpose(0, 1, 3, 2) / np.sqrt(depth)
    scores -= scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)
