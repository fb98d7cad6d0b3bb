import keras

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.layers.utils import clone_initializer
from keras_attention.layers.utils import validate_positive_int
from keras_attention.ops import scores as score_ops


@keras_attention_export("layers")
class AdditiveAttention(ScoreAttention):
    """Additive (Bahdanau) attention: `score(q, k) = v^T tanh(Wq q + Wk k + b)`.

    Bahdanau, Cho and Bengio, "Neural Machine Translation by Jointly Learning
    to Align and Translate", 2014 (https://arxiv.org/abs/1409.0473).

    Unlike `keras.layers.AdditiveAttention`, the query and key are projected by
    learned matrices, so their feature sizes may differ, as in the paper.

    Args:
        units: width of the hidden layer of the score MLP; defaults to the
            key's feature size.
        use_bias: whether to add `b` inside the `tanh`.
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        kernel_initializer, bias_initializer: initializers for `Wq`, `Wk`,
            `v` and for `b`.
        kernel_regularizer: regularizer for `Wq`, `Wk` and `v`.

    Call arguments and returns: see `ScoreAttention`. Shapes: query
    `(B, Tq, dq)`, value `(B, Tv, dv)` -> output `(B, Tq, dv)`, weights
    `(B, Tq, Tv)`.

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
        units=None,
        use_bias=True,
        dropout=0.0,
        seed=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.units = validate_positive_int(
            "AdditiveAttention", "units", units, allow_none=True
        )
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    def build_score(self, query_shape, key_shape):
        units = self.units or key_shape[-1]
        self.query_kernel = self.add_weight(
            name="query_kernel",
            shape=(query_shape[-1], units),
            initializer=clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )
        self.key_kernel = self.add_weight(
            name="key_kernel",
            shape=(key_shape[-1], units),
            initializer=clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )
        self.bias = (
            self.add_weight(
                name="bias", shape=(units,), initializer=clone_initializer(self.bias_initializer)
            )
            if self.use_bias
            else None
        )
        self.score_vector = self.add_weight(
            name="score_vector",
            shape=(units,),
            initializer=clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )

    def score(self, query, key):
        projected_query = keras.ops.matmul(query, self.query_kernel)
        if self.bias is not None:
            projected_query = projected_query + self.bias
        projected_key = keras.ops.matmul(key, self.key_kernel)
        return score_ops.additive_score(
            projected_query, projected_key, self.score_vector
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
            }
        )
        return config
