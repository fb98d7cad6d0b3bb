"""Attention rollout and flow (Abnar & Zuidema, 2020): the captured weights
of a stack of self-attention layers combined into one map from the last
layer's tokens to the input tokens (see the package docstring)."""

import keras
import numpy as np

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import capture

# Residual capacities at or below this are no edge of the flow graph
# (weights are at most 1; rounding leaves ~1e-16 behind a saturated edge).
_FLOW_TOLERANCE = 1e-12


# --------------------------------------------------------- rollout and flow
@keras_attention_export("analysis", serializable=False)
def attention_rollout(weights, heads=None, residual_weight=0.5, all_layers=False):
    """Attention rollout (Abnar & Zuidema, 2020) of a stack of self-attention layers.

    Each layer's weights are averaged over `heads`, mixed with the identity
    (`(1 - residual_weight) * A + residual_weight * I`, rows renormalised)
    and multiplied from the first layer up: `R = A'_n ... A'_2 A'_1`.
    `R[b, i, j]` is how much the last layer's token `i` draws on input
    token `j`; each row sums to 1.

    Args:
        weights: a list, first layer first, of each layer's attention
            weights `(B, H, L, L)` (or `(B, L, L)` for one head), as
            `capture_attention` records them; every layer must attend over
            the same `L` tokens it is given (self-attention).
        heads: `None` (every head's mean), or a head index or list of head
            indices whose mean each layer contributes.
        residual_weight: the identity's share `r` in `[0, 1]`; 0.5 as in the
            paper, 0 for the raw product of the attention maps.
        all_layers: also return the rollout up to every layer.

    Returns:
        `(B, L, L)` float64; with `all_layers=True`, `(num_layers, B, L, L)`,
        entry `l` being the rollout of layers `0..l`.
    """
    name = "attention_rollout"
    all_layers = validation.validate_bool(name, "all_layers", all_layers)
    mixed = _mixed_layers(name, weights, heads, residual_weight)
    rollout = mixed[0]
    steps = [rollout]
    for matrix in mixed[1:]:
        rollout = matrix @ rollout  # (B, L, L) @ (B, L, L)
        steps.append(rollout)
    return np.stack(steps) if all_layers else rollout


@keras_attention_export("analysis", serializable=False)
def attention_flow(weights, heads=None, residual_weight=0.5):
    """Attention flow (Abnar & Zuidema, 2020): maximum flow from each output
    token to each input token through the layers' attention graph.

    The graph has a node per token and layer boundary; layer `l`'s mixed
    attention `A'_l[i, j]` (as in `attention_rollout`) is the capacity of
    the edge from token `i` above the layer to token `j` below it. Entry
    `[b, i, j]` is the maximum flow from the last layer's token `i` to input
    token `j`, and each row is normalised to sum to 1, as the paper's code
    does (a row with no flow stays zero). Unlike rollout, flow is not a
    product: a token's share is bounded by the narrowest layer on its way.
    It costs `L * L` maximum-flow problems per example, each over
    `num_layers * L * L` edges: meant for short inputs (tens of tokens).

    Args:
        weights: as `attention_rollout`.
        heads: as `attention_rollout`.
        residual_weight: as `attention_rollout`.

    Returns:
        `(B, L, L)` float64.
    """
    mixed = _mixed_layers("attention_flow", weights, heads, residual_weight)
    batch, length = mixed[0].shape[:2]
    num_layers = len(mixed)
    nodes = (num_layers + 1) * length  # node `k * L + t`: token t below layer k
    flows = np.zeros((batch, length, length))
    for b in range(batch):
        capacity = np.zeros((nodes, nodes))
        for k, matrix in enumerate(mixed):
            # Edges from above layer k (boundary k + 1) down to below it.
            above, below = (k + 1) * length, k * length
            capacity[above : above + length, below : below + length] = matrix[b]
        top = num_layers * length
        for i in range(length):
            for j in range(length):
                flows[b, i, j] = _max_flow(capacity, top + i, j)
    totals = flows.sum(axis=-1, keepdims=True)
    return np.where(totals > 0, flows / np.where(totals > 0, totals, 1.0), 0.0)


