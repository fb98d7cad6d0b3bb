import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.additive_attention import AdditiveAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.machinery import utils
from keras_attention.layers.score_attention import ScoreAttention

_SCORE_NAMES = ("additive", "dot", "scaled_dot", "general", "concat")


def _score_layer(score, units, dropout, seed, dtype, name):
    if isinstance(score, ScoreAttention):
        return score
    if isinstance(score, dict):
        # A config dict passed to the constructor gets the same class check as
        # from_config's (a Dense config must not become the score layer).
        return validation.deserialize_layer(
            "AttentionPooling",
            "score",
            score,
            ScoreAttention,
            "a score name or a keras_attention single-head attention layer",
        )
    if score not in _SCORE_NAMES:
        raise ValueError(
            "AttentionPooling: `score` must be one of "
            f"{_SCORE_NAMES} or a keras_attention attention layer. "
            f"Received: score={score!r}"
        )
    if units is not None and score not in ("additive", "concat"):
        raise ValueError(
            "AttentionPooling: `units` only applies to score='additive' or "
            f"'concat'. Received: units={units!r} with score={score!r}"
        )
    # The user built AttentionPooling: the sublayer's errors say so.
    common = dict(dropout=dropout, seed=seed, dtype=dtype, name=name)
    with validation.errors_name("AttentionPooling"):
        if score == "additive":
            return AdditiveAttention(units=units, **common)
        if score == "scaled_dot":
            return LuongAttention(score_mode="dot", divide_by_sqrt_dim=True, **common)
        return LuongAttention(score_mode=score, units=units, **common)


@keras_attention_export("layers")
class AttentionPooling(keras.layers.Layer):
    """Pools a sequence into one vector with a learned attention query.

    The "many-to-one" use of attention: a trained query vector attends over
    the time steps, and the weighted sum of the inputs is returned. Typical
    after `LSTM(return_sequences=True)` in a classifier; padded steps (a Keras
    mask, or `mask=`) get zero weight.

    Args:
        score: how the learned query scores each step: `"additive"`,
            `"dot"`, `"scaled_dot"`, `"general"`, `"concat"`, or any
            keras_attention single-head attention layer instance (e.g.
            `LowRankAttention(rank=4)`).
        units: hidden width of Bahdanau's (`"additive"`) and Luong's
            (`"concat"`) projected scores; `None` uses Keras' forms of those
            scores, without projections (see `AdditiveAttention`,
            `LuongAttention`).
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        query_initializer: initializer of the learned query.

    Call arguments:
        inputs: `(B, T, d)`.
        mask: `(B, T)` boolean, `True` for real steps (filled in from the
            Keras mask).
        return_attention_scores: also return the weights `(B, T)`.
        training: whether dropout is active.

    Returns:
        `(B, d)`, and the weights `(B, T)` if asked. A sequence that is fully
        masked pools to zeros.

    Example:

    >>> import keras, keras_attention
    >>> model = keras.Sequential([
    ...     keras.Input((None,), dtype="int32"),
    ...     keras.layers.Embedding(50, 8, mask_zero=True),
    ...     keras.layers.LSTM(8, return_sequences=True),
    ...     keras_attention.AttentionPooling(),
    ...     keras.layers.Dense(2, activation="softmax"),
    ... ])
    >>> tuple(model.output_shape)
    (None, 2)
    """

    def __init__(
        self,
        score="additive",
        units=None,
        dropout=0.0,
        seed=None,
        query_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.attention = _score_layer(
            score, units, dropout, seed, self.dtype_policy, f"{self.name}_attention"
        )
        self.score_name = score if isinstance(score, str) else None
        self.units = units
        self.dropout = dropout
        self.seed = seed
        self.query_initializer = keras.initializers.get(query_initializer)
        self.supports_masking = True

    def _error(self, message):
        return validation.error(self, message)

    def _check_inputs_shape(self, shape):
        if len(shape) != 3:
            raise ValueError(
                self._error(
                    "`inputs` must have rank 3 (batch, time, features). "
                    f"Received: inputs with shape {tuple(shape)}"
                )
            )
        built = getattr(self, "query", None)
        if built is not None and shape[-1] not in (None, built.shape[-1]):
            raise ValueError(
                self._error(
                    f"`inputs` has {shape[-1]} features but the layer was built "
                    f"for {built.shape[-1]}. Received: inputs with shape "
                    f"{tuple(shape)}"
                )
            )

    def _check_call(self, inputs, mask):
        """The user's arguments, checked here so errors name this layer."""
        if inputs is None or not (hasattr(inputs, "shape") and hasattr(inputs, "dtype")):
            raise TypeError(
                self._error(
                    f"`inputs` must be a tensor or array. Received: inputs={utils.describe(inputs)}"
                )
            )
        self._check_inputs_shape(tuple(inputs.shape))
        utils.check_mask(self, "mask", mask, tuple(inputs.shape[:2]))

    def __call__(self, inputs, *args, **kwargs):
        self._check_call(inputs, kwargs.get("mask", args[0] if args else None))
        return super().__call__(inputs, *args, **kwargs)

    def build(self, inputs_shape):
        self._check_inputs_shape(inputs_shape)
        features = inputs_shape[-1]
        self.query = self.add_weight(
            name="query", shape=(1, 1, features), initializer=self.query_initializer
        )
        if not self.attention.built:  # a deserialized layer may come built
            self.attention.build((None, 1, features), inputs_shape)
        self.built = True

    def call(self, inputs, mask=None, return_attention_scores=False, training=None):
        self._check_call(inputs, mask)
        # Integer inputs are cast (the learned query must stay float).
        inputs = utils.cast_to_compute_dtype(self, inputs)
        batch = ops.shape(inputs)[0]
        query = ops.broadcast_to(
            ops.cast(self.query, self.compute_dtype), (batch, 1, ops.shape(inputs)[-1])
        )
        output, weights = self.attention(
            query,
            inputs,
            value_mask=mask,
            return_attention_scores=True,
            training=training,
        )
        output, weights = output[:, 0, :], weights[:, 0, :]
        if return_attention_scores:
            return output, weights
        return output

    def compute_mask(self, inputs, previous_mask=None):
        return None

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], inputs_shape[-1])

    def compute_output_spec(self, inputs, mask=None, return_attention_scores=False, training=None):
        self._check_call(inputs, mask)
        output = keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=self.compute_dtype
        )
        if return_attention_scores:
            weights = keras.KerasTensor(inputs.shape[:2], dtype=self.compute_dtype)
            return output, weights
        return output

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "score": self.score_name or keras.saving.serialize_keras_object(self.attention),
                "units": self.units,
                "dropout": self.dropout,
                "seed": self.seed,
                "query_initializer": keras.initializers.serialize(self.query_initializer),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        # A tampered config must not rebuild an arbitrary layer as the score.
        config = dict(config)
        if isinstance(config.get("score"), dict):
            config["score"] = validation.deserialize_layer(
                cls.__name__,
                "score",
                config["score"],
                ScoreAttention,
                "a score name or a keras_attention single-head attention layer",
            )
        return cls(**config)
