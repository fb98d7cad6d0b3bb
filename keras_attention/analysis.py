"""Which input tokens a model's output depends on, and which heads matter.

Attention rollout and attention flow (Abnar & Zuidema, 2020,
https://arxiv.org/abs/2005.00928) combine the attention weights of a stack
of self-attention layers into one `(B, L, L)` map from the last layer's
tokens to the input tokens. Each layer's weights are averaged over the
heads (or a chosen set), mixed with the identity for the residual
connection and renormalised, as in the paper:
`A' = (1 - r) * mean_h(A_h) + r * I` (rows divided by their sum), with
`r = residual_weight = 0.5`. Rollout multiplies these matrices; flow treats
them as the capacities of a layered graph and takes, for each output token,
the maximum flow to each input token, normalised to sum to 1.

Head importance (Michel et al., 2019, https://arxiv.org/abs/1905.10650) is
the expected absolute gradient of the loss with respect to each head's
`head_mask` of `MultiHeadAttention`; `mask_least_important_heads` masks the
heads it ranks lowest and reports the loss.

The weights are those `keras_attention.layers.capture_attention` records
(`(B, H, Lq, Lk)` per call, or `(B, Lq, Lk)` for a single-head layer); the
`model_*` functions call a model once and capture them. Everything here is
NumPy on the captured weights except the gradients, which use the backend's
(TensorFlow or JAX). Nothing imports the widgets.

Example:

>>> import numpy as np, keras_attention
>>> uniform = np.full((1, 2, 3, 3), 1 / 3)  # one example, two heads, 3 tokens
>>> rollout = keras_attention.analysis.attention_rollout([uniform, uniform])
>>> np.round(rollout[0], 3)  # 0.25 * I + 0.75 / 3 everywhere
array([[0.5 , 0.25, 0.25],
       [0.25, 0.5 , 0.25],
       [0.25, 0.25, 0.5 ]])
"""

import dataclasses

import keras
import numpy as np

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.api_export import public_names
from keras_attention.layers.machinery import capture
from keras_attention.layers.machinery import head_mask as head_masks
from keras_attention.layers.machinery import utils
from keras_attention.layers.multi_head_attention import MultiHeadAttention

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
                f"weights={_describe(weights)}",
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
                f"Received: {argument}={_describe(weights)}",
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


def _describe(value):
    """A short description: shapes of arrays, not their values."""
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
    _check_model(name, model)
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


def _check_model(name, model):
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            validation.error(
                name,
                f"`model` must be a Keras model or layer. Received: model={_describe(model)}",
            )
        )


# ------------------------------------------------------------ head masking
def head_layers(model):
    """`{path: layer}` of every `MultiHeadAttention` under `model`, in order
    (the layers whose heads can be masked; the explorer's head grid too)."""
    return {
        layer.path or layer.name: layer
        for layer in utils.sublayers(model)
        if isinstance(layer, MultiHeadAttention)
    }


def _resolve_layer(name, argument, layers, key):
    """The layer of `layers` (`{path: layer}`) that `key` (a path or a unique
    layer name) names; our ValueError otherwise."""
    if key in layers:
        return key, layers[key]
    matches = [path for path in layers if path.rsplit("/", 1)[-1] == key]
    if len(matches) != 1:
        raise ValueError(
            validation.error(
                name,
                f"`{argument}` names {key!r}, which matches {len(matches)} of the model's "
                f"MultiHeadAttention layers ({list(layers)}). Received: {argument} key {key!r}",
            )
        )
    return matches[0], layers[matches[0]]


