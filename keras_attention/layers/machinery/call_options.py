"""One call's options: what a multi-head layer's `call` takes besides its inputs.

`CallOptions` is built once, at the top of `call` (`from_arguments`, from the
call's own arguments) or of `compute_output_spec` (`bind`, from the arguments
Keras passes it), and handed down unchanged: the flags are checked as it is
built, and every later step reads the one record instead of a parameter list
of its own. A family whose `call` takes more keywords (`MultiHeadAttention`'s
cache and positions, `SparseAttention`'s segment ids) declares them in its
`call`'s signature, the public one Keras, `help()` and the API pages read;
the fields its call does not take keep their defaults.
"""

import dataclasses

from keras_attention import validation
from keras_attention.layers.machinery import utils

INPUTS = ("query", "value", "key")


@dataclasses.dataclass(frozen=True)
class CallOptions:
    """A call's options (see `MultiHeadAttention.call` for each)."""

    query_mask: object = None
    value_mask: object = None
    key_mask: object = None
    attention_mask: object = None
    return_attention_scores: bool = False
    training: object = None
    use_causal_mask: bool = False
    mask: object = None  # Keras' mask of a one-input call
    attention_scores_heads: object = None
    attention_scores_query_range: object = None
    cache: object = None
    cache_update_index: object = None
    cache_update_mask: object = None
    segment_ids: object = None
    key_segment_ids: object = None
    prefix_length: object = None
    position_ids: object = None
    key_position_ids: object = None
    head_mask: object = None
    tile_plan: object = None

    @property
    def selects_weights(self):
        """Whether the call asks for some heads' or rows' weights only."""
        return (
            self.attention_scores_heads is not None or self.attention_scores_query_range is not None
        )


def from_arguments(layer, arguments):
    """`(query, value, key, CallOptions)` from a `call`'s arguments by name
    (its `locals()` at the top), the flags checked."""
    arguments = {k: v for k, v in arguments.items() if k not in ("self", "__class__")}
    inputs = tuple(arguments.pop(name, None) for name in INPUTS)
    for flag in ("return_attention_scores", "use_causal_mask"):
        if flag in arguments:
            arguments[flag] = validation.validate_call_flag(layer, flag, arguments[flag])
    return inputs + (CallOptions(**arguments),)


def bind(layer, args, kwargs):
    """`from_arguments` of the arguments Keras passes `compute_output_spec`,
    bound to the layer's `call` signature (Python's TypeError for a name it
    does not take): the signature of a `call` that follows our contract."""
    return from_arguments(layer, vars(utils.call_arguments(layer, args, kwargs)))


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """A call's inputs as the kernels take them, built once when checked.

    `query` as given (the output's shape); `flat_query` / `flat_key` /
    `flat_value` `(B', T, features)` with the attention axes flattened (no
    `flat_key` / `flat_value` with a cache, whose keys are projected
    already); `mask` the call's one `AttentionMask`; `layout` how the axes
    were flattened; `value_shape` the keys' shape for the weights'; the
    rotary positions of queries and keys (None: `0 .. T - 1`).
    """

    query: object
    flat_query: object
    mask: object
    layout: object
    value_shape: tuple
    flat_key: object = None
    flat_value: object = None
    query_positions: object = None
    key_positions: object = None
