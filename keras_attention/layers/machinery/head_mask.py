"""`MultiHeadAttention`'s `head_mask`: checked once, applied once, set per model.

A head mask scales each head's attention result before the output projection
(Michel et al., 2019, https://arxiv.org/abs/1905.10650): a head masked with 0
contributes nothing to the layer's output, on every kernel, because the
product is taken after the kernel ran. `keras_attention.analysis` sets masks
for the layers inside a model (`masking_heads`), where no call argument
reaches them: `active_head_mask` is what a layer's `call` reads when its
`head_mask` argument is None.
"""

import contextlib
import contextvars

import numpy as np
from keras import ops

from keras_attention.layers.machinery import utils

# {id(layer): head mask} set by `model_masks`; empty outside it. A context
# variable, not an attribute: a layer is never changed by masking it.
_model_masks = contextvars.ContextVar("keras_attention_head_masks", default=None)


@contextlib.contextmanager
def model_masks(masks_by_layer):
    """Inside, each layer of `{layer: mask}` uses its mask when its call
    gives none (package-internal: `keras_attention.analysis.masking_heads`);
    an enclosing block's masks of other layers stay in force."""
    masks = dict(_model_masks.get() or {})
    masks.update({id(layer): mask for layer, mask in masks_by_layer.items()})
    token = _model_masks.set(masks)
    try:
        yield
    finally:
        _model_masks.reset(token)


def active_head_mask(layer):
    """The mask `model_masks` set for `layer`, or None."""
    masks = _model_masks.get()
    return None if masks is None else masks.get(id(layer))


def check_head_mask(layer, head_mask, query=None):
    """`head_mask` as a tensor of shape `(H,)` or `(batch, H)` (the batch of
    `query` when it has one), or None; our TypeError / ValueError naming
    `layer` otherwise."""
    if head_mask is None:
        return None
    query_shape = tuple(getattr(query, "shape", ()))
    batch = query_shape[0] if query_shape else None
    if isinstance(head_mask, (list, tuple, float, int)) and not isinstance(head_mask, bool):
        head_mask = np.asarray(head_mask)
    if not (hasattr(head_mask, "shape") and hasattr(head_mask, "dtype")):
        raise TypeError(
            layer._error(
                "`head_mask` must be a tensor or array of shape (num_heads,) or "
                f"(batch, num_heads). Received: head_mask={utils.describe(head_mask)}"
            )
        )
    dtype = str(getattr(head_mask.dtype, "name", head_mask.dtype))
    if not any(kind in dtype for kind in ("float", "int", "bool")):
        raise TypeError(
            layer._error(
                "`head_mask` must hold numbers (0/1, booleans or soft values). "
                f"Received: head_mask={utils.describe(head_mask)}"
            )
        )
    shape = tuple(head_mask.shape)
    heads = layer.num_heads
    fits = (len(shape) == 1 and shape[0] in (None, heads)) or (
        len(shape) == 2
        and shape[1] in (None, heads)
        and (shape[0] is None or batch is None or shape[0] == batch)
    )
    if not fits:
        raise ValueError(
            layer._error(
                f"`head_mask` must have shape (num_heads,) = ({heads},) or "
                f"(batch, num_heads) = ({batch}, {heads}). Received: head_mask "
                f"with shape {shape}"
            )
        )
    if isinstance(head_mask, np.ndarray):
        head_mask = ops.convert_to_tensor(head_mask)
    return head_mask


def apply_head_mask(output, head_mask):
    """`(B', Tq, H, Dv)` attention results times each head's mask value.

    `head_mask` is `(H,)` or `(B, H)`; when the layout folds other axes into
    the batch (`attention_axes`), `B'` is `B` times their sizes, batch-major.
    """
    if head_mask is None:
        return output
    mask = ops.cast(head_mask, output.dtype)
    if len(mask.shape) == 1:
        return output * mask[:, None]
    shape = ops.shape(output)
    # (B', Tq, H, Dv) -> (B, B'/B * Tq, H, Dv): the folded axes follow the batch.
    grouped = ops.reshape(output, (ops.shape(mask)[0], -1) + tuple(shape[2:]))
    return ops.reshape(grouped * mask[:, None, :, None], shape)