def _max_flow(capacity, source, sink):
    """Maximum flow from `source` to `sink` of a dense capacity matrix (Dinic)."""
    residual = capacity.copy()
    total = 0.0
    while True:
        level = _levels(residual, source)
        if level[sink] < 0:
            return total
        # Nodes as deep as the sink, but the sink, lead nowhere in this phase.
        level[(level >= level[sink]) & (np.arange(len(level)) != sink)] = -1
        while (path := _augmenting_path(residual, level, source, sink)) is not None:
            starts, ends = path[:-1], path[1:]
            pushed = residual[starts, ends].min()
            residual[starts, ends] -= pushed
            residual[ends, starts] += pushed
            total += pushed


def _levels(residual, source):
    """Breadth-first distance from `source` along residual edges (-1: none)."""
    level = np.full(len(residual), -1)
    level[source] = 0
    frontier, depth = np.array([source]), 0
    while frontier.size:
        depth += 1
        frontier = np.flatnonzero((residual[frontier] > _FLOW_TOLERANCE).any(axis=0) & (level < 0))
        level[frontier] = depth
    return level


def _augmenting_path(residual, level, source, sink):
    """A path of the level graph from `source` to `sink` as an index array,
    or None. A dead end leaves the level graph (`level` -1) for the phase."""
    path = [source]
    while path:
        u = path[-1]
        if u == sink:
            return np.asarray(path)
        onward = np.flatnonzero((level == level[u] + 1) & (residual[u] > _FLOW_TOLERANCE))
        if onward.size:
            path.append(onward[0])
        else:
            level[u] = -1
            path.pop()
    return None


def _mixed_layers(name, weights, heads, residual_weight):
    """Each layer's `(B, L, L)` head mean, mixed with the identity, float64."""
    residual_weight = validation.validate_real(
        name, "residual_weight", residual_weight, low=0.0, high=1.0
    )
    if isinstance(weights, np.ndarray) or not isinstance(weights, (list, tuple)) or not weights:
        raise TypeError(
            validation.error(
                name,
                "`weights` must be a non-empty list of each layer's attention weights "
                "(B, H, L, L), first layer first. Received: "
                f"weights={describe_argument(weights)}",
            )
        )
    layers = [_layer_weights(name, index, w) for index, w in enumerate(weights)]
    first = layers[0].shape
    for index, w in enumerate(layers):
        if w.shape[0] != first[0] or w.shape[2] != first[2]:
            raise ValueError(
                validation.error(
                    name,
                    "every layer's weights must have the same batch and length "
                    f"(those of weights[0]: batch {first[0]}, length {first[2]}). "
                    f"Received: weights[{index}] with shape {_original_shape(weights[index])}",
                )
            )
    selection = _head_selection(name, heads, [w.shape[1] for w in layers])
    mixed = []
    for w in layers:
        mean = w.mean(axis=1) if selection is None else w[:, selection].mean(axis=1)
        matrix = (1.0 - residual_weight) * mean + residual_weight * np.eye(mean.shape[-1])
        totals = matrix.sum(axis=-1, keepdims=True)
        # A row with nothing to attend to and no residual stays zero.
        mixed.append(np.where(totals > 0, matrix / np.where(totals > 0, totals, 1.0), 0.0))
    return mixed


def _layer_weights(name, index, weights):
    """`weights[index]` as a float64 `(B, H, L, L)` array, checked."""
    argument = f"weights[{index}]"
    if not (hasattr(weights, "shape") and hasattr(weights, "dtype")):
        raise TypeError(
            validation.error(
                name,
                f"`{argument}` must be an array of attention weights (B, H, L, L). "
                f"Received: {argument}={describe_argument(weights)}",
            )
        )
    if len(weights.shape) not in (3, 4):
        raise ValueError(
            validation.error(
                name,
                f"`{argument}` must have rank 4 (B, H, L, L) or 3 (B, L, L). "
                f"Received: {argument} with shape {tuple(weights.shape)}",
            )
        )
    array = np.asarray(keras.ops.convert_to_numpy(weights), dtype="float64")
    if array.ndim == 3:
        array = array[:, None]
    if array.shape[2] != array.shape[3]:
        raise ValueError(
            validation.error(
                name,
                f"`{argument}` must be self-attention weights, as many queries as keys "
                "(rollout and flow follow the same tokens through the layers; "
                f"cross-attention has no such path). Received: {argument} with shape "
                f"{tuple(weights.shape)}",
            )
        )
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(
            validation.error(
                name,
                f"`{argument}` must hold finite, non-negative attention weights. "
                f"Received: {argument} with values in [{np.nanmin(array)}, {np.nanmax(array)}]",
            )
        )
    return array


