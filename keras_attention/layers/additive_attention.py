import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.interchange import keras_layers
from keras_attention.layers.machinery.utils import clone_initializer
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.ops import score_functions as score_ops


@keras_attention_export("layers")
class AdditiveAttention(ScoreAttention):
    """Additive (Bahdanau) attention; a drop-in for `keras.layers.AdditiveAttention`.

    Bahdanau, Cho and Bengio, "Neural Machine Translation by Jointly Learning
    to Align and Translate", 2014 (https://arxiv.org/abs/1409.0473).

    The first two arguments are `keras.layers.AdditiveAttention`'s, in its
    order, with its weight name (`scale`); our extras are keyword-only.

    - Without `units`: Keras' score, `sum(scale * tanh(q + k))` over the
      features (`scale` a learned `(dq,)` vector with `use_scale=True`, else
      1), so a Keras user's swap computes the same thing and
      `AdditiveAttention.from_keras(layer)` copies a Keras layer's weights.
      It has no learned projections (Bahdanau's has), so query and key need
      the same feature size.
    - With `units`: Bahdanau's score, `v^T tanh(Wq q + Wk k + b)`, with
      `Wq` `(dq, units)`, `Wk` `(dk, units)` (weights `query_kernel`,
      `key_kernel`, `bias`), and `v` the `(units,)` weight `scale`
      (`use_scale=True`, the default; `False` fixes `v` to ones). Query and
      key sizes may differ, as in the paper.

    Args:
        use_scale: learn the vector `scale` (`v`), as Keras.
        dropout: fraction of attention weights dropped during training.
        seed: (keyword-only) seed for the dropout.
        units: (keyword-only) width of the hidden layer of Bahdanau's score;
            `None` is Keras' score without projections.
        use_bias: (keyword-only) whether to add `b` inside the `tanh` (with
            `units`).
        kernel_initializer, bias_initializer: (keyword-only) initializers for
            `Wq`, `Wk`, `scale` and for `b`.
        kernel_regularizer: (keyword-only) regularizer for `Wq`, `Wk` and
            `scale`.

    Call arguments and returns: see `ScoreAttention` (Keras' list call
    `layer([query, value(, key)], mask=[query_mask, value_mask])` included,
    inputs of any rank >= 3). Shapes: query `(B, Tq, dq)`, value
    `(B, Tv, dv)` -> output `(B, Tq, dv)`, weights `(B, Tq, Tv)`. Unlike
    Keras, a masked query row gets zero weights, not a distribution.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.AdditiveAttention(units=8)
    >>> decoder_states = np.random.rand(2, 3, 16).astype("float32")
    >>> encoder_states = np.random.rand(2, 5, 12).astype("float32")
    >>> context, weights = layer(decoder_states, encoder_states,
    ...                          return_attention_scores=True)
    >>> tuple(context.shape), tuple(weights.shape)
    ((2, 3, 12), (2, 3, 5))
    """

    def __init__(
        self,
        use_scale=True,
        dropout=0.0,
        *,
        seed=None,
        units=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        **kwargs,
    ):
        owner = validation.constructor_owner(self)
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.use_scale = validation.validate_bool(owner, "use_scale", use_scale)
        self.units = validation.validate_positive_int(owner, "units", units, allow_none=True)
        self.use_bias = validation.validate_bool(owner, "use_bias", use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    @classmethod
    def from_keras(cls, layer, **kwargs):
        """Builds ours from a built `keras.layers.AdditiveAttention`, with its
        weights. Outputs match Keras' to float rounding (rows with an
        unmasked query). `kwargs` override constructor arguments."""
        if type(layer) is not keras.layers.AdditiveAttention:
            raise TypeError(
                f"{cls.__name__}.from_keras expects a "
                "keras.layers.AdditiveAttention. Received: "
                f"{type(layer).__name__}"
            )
        return keras_layers.from_keras_layer(cls, layer, kwargs)

    def build_score(self, query_shape, key_shape):
        self.query_kernel = self.key_kernel = self.bias = self.scale = None
        width = self.units
        if width is None:
            if query_shape[-1] != key_shape[-1]:
                raise ValueError(
                    self._error(
                        "without `units` the score is Keras' sum(scale * "
                        "tanh(q + k)), which needs query and key with the same "
                        f"number of features. Received: query features "
                        f"{query_shape[-1]}, key features {key_shape[-1]}. Pass "
                        "units=... for Bahdanau's projected score."
                    )
                )
            width = query_shape[-1]
        else:
            self.query_kernel = self.add_weight(
                name="query_kernel",
                shape=(query_shape[-1], width),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
            self.key_kernel = self.add_weight(
                name="key_kernel",
                shape=(key_shape[-1], width),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
            if self.use_bias:
                self.bias = self.add_weight(
                    name="bias",
                    shape=(width,),
                    initializer=clone_initializer(self.bias_initializer),
                )
        if self.use_scale:
            self.scale = self.add_weight(
                name="scale",
                shape=(width,),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )

    def score(self, query, key):
        if self.units is not None:
            query = ops.matmul(query, self.query_kernel)
            if self.bias is not None:
                query = query + self.bias
            key = ops.matmul(key, self.key_kernel)
        if self.scale is not None:
            return score_ops.additive_score(query, key, self.scale)
        # Keras' use_scale=False: the plain sum of the tanh.
        hidden = ops.tanh(ops.expand_dims(query, -2) + ops.expand_dims(key, -3))
        return ops.sum(hidden, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "use_scale": self.use_scale,
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            }
        )
        return config