@keras_attention_export("analysis", serializable=False)
def masking_heads(model, head_masks_by_layer):
    """Context manager: inside it, the model's `MultiHeadAttention` layers
    use these head masks in every call that passes none.

    The layers are found by name or path anywhere in `model` (inside
    Transformer blocks too, whose calls no argument reaches). A mask is
    `(H,)` or `(B, H)`, 0/1 or soft (see `MultiHeadAttention`'s
    `head_mask`); a tensor is used as it is, so gradients with respect to it
    flow (what `head_importance` differentiates). Call the model eagerly
    inside (`model(x)`, not `model.predict`): a function compiled before
    keeps the masks it was traced with.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> inputs = keras.Input((4, 8))
    >>> outputs = keras_attention.MultiHeadAttention(2, 4, name="mha")(inputs, inputs)
    >>> model = keras.Model(inputs, outputs)
    >>> x = np.ones((1, 4, 8), "float32")
    >>> with keras_attention.analysis.masking_heads(model, {"mha": [0.0, 0.0]}):
    ...     silent = model(x)
    >>> bias = model.get_layer("mha").output_dense.bias
    >>> bool(np.allclose(silent, np.broadcast_to(bias, (1, 4, 8))))
    True

    Args:
        model: a Keras model or layer.
        head_masks_by_layer: `{layer name or path: mask}`.

    Returns:
        A context manager.
    """
    name = "masking_heads"
    _check_model(name, model)
    if not isinstance(head_masks_by_layer, dict):
        raise TypeError(
            validation.error(
                name,
                "`head_masks_by_layer` must be a dict {layer name or path: head mask}. "
                f"Received: head_masks_by_layer={_describe(head_masks_by_layer)}",
            )
        )
    layers = head_layers(model)
    resolved = {}
    for key, mask in head_masks_by_layer.items():
        _, layer = _resolve_layer(name, "head_masks_by_layer", layers, key)
        if isinstance(mask, (list, tuple)):
            mask = np.asarray(mask, dtype="float32")
        shape = tuple(getattr(mask, "shape", ()))
        if not hasattr(mask, "dtype") or len(shape) not in (1, 2) or shape[-1] != layer.num_heads:
            raise ValueError(
                validation.error(
                    name,
                    f"the mask of {key!r} must have shape ({layer.num_heads},) or "
                    f"(batch, {layer.num_heads}). Received: head_masks_by_layer[{key!r}]="
                    f"{_describe(mask)}",
                )
            )
        resolved[layer] = mask
    return head_masks.model_masks(resolved)


def _batches(name, batches):
    """`batches` as a list of `(x, y)` pairs."""
    if isinstance(batches, (str, bytes, dict)) or not hasattr(batches, "__iter__"):
        raise TypeError(
            validation.error(
                name,
                "`batches` must be an iterable of (inputs, targets) pairs, such as a "
                f"tf.data.Dataset or a list. Received: batches={_describe(batches)}",
            )
        )
    pairs = list(batches)
    for index, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(
                validation.error(
                    name,
                    "every item of `batches` must be an (inputs, targets) pair. "
                    f"Received: batches[{index}]={_describe(pair)}",
                )
            )
    if not pairs:
        raise ValueError(validation.error(name, "`batches` is empty. Received: batches=[]"))
    return pairs


def _check_loss(name, loss_fn):
    if not callable(loss_fn):
        raise TypeError(
            validation.error(
                name,
                "`loss_fn` must be a callable (y_true, y_pred) -> loss, such as a "
                f"keras.losses.Loss. Received: loss_fn={loss_fn!r}",
            )
        )


def _loss(model, loss_fn, x, y):
    """The mean loss of one batch, called eagerly without dropout."""
    return keras.ops.mean(loss_fn(y, model(x, training=False)))


@keras_attention_export("analysis", serializable=False)
def head_importance(model, batches, loss_fn, *, normalize=False):
    """Each head's importance: the expected absolute gradient of the loss
    with respect to its head mask (Michel et al., 2019).

    For every `MultiHeadAttention` layer under `model`, a mask of ones
    `(H,)` is set (`masking_heads`); for each batch the gradient of the
    batch's loss (`mean(loss_fn(y, model(x, training=False)))`) with respect
    to the masks is taken, and its absolute value averaged over the
    batches. A head whose removal would change the loss little has a small
    score. TensorFlow and JAX backends.

    Args:
        model: a Keras model or layer with `MultiHeadAttention` layers
            (also inside Transformer blocks).
        batches: an iterable of `(inputs, targets)` pairs (a list, a
            `tf.data.Dataset`).
        loss_fn: `(y_true, y_pred) -> loss`, e.g.
            `keras.losses.SparseCategoricalCrossentropy()`; a per-example
            loss is averaged.
        normalize: divide each layer's scores by their L2 norm, as the
            paper's code does before comparing heads across layers.

    Returns:
        `{layer path: (H,) float64 array}`, in the model's layer order.
    """
    name = "head_importance"
    _check_model(name, model)
    layers = head_layers(model)
    if not layers:
        raise ValueError(
            validation.error(
                name,
                "`model` has no MultiHeadAttention layers (whose heads can be masked). "
                f"Received: model={type(model).__name__} '{model.name}'",
            )
        )
    pairs = _batches(name, batches)
    _check_loss(name, loss_fn)
    normalize = validation.validate_bool(name, "normalize", normalize)
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            validation.error(
                name,
                "head importance needs gradients, here on the TensorFlow or JAX "
                f"backend. Received: backend {backend!r}",
            )
        )
    totals = {path: np.zeros(layer.num_heads) for path, layer in layers.items()}
    gradient_of = _mask_gradient_function(backend, model, layers, loss_fn)
    for x, y in pairs:
        gradients = gradient_of(x, y)
        for path in totals:
            totals[path] += np.abs(gradients[path])
    scores = {path: total / len(pairs) for path, total in totals.items()}
    if normalize:
        scores = {
            path: score / norm if (norm := np.linalg.norm(score)) > 0 else score
            for path, score in scores.items()
        }
    return scores


