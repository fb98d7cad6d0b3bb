"""Turn `capture_attention` results into per-head matrices the figures draw."""

import keras
import numpy as np

from keras_attention import analysis
from keras_attention.layers import capture_attention


def call_and_capture(model_or_layer, inputs):
    """Eager call of a model (or attention layer) with `inputs`, capturing attention.

    A layer given a tuple/list is called as `layer(*inputs)` (query, value, key).
    Returns `{name: weights}`: the layer's name, or its path where blocks
    reuse a name, suffixed with `#i` for the i-th call of a layer called more
    than once; weights are `(B, Tq, Tv)` or `(B, H, Tq, Tv)`.
    """
    with capture_attention(model_or_layer) as captured:
        if isinstance(model_or_layer, keras.Model) or not isinstance(inputs, (tuple, list)):
            model_or_layer(inputs, training=False)
        else:
            model_or_layer(*inputs, training=False)
    # Keys are layer paths (unique even when blocks reuse sublayer names);
    # show the plain layer name wherever that is unambiguous.
    short = [path.rsplit("/", 1)[-1] for path in captured.scores]
    collected = {}
    for (path, calls), name in zip(captured.scores.items(), short, strict=True):
        label = name if short.count(name) == 1 else path
        for index, weights in enumerate(calls):
            collected[label if len(calls) == 1 else f"{label}#{index}"] = weights
    return collected


def per_head(weights, example):
    """`(H, Tq, Tv)` for one example of `(B, Tq, Tv)` (H = 1) or `(B, H, Tq, Tv)` weights."""
    weights = np.asarray(weights, dtype="float32")
    if weights.ndim == 3:
        return weights[example][None]
    if weights.ndim == 4:
        return weights[example]
    raise ValueError(
        f"attention weights must be (B, Tq, Tv) or (B, H, Tq, Tv). Received: shape {weights.shape}"
    )


def batch_size(weights):
    return int(np.asarray(weights).shape[0])


def stacked_self_attention(shapes):
    """The names of `shapes` (`{name: (..., Tq, Tv)}`) that rollout and flow combine:
    every self-attention entry (`Tq == Tv`), in capture order (taken as the stacking
    order), when there are at least two and all attend over the same tokens; `[]`
    otherwise (cross-attention, or layers over different lengths)."""
    square = [name for name, shape in shapes.items() if shape[-1] == shape[-2]]
    lengths = {shapes[name][-1] for name in square}
    return square if len(square) >= 2 and len(lengths) == 1 else []


def combined_attention(kind, per_head_weights, head=None):
    """`(L, L)` rollout or flow (`kind`) of one example's layers, each `(H, L, L)`,
    first layer first: of the mean of heads, or of head `head` of every layer."""
    layers = [np.asarray(w, "float64")[None] for w in per_head_weights]  # (1, H, L, L)
    heads = None if head is None else [int(head)]
    combine = analysis.attention_rollout if kind == "rollout" else analysis.attention_flow
    return combine(layers, heads=heads)[0]
