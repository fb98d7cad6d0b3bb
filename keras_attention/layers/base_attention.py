"""The call contract shared by every attention layer in keras_attention.

Two families build on it: `ScoreAttention` (single-head layers that supply a
score function) and `BaseMultiHeadAttention` (projected heads with a kernel).
"""

import contextvars
import inspect

import keras

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import utils

# `(layer, whether its keys are the queries)` of the call in progress, read
# from the arguments as the caller wrote them: Keras converts each NumPy
# input to its own tensor (and casts each under a mixed policy) before
# `call`, so `layer(x, x)` reaches `call` with two distinct objects.
_CALLED_ON = contextvars.ContextVar("keras_attention_keys_are_queries", default=None)


def keys_are_queries(query, value, key):
    """The one rule for "the keys are the queries" (self-attention): no
    `value` and no `key`, or `value` (and `key`, when given) the very object
    passed as `query` -- Keras' spellings `layer(x)`, `layer(x, x)` and
    `layer(x, x, x)`. Equal values in another object, or equal lengths, are
    cross-attention."""
    if value is None:
        return key is None
    return value is query and (key is None or key is query)


@keras_attention_export("layers")
class BaseAttention(keras.layers.Layer):
    """The call contract: self-attention, masks, dropout, returned weights.

    Every attention layer of the package

    - attends to itself when called on one input (`layer(x)`, which is what
      `model.add(layer)` does): `value = query`, and the Keras mask of `x`
      is both the query and the value mask;
    - honours Keras masks and explicit `query_mask` / `value_mask` /
      `key_mask` / `attention_mask` (boolean, or 0/1 integers or floats,
      `True` where attention is allowed) and `use_causal_mask`;
    - returns its attention weights on `return_attention_scores=True`, and
      hands them to `keras_attention.capture_attention` when active;
    - gives zero output for a query row with nothing to attend to, never NaN;
    - propagates the query's mask to its output;
    - lets a masked position contribute nothing, whatever it holds: masked
      queries, keys and values are zeroed with `where` before any matmul, so
      NaN/Inf in padding reaches no output or gradient (a NaN in an unmasked
      position propagates, on every kernel: a diverging model stays
      visible). A key hidden from some queries only by `attention_mask`, the
      causal mask or a kernel's own pattern reaches exactly the queries that
      see it: their outputs are NaN if its key or value is, the others'
      are untouched (`ops.masking.confine_nonfinite`);
    - accepts empty inputs: batch 0 or a query of length 0 gives an empty
      output, keys of length 0 the result of a fully masked row;
    - computes in its compute dtype: integer and boolean inputs are cast,
      and logits are formed in float32 under half precision.

    This class holds only that contract: the validation of inputs and masks,
    error messages that name the layer, dropout and the weight recorder. It
    computes nothing itself; see `ScoreAttention` and `BaseMultiHeadAttention`.

    Args:
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).
    """

    # Set by `start_recording` (`capture_attention`); `None` means weights are
    # not being recorded.
    _attention_recorder = None

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        # A composite layer (AttentionPooling) names itself in the errors of
        # the layer it builds: the user built the composite, not this one.
        owner = validation.constructor_owner(self)
        super().__init__(**kwargs)
        self.dropout = utils.validate_rate(owner, "dropout", dropout)
        self.seed = utils.validate_seed(owner, seed)
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=seed, dtype=self.dtype_policy
        )

    # ------------------------------------------------------- weight recording
    @property
    def _capturing_attention(self):
        return self._attention_recorder is not None

    def _record_attention(self, weights):
        """Hands computed weights to an active `capture_attention`, if any."""
        if self._attention_recorder is not None and weights is not None:
            self._attention_recorder.weights.append(weights)

    # ------------------------------------------------------------- validation
    def __call__(self, *args, **kwargs):
        if not utils.has_contract(type(self).call):
            # A subclass written for Keras' layer with a `call` of its own
            # (KerasHub's XLNet attention takes `content_stream`): its inputs
            # are its own business.
            return super().__call__(*args, **kwargs)
        self._refuse_cache(kwargs)
        # Before Keras builds the layer from the inputs' shapes: a missing
        # query or a `key` without `value` would otherwise surface as a Keras
        # error about `build()`, or as a shape error naming the wrong input.
        query = args[0] if args else kwargs.get("query")
        value = args[1] if len(args) > 1 else kwargs.get("value")
        key = args[2] if len(args) > 2 else kwargs.get("key")
        if not isinstance(query, (list, tuple)):
            if query is None:
                raise TypeError(self._error("`query` is required. Received: query=None"))
            for name, x in (("query", query), ("value", value), ("key", key)):
                self._check_tensor(name, x)
            self._resolve_inputs(query, value, key)
        # Mask dtypes too: JAX's conversion of a string array would fail first.
        for name in ("query_mask", "value_mask", "key_mask", "attention_mask"):
            mask = kwargs.get(name)
            if mask is not None and hasattr(mask, "dtype"):
                utils.check_mask_dtype(self, name, mask)
        for name in ("segment_ids", "key_segment_ids", "position_ids", "key_position_ids"):
            if kwargs.get(name) is not None:
                validation.check_integer_dtype(self, name, kwargs[name])
        if isinstance(query, (list, tuple)):
            return super().__call__(*args, **kwargs)
        token = _CALLED_ON.set((self, keys_are_queries(query, value, key)))
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _CALLED_ON.reset(token)

    def _keys_are_queries(self, query, value, key):
        """Whether this call's keys are its queries (`keys_are_queries`),
        judged on the arguments as the caller passed them to the layer
        (before Keras converted them), or on these when `call` is reached
        directly (`stateless_call`)."""
        called = _CALLED_ON.get()
        if called is not None and called[0] is self:
            return called[1]
        return keys_are_queries(query, value, key)

    def _refuse_cache(self, kwargs):
        """A decoding `cache` given to a layer whose `call` takes none gets
        our error, not Python's "unexpected keyword argument"."""
        given = [name for name in ("cache", "cache_update_index") if name in kwargs]
        if not given:
            return
        parameters = inspect.signature(type(self).call).parameters
        if all(name in parameters for name in given):
            return
        raise TypeError(
            self._error(
                "this layer takes no decoding `cache` (the key/value cache "
                "is MultiHeadAttention's); call it on the whole "
                f"sequence. Received: {given[0]}="
                f"{utils.describe(kwargs[given[0]])}"
            )
        )

    def _to_compute_dtype(self, x):
        """Integer and boolean inputs are cast to the compute dtype."""
        return utils.cast_to_compute_dtype(self, x)

    def _error(self, message):
        return validation.error(self, message)

    def _check_tensor(self, name, x):
        if x is not None and not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(
                self._error(
                    f"`{name}` must be a tensor or array. Received: {name}={utils.describe(x)}"
                )
            )

    def _check_rank(self, name, shape, rank=3):
        if shape is not None and len(shape) != rank:
            raise ValueError(
                self._error(
                    f"`{name}` must have rank {rank} (batch, time, features). "
                    f"Received: {name} with shape {tuple(shape)}"
                )
            )

    def _check_mask(self, name, mask, expected, broadcast=False):
        """Checks a mask's dtype and shape; see `utils.check_mask`."""
        utils.check_mask(self, name, mask, expected, broadcast=broadcast)

    def _resolve_inputs(self, query, value, key):
        """Self-attention when `value` is None; `key` defaults to `value`."""
        if value is None:
            if key is not None:
                raise ValueError(
                    self._error(
                        "`key` was given without `value`. Pass `value` too, or "
                        "neither for self-attention. Received: key with shape "
                        f"{tuple(key.shape)}, value=None"
                    )
                )
            value = query
        if key is None:
            key = value
        return query, value, key

    def compute_mask(self, inputs, mask=None):
        # The output carries the query's mask; a list call's is the first
        # of `mask=[query_mask, value_mask]`, as in keras.layers.Attention.
        if isinstance(mask, (list, tuple)):
            mask = mask[0] if mask else None
        return None if mask is None else keras.ops.convert_to_tensor(mask)

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "seed": self.seed})
        return config


class _Recorder:
    """Plain holder, so that Keras' attribute tracking leaves it alone."""

    def __init__(self):
        self.weights = []


def start_recording(layer):
    """Makes `layer` (a `BaseAttention`) keep the weights of its next calls.

    Package-internal, for `capture_attention`: the recorder is an attribute
    of this module's class, so only this module reads or sets it.
    """
    layer._attention_recorder = _Recorder()


def stop_recording(layer):
    """Ends `start_recording`; returns the weights recorded, one per call."""
    recorder, layer._attention_recorder = layer._attention_recorder, None
    return [] if recorder is None else recorder.weights