def _mask_gradient_function(backend, model, layers, loss_fn):
    """`(x, y) -> {path: d loss / d head mask}` of one batch, masks at one."""
    ones = {path: np.ones((layer.num_heads,), "float32") for path, layer in layers.items()}
    if backend == "jax":
        import jax

        def loss(masks, trainable, non_trainable, x, y):
            with head_masks.model_masks({layers[p]: m for p, m in masks.items()}):
                outputs, _ = model.stateless_call(trainable, non_trainable, x, training=False)
            return keras.ops.mean(loss_fn(y, outputs))

        # Compiled once per input shape: op by op, JAX's gradient of a model
        # takes seconds. The weights are arguments, not constants of the program.
        gradient = jax.jit(jax.grad(loss))
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]

        def jax_gradients(x, y):
            gradients = gradient(ones, trainable, non_trainable, x, y)
            return {path: np.asarray(g, "float64") for path, g in gradients.items()}

        return jax_gradients
    import tensorflow as tf

    def tensorflow_gradients(x, y):
        masks = {path: tf.constant(m) for path, m in ones.items()}
        with tf.GradientTape() as tape:
            tape.watch(list(masks.values()))
            with head_masks.model_masks({layers[p]: m for p, m in masks.items()}):
                value = _loss(model, loss_fn, x, y)
        gradients = tape.gradient(value, masks)
        return {
            path: np.zeros(layers[path].num_heads) if g is None else g.numpy().astype("float64")
            for path, g in gradients.items()
        }

    return tensorflow_gradients


@keras_attention_export("analysis", serializable=False)
@dataclasses.dataclass
class HeadMaskingResult:
    """What `mask_least_important_heads` returns.

    Attributes:
        loss: the mean batch loss with the heads masked.
        baseline_loss: the mean batch loss without masking.
        masked_heads: `[(layer path, head index)]`, least important first.
        head_masks: `{layer path: (H,) 0/1 array}`, for `masking_heads`.
    """

    loss: float
    baseline_loss: float
    masked_heads: list
    head_masks: dict


@keras_attention_export("analysis", serializable=False)
def mask_least_important_heads(model, importance, k, batches, loss_fn):
    """Masks the `k` heads of lowest importance, model-wide, and reports the loss.

    Args:
        model: the model `importance` was computed for.
        importance: `{layer name or path: (H,) scores}`, as `head_importance`
            returns (ties go to the earlier layer, then the lower head).
        k: how many heads to mask, from 0 to the number of heads scored.
        batches: `(inputs, targets)` pairs, as `head_importance`.
        loss_fn: as `head_importance`.

    Returns:
        A `HeadMaskingResult`: the mean batch loss with and without the
        heads masked, which heads, and their masks.
    """
    name = "mask_least_important_heads"
    _check_model(name, model)
    if not isinstance(importance, dict) or not importance:
        raise TypeError(
            validation.error(
                name,
                "`importance` must be a non-empty dict {layer path: scores per head}, "
                f"as head_importance returns. Received: importance={_describe(importance)}",
            )
        )
    layers = head_layers(model)
    ranked = []
    masks = {}
    for key, scores in importance.items():
        path, layer = _resolve_layer(name, "importance", layers, key)
        scores = np.asarray(keras.ops.convert_to_numpy(scores), dtype="float64")
        if scores.shape != (layer.num_heads,) or not np.all(np.isfinite(scores)):
            raise ValueError(
                validation.error(
                    name,
                    f"the scores of {key!r} must be {layer.num_heads} finite numbers, "
                    f"one per head. Received: importance[{key!r}] with shape {scores.shape}",
                )
            )
        ranked += [(score, len(masks), head, path) for head, score in enumerate(scores)]
        masks[path] = np.ones(layer.num_heads, "float32")
    k = validation.validate_int_in_range(name, "k", k, 0, len(ranked) + 1)
    pairs = _batches(name, batches)
    _check_loss(name, loss_fn)
    chosen = [(path, head) for _, _, head, path in sorted(ranked)[:k]]
    for path, head in chosen:
        masks[path][head] = 0.0
    baseline = _mean_loss(model, loss_fn, pairs)
    with head_masks.model_masks({layers[path]: mask for path, mask in masks.items()}):
        masked = _mean_loss(model, loss_fn, pairs)
    return HeadMaskingResult(
        loss=masked, baseline_loss=baseline, masked_heads=chosen, head_masks=masks
    )


def _mean_loss(model, loss_fn, pairs):
    return float(
        np.mean([keras.ops.convert_to_numpy(_loss(model, loss_fn, x, y)) for x, y in pairs])
    )


__all__ = public_names("analysis")