def _head_selection(name, heads, head_counts):
    """`heads` as a list of indices valid in every layer, or None."""
    if heads is None:
        return None
    given = heads
    if validation.is_int(heads):
        heads = [heads]
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise TypeError(
            validation.error(
                name,
                "`heads` must be None, a head index or a list of head indices. "
                f"Received: heads={given!r}",
            )
        )
    heads = list(heads)
    fewest = min(head_counts)
    if not heads or not all(validation.is_int(h) and 0 <= h < fewest for h in heads):
        raise ValueError(
            validation.error(
                name,
                f"`heads` must be a non-empty list of head indices in [0, {fewest}) "
                f"(the fewest heads of any layer: {fewest}). Received: heads={given!r}",
            )
        )
    return [int(h) for h in heads]


def _original_shape(weights):
    return tuple(weights.shape) if hasattr(weights, "shape") else None


def describe_argument(value):
    """A short description for errors: shapes of arrays, not their values
    (`heads` uses it too)."""
    if isinstance(value, (list, tuple)) and len(value) > 3:
        return f"{type(value).__name__} of {len(value)} items"
    return validation.describe(value)


# ------------------------------------------------------ from a model's call
@keras_attention_export("analysis", serializable=False)
def model_attention_rollout(
    model, inputs, *, layers=None, heads=None, residual_weight=0.5, all_layers=False
):
    """`attention_rollout` of the self-attention a model computes on `inputs`.

    Calls `model(inputs, training=False)` eagerly under `capture_attention`
    and rolls out the weights of `layers` in that order: by default every
    attention layer the call recorded, in the model's layer order (the call
    order of a stack of blocks), each call of a layer reused in order.

    Args:
        model: a Keras model or layer containing keras_attention layers.
        inputs: what `model` is called on.
        layers: `None`, or the names (or paths, as `capture_attention` keys
            them) of the self-attention layers to roll out, first layer
            first; needed when the model also has cross-attention.
        heads, residual_weight, all_layers: as `attention_rollout`.

    Returns:
        As `attention_rollout`.
    """
    name = "model_attention_rollout"
    weights = _captured_self_attention(name, model, inputs, layers)
    return attention_rollout(weights, heads, residual_weight, all_layers)


@keras_attention_export("analysis", serializable=False)
def model_attention_flow(model, inputs, *, layers=None, heads=None, residual_weight=0.5):
    """`attention_flow` of the self-attention a model computes on `inputs`
    (the layers as `model_attention_rollout` picks them)."""
    weights = _captured_self_attention("model_attention_flow", model, inputs, layers)
    return attention_flow(weights, heads, residual_weight)


def _captured_self_attention(name, model, inputs, layers):
    """The weights of each recorded call of `layers`, in order, checked square."""
    check_model(name, model)
    if not capture.attention_layers(model):
        raise ValueError(
            validation.error(
                name,
                "`model` has no keras_attention attention layers to record. "
                f"Received: model={type(model).__name__} '{model.name}'",
            )
        )
    if layers is not None and (
        isinstance(layers, (str, bytes))
        or not isinstance(layers, (list, tuple))
        or not all(isinstance(n, str) for n in layers)
    ):
        raise TypeError(
            validation.error(
                name,
                "`layers` must be None or a list of attention layer names or paths. "
                f"Received: layers={layers!r}",
            )
        )
    with capture.capture_attention(model) as captured:
        model(inputs, training=False)
    paths = [path for path, calls in captured.scores.items() if calls]
    if layers is not None:
        chosen = []
        for given in layers:
            matches = [p for p in paths if given in (p, p.rsplit("/", 1)[-1])]
            if len(matches) != 1:
                raise ValueError(
                    validation.error(
                        name,
                        f"`layers` names {given!r}, which matches {len(matches)} of the "
                        f"attention layers the call recorded ({paths}). Received: "
                        f"layers={layers!r}",
                    )
                )
            chosen.append(matches[0])
        paths = chosen
    weights = []
    for path in paths:
        for recorded in captured.scores[path]:
            if recorded.ndim < 3 or recorded.shape[-1] != recorded.shape[-2]:
                raise ValueError(
                    validation.error(
                        name,
                        f"layer {path!r} recorded weights of shape {recorded.shape}: not "
                        "self-attention over the same tokens. Pass `layers` with the "
                        f"self-attention layers only. Received: layers={layers!r}",
                    )
                )
            weights.append(recorded)
    return weights


def check_model(name, model):
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            validation.error(
                name,
                "`model` must be a Keras model or layer. "
                f"Received: model={describe_argument(model)}",
            )
        )
