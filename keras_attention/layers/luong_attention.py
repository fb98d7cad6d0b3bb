import warnings

import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.interchange import keras_layers
from keras_attention.layers.machinery.utils import clone_initializer
from keras_attention.layers.machinery.utils import inverse_sqrt
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.ops import masking
from keras_attention.ops import score_functions as score_ops

SCORES = ("dot", "concat", "general")


@keras_attention_export("layers")
class LuongAttention(ScoreAttention):
    """Multiplicative (Luong) attention; a drop-in for `keras.layers.Attention`.

    Luong, Pham and Manning, "Effective Approaches to Attention-based Neural
    Machine Translation", 2015 (https://arxiv.org/abs/1508.04025).

    The first four arguments are `keras.layers.Attention`'s, in its order,
    with its weight names (`scale`, `concat_score_weight`), so a Keras user's
    swap computes the same thing and `LuongAttention.from_keras(layer)` copies
    a Keras layer's weights. Our extras are keyword-only.

    - `score_mode="dot"`: `q . k` (query and key need the same feature
      size), as Keras and Luong's "dot".
    - `score_mode="concat"` without `units`: Keras' form,
      `c * sum(tanh(s * (q + k)))` over the features (`c` the weight
      `concat_score_weight`, `s` the `scale` with `use_scale=True`, else 1);
      query and key need the same feature size. It has no learned
      projection, unlike Luong's concat.
    - `score_mode="concat"` with `units`: Luong's concat, `v^T tanh(W [q; k])`
      with `W` of shape `(dq + dk, units)` (weights `kernel` and
      `score_vector`); query and key sizes may differ.
    - `score_mode="general"` (ours): Luong's `q^T W k`, `W` of shape
      `(dq, dk)` (weight `kernel`).

    `use_scale=True` learns a scalar `scale` (initialised to 1) that
    multiplies the scores (inside the `tanh` of Keras' concat, as Keras
    does). `divide_by_sqrt_dim=True` (ours) divides every score by
    `sqrt(dk)`, a constant; with `score_mode="dot"` that is the
    Transformer's scaled dot product.

    Args:
        use_scale: learn a scalar `scale` of the scores, as Keras.
        score_mode: `"dot"`, `"concat"` (Keras' values) or `"general"`.
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        units: (keyword-only) hidden width of Luong's concat score; only
            with `score_mode="concat"`.
        divide_by_sqrt_dim: (keyword-only) divide scores by `sqrt(dk)`.
        scale: (keyword-only) deprecated name of `divide_by_sqrt_dim` (it
            read like Keras' learned `scale` weight); still accepted, with a
            DeprecationWarning, until the next minor release.
        score: (keyword-only) older name of `score_mode`; give one of them.
        kernel_initializer: (keyword-only) initializer for `W` (and `v`).
        kernel_regularizer: (keyword-only) regularizer for `W` (and `v`).

    Call arguments and returns: see `ScoreAttention` (Keras' list call
    `layer([query, value(, key)], mask=[query_mask, value_mask])` included,
    inputs of any rank >= 3). Unlike Keras, a masked query row gets zero
    weights, not a distribution over the keys.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.LuongAttention(score_mode="general")
    >>> out = layer(np.ones((2, 3, 4), "float32"), np.ones((2, 6, 5), "float32"))
    >>> tuple(out.shape)
    (2, 3, 5)
    """

    def __init__(
        self,
        use_scale=False,
        score_mode="dot",
        dropout=0.0,
        seed=None,
        *,
        units=None,
        divide_by_sqrt_dim=False,
        scale=None,
        score=None,
        kernel_initializer="glorot_uniform",
        kernel_regularizer=None,
        **kwargs,
    ):
        owner = validation.constructor_owner(self)
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.use_scale = validation.validate_bool(owner, "use_scale", use_scale)
        if scale is not None:
            warnings.warn(
                f"{owner}: `scale` is deprecated: it is now called "
                "`divide_by_sqrt_dim` (a constant 1/sqrt(dk), not Keras' learned "
                f"`scale` weight, which `use_scale` adds). Received: scale={scale!r}",
                DeprecationWarning,
                stacklevel=2,
            )
            if divide_by_sqrt_dim:
                raise ValueError(
                    f"{owner}: `scale` is the deprecated name of "
                    "`divide_by_sqrt_dim`; give one of them. Received: "
                    f"scale={scale!r}, divide_by_sqrt_dim={divide_by_sqrt_dim!r}"
                )
            divide_by_sqrt_dim, sqrt_argument = scale, "scale"
        else:
            sqrt_argument = "divide_by_sqrt_dim"
        self.divide_by_sqrt_dim = validation.validate_bool(owner, sqrt_argument, divide_by_sqrt_dim)
        if score is not None:
            if score_mode not in ("dot", score):
                raise ValueError(
                    f"{owner}: `score` is the older name of `score_mode`; give "
                    f"one of them. Received: score={score!r}, "
                    f"score_mode={score_mode!r}"
                )
            score_mode, argument = score, "score"
        else:
            argument = "score_mode"
        if not isinstance(score_mode, str) or score_mode not in SCORES:
            raise ValueError(
                f"{owner}: Invalid value for argument {argument}. Expected one "
                "of {'dot', 'concat'} (keras.layers.Attention's) or 'general' "
                f"(Luong's q^T W k). Received: {argument}={score_mode!r}"
            )
        if units is not None and score_mode != "concat":
            raise ValueError(
                f"{owner}: `units` only applies to score_mode='concat'. "
                f"Received: units={units!r} with score_mode={score_mode!r}"
            )
        self.score_mode = score_mode
        self.units = validation.validate_positive_int(owner, "units", units, allow_none=True)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    @classmethod
    def from_keras(cls, layer, **kwargs):
        """Builds ours from a built `keras.layers.Attention`, with its weights.

        Outputs match Keras' to float rounding (rows with an unmasked query;
        see the class docstring for masked query rows). `kwargs` override
        constructor arguments.
        """
        if type(layer) is not keras.layers.Attention:
            raise TypeError(
                f"{cls.__name__}.from_keras expects a keras.layers.Attention. "
                f"Received: {type(layer).__name__}"
            )
        return keras_layers.from_keras_layer(cls, layer, kwargs)

    def build_score(self, query_shape, key_shape):
        query_dim, key_dim = query_shape[-1], key_shape[-1]
        self._scale_factor = inverse_sqrt(key_dim) if self.divide_by_sqrt_dim else None
        keras_form = self.score_mode == "dot" or (
            self.score_mode == "concat" and self.units is None
        )
        if keras_form and query_dim != key_dim:
            raise ValueError(
                self._error(
                    f"score_mode={self.score_mode!r} without `units` needs query "
                    "and key with the same number of features. Received: query "
                    f"features {query_dim}, key features {key_dim}. Use "
                    "score_mode='general' (or 'concat' with units) for "
                    "different sizes."
                )
            )
        # Keras' weights first, in Keras' order.
        self.scale = None
        self.concat_score_weight = None
        if self.use_scale:
            self.scale = self.add_weight(name="scale", shape=(), initializer="ones", trainable=True)
        if self.score_mode == "concat" and self.units is None:
            self.concat_score_weight = self.add_weight(
                name="concat_score_weight",
                shape=(),
                initializer="ones",
                trainable=True,
            )
        elif self.score_mode == "general":
            self.kernel = self.add_weight(
                name="kernel",
                shape=(query_dim, key_dim),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
        elif self.score_mode == "concat":
            self.kernel = self.add_weight(
                name="kernel",
                shape=(query_dim + key_dim, self.units),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
            self.score_vector = self.add_weight(
                name="score_vector",
                shape=(self.units,),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
            self._query_dim = query_dim

    def score(self, query, key):
        learned_scale = self.scale
        if self.score_mode == "dot":
            scores = score_ops.dot_score(query, key)
        elif self.score_mode == "general":
            scores = score_ops.general_score(query, key, self.kernel)
        elif self.units is None:  # Keras' concat: c * sum(tanh(s * (q + k)))
            wide = masking.score_dtype(query.dtype)
            query, key = ops.cast(query, wide), ops.cast(key, wide)
            hidden = ops.expand_dims(query, -2) + ops.expand_dims(key, -3)
            if learned_scale is not None:
                hidden = hidden * ops.cast(learned_scale, wide)
            learned_scale = None  # applied inside the tanh
            scores = ops.cast(self.concat_score_weight, wide) * ops.sum(ops.tanh(hidden), axis=-1)
        else:
            # W [q; k] = W_q q + W_k k: split W rather than tiling the concat.
            query_part = ops.matmul(query, self.kernel[: self._query_dim])
            key_part = ops.matmul(key, self.kernel[self._query_dim :])
            scores = score_ops.additive_score(query_part, key_part, self.score_vector)
        if learned_scale is not None:
            scores = scores * ops.cast(learned_scale, scores.dtype)
        if self._scale_factor is not None:
            scores = scores * ops.cast(self._scale_factor, scores.dtype)
        return scores

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "use_scale": self.use_scale,
                "score_mode": self.score_mode,
                "units": self.units,
                "divide_by_sqrt_dim": self.divide_by_sqrt_dim,
                "scale": None,  # the deprecated name, resolved into divide_by_sqrt_dim
                "score": None,  # the older name, resolved into score_mode
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            }
        )
        return config
