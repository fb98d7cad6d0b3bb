"""Head masks and head importance (Michel et al., 2019): which heads of a
model's `MultiHeadAttention` layers matter (see the package docstring)."""

import dataclasses

import keras
import numpy as np

from keras_attention import validation
from keras_attention.analysis.rollout import check_model
from keras_attention.analysis.rollout import describe_argument
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import head_mask as head_masks
from keras_attention.layers.machinery import utils
from keras_attention.layers.multi_head_attention import MultiHeadAttention


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
    check_model(name, model)
    if not isinstance(head_masks_by_layer, dict):
        raise TypeError(
            validation.error(
                name,
                "`head_masks_by_layer` must be a dict {layer name or path: head mask}. "
                f"Received: head_masks_by_layer={describe_argument(head_masks_by_layer)}",
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
                    f"{describe_argument(mask)}",
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
                f"tf.data.Dataset or a list. Received: batches={describe_argument(batches)}",
            )
        )
    pairs = list(batches)
    for index, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(
                validation.error(
                    name,
                    "every item of `batches` must be an (inputs, targets) pair. "
                    f"Received: batches[{index}]={describe_argument(pair)}",
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
    check_model(name, model)
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
    check_model(name, model)
    if not isinstance(importance, dict) or not importance:
        raise TypeError(
            validation.error(
                name,
                "`importance` must be a non-empty dict {layer path: scores per head}, "
                f"as head_importance returns. Received: importance={describe_argument(importance)}",
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
