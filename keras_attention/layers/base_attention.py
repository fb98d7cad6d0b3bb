"""The call contract shared by every attention layer in keras_attention."""

import math

import keras
from keras import ops

from keras_attention.ops import masking
from keras_attention.ops import scores as score_ops


def _static_shape(x):
    return tuple(x.shape)


def _describe(value):
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return repr(value)


class BaseAttention(keras.layers.Layer):
    """Base class: masks, causality, dropout, scores and self-attention.

    A subclass supplies only its score function by overriding `build_score`
    (create weights from the query and key shapes) and `score` (return
    `(B, Tq, Tk)` logits). Layers with another kernel, such as multi-head
    attention, override `_compute_attention` instead.

    Args:
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, Tq, dq)`.
        value: `(B, Tv, dv)`; `None` means self-attention (`value = query`),
            which is what `model.add(layer)` uses.
        key: `(B, Tv, dk)`; `None` means `key = value`.
        query_mask: `(B, Tq)` boolean, `True` for real query positions.
        value_mask: `(B, Tv)` boolean, `True` for real key/value positions.
        key_mask: `(B, Tv)` boolean, combined with `value_mask`.
        attention_mask: `(B, Tq, Tv)` boolean, `True` where query `i` may
            attend to key `j`.
        use_causal_mask: if `True`, query `i` sees only keys `j <= i`.
        return_attention_scores: if `True`, also return the attention
            weights (after softmax, before dropout).
        training: whether dropout is active.
        mask: the Keras mask of `query`, filled in automatically when the
            layer is called on a single input; treated as `query_mask`.

    Keras masks propagate: an upstream `Embedding(mask_zero=True)` fills in
    `query_mask`/`value_mask`, and the output carries the query mask.

    Returns:
        `(B, Tq, dv)`, and with `return_attention_scores=True` also the
        weights `(B, Tq, Tv)`. A query row whose keys are all masked gets zero
        weights and a zero output, never NaN.
    """

    # Set by `capture_attention`; `None` means weights are not being recorded.
    _attention_recorder = None

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(
                f"{type(self).__name__}: `dropout` must be a float in [0, 1). "
                f"Received: dropout={dropout!r}"
            )
        if seed is not None and not isinstance(seed, int):
            raise TypeError(
                f"{type(self).__name__}: `seed` must be an integer or None. "
                f"Received: seed={seed!r}"
            )
        self.dropout = float(dropout)
        self.seed = seed
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=seed, dtype=self.dtype_policy
        )

    # ------------------------------------------------------------------ hooks
    def build_score(self, query_shape, key_shape):
        """Creates the score function's weights. Override in subclasses."""

    def score(self, query, key):
        """Returns logits `(B, Tq, Tk)`. Override in subclasses."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `score(query, key)`."
        )

    def _compute_attention(self, query, key, value, mask, training=None):
        """Returns `(output, weights)` given a combined boolean mask or `None`."""
        weights = masking.masked_softmax(self.score(query, key), mask)
        output = score_ops.weighted_sum(
            self._dropout_layer(weights, training=training), value
        )
        return output, weights

    @property
    def _capturing_attention(self):
        return self._attention_recorder is not None

    def _record_attention(self, weights):
        """Hands computed weights to an active `capture_attention`, if any."""
        if self._attention_recorder is not None:
            self._attention_recorder.weights.append(weights)

    # ------------------------------------------------------------- validation
    def _error(self, message):
        return f"{type(self).__name__} (layer '{self.name}'): {message}"

    def _check_rank3(self, name, shape):
        if shape is not None and len(shape) != 3:
            raise ValueError(
                self._error(
                    f"`{name}` must have rank 3 (batch, time, features). "
                    f"Received: {name} with shape {tuple(shape)}"
                )
            )

    def _check_input_shapes(self, query_shape, value_shape, key_shape):
        self._check_rank3("query", query_shape)
        self._check_rank3("value", value_shape)
        self._check_rank3("key", key_shape)
        if value_shape is not None and key_shape is not None:
            tv, tk = value_shape[1], key_shape[1]
            if tv is not None and tk is not None and tv != tk:
                raise ValueError(
                    self._error(
                        "`key` and `value` must have the same length. Received: "
                        f"key shape {tuple(key_shape)}, value shape "
                        f"{tuple(value_shape)}"
                    )
                )
        built_shapes = getattr(self, "_built_feature_dims", None)
        if built_shapes is not None:
            for name, shape, dim in zip(
                ("query", "value", "key"),
                (query_shape, value_shape, key_shape),
                built_shapes,
            ):
                if shape is not None and shape[-1] is not None and shape[-1] != dim:
                    raise ValueError(
                        self._error(
                            f"`{name}` has {shape[-1]} features but the layer "
                            f"was built for {dim}. Received: {name} with shape "
                            f"{tuple(shape)}"
                        )
                    )

    def _check_mask(self, name, mask, expected):
        if mask is None:
            return
        if not hasattr(mask, "dtype") or not hasattr(mask, "shape"):
            raise TypeError(
                self._error(
                    f"`{name}` must be a boolean tensor. Received: "
                    f"{name}={_describe(mask)}"
                )
            )
        dtype = str(mask.dtype)
        if not ("bool" in dtype or "int" in dtype):
            raise TypeError(
                self._error(
                    f"`{name}` must be boolean (or integer 0/1), True where "
                    f"attention is allowed. Received: {name} with dtype {dtype}"
                )
            )
        shape = _static_shape(mask)
        ok = len(shape) == len(expected) and all(
            got is None or want is None or got == want or (i == 0 and got == 1)
            for i, (got, want) in enumerate(zip(shape, expected))
        )
        if not ok:
            raise ValueError(
                self._error(
                    f"`{name}` must have shape {expected} (None = any). "
                    f"Received: {name} with shape {shape}"
                )
            )

    def _resolve_inputs(self, query, value, key):
        if value is None:
            if key is not None:
                raise ValueError(
                    self._error(
                        "`key` was given without `value`. Pass `value` too, or "
                        "neither for self-attention."
                    )
                )
            value = query
        if key is None:
            key = value
        return query, value, key

    def _validate_call(
        self, query, value, key, query_mask, value_mask, key_mask, attention_mask
    ):
        for name, x in (("query", query), ("value", value), ("key", key)):
            if x is not None and not hasattr(x, "shape"):
                raise TypeError(
                    self._error(
                        f"`{name}` must be a tensor. Received: {name}={x!r}"
                    )
                )
        query, value, key = self._resolve_inputs(query, value, key)
        self._check_input_shapes(
            _static_shape(query), _static_shape(value), _static_shape(key)
        )
        batch, tq = query.shape[0], query.shape[1]
        tv = value.shape[1]
        self._check_mask("query_mask", query_mask, (batch, tq))
        self._check_mask("value_mask", value_mask, (batch, tv))
        self._check_mask("key_mask", key_mask, (batch, tv))
        self._check_mask("attention_mask", attention_mask, (batch, tq, tv))
        return query, value, key

    # --------------------------------------------------------------- keras API
    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_input_shapes(query_shape, value_shape, key_shape)
        self.build_score(tuple(query_shape), tuple(key_shape))
        self._built_feature_dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self.built = True

    def call(
        self,
        query,
        value=None,
        key=None,
        *,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        mask=None,
    ):
        self_attention = value is None
        if query_mask is None:
            query_mask = mask
        if self_attention and value_mask is None:
            value_mask = query_mask
        query, value, key = self._validate_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask
        )
        combined = masking.attention_mask_from(
            query_mask=query_mask,
            value_mask=masking.merge_masks(value_mask, key_mask),
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_length=ops.shape(query)[1],
            key_length=ops.shape(key)[1],
        )
        output, weights = self._compute_attention(
            query, key, value, combined, training=training
        )
        self._record_attention(weights)
        if return_attention_scores:
            return output, weights
        return output

    def compute_mask(self, inputs, previous_mask=None):
        return previous_mask

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        return tuple(query_shape[:-1]) + (value_shape[-1],)

    def _scores_shape(self, query_shape, value_shape):
        return (query_shape[0], query_shape[1], value_shape[1])

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        *,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        mask=None,
    ):
        query, value, key = self._validate_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask
        )
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return output
        scores = keras.KerasTensor(
            self._scores_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        return output, scores

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "seed": self.seed})
        return config


def validate_positive_int(layer_name, argument, value, allow_none=False):
    """Raises a clear error unless `value` is a positive integer."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{layer_name}: `{argument}` must be a positive integer"
            f"{' or None' if allow_none else ''}. Received: {argument}={value!r}"
        )
    return value


def inverse_sqrt(dim):
    return 1.0 / math.sqrt(dim)
