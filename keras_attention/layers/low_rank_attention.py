import keras

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery.utils import clone_initializer
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.ops import score_functions as score_ops


@keras_attention_export("layers")
class LowRankAttention(ScoreAttention):
    """Low-rank multiplicative attention: `score(q, k) = (U q) . (V k)`.

    The bilinear score `q^T W k` with `W = U^T V` of rank `rank`: far fewer
    parameters than Luong's "general" score when `rank << min(dq, dk)`.

    Args:
        rank: the rank of `W` (number of rows of `U` and `V`).
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        kernel_initializer: initializer for `U` and `V`.
        kernel_regularizer: regularizer for `U` and `V`.

    Call arguments and returns: see `ScoreAttention`.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.LowRankAttention(rank=2)
    >>> tuple(layer(np.ones((1, 4, 8), "float32")).shape)
    (1, 4, 8)
    """

    def __init__(
        self,
        rank,
        dropout=0.0,
        seed=None,
        kernel_initializer="glorot_uniform",
        kernel_regularizer=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.rank = validate_positive_int("LowRankAttention", "rank", rank)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    def build_score(self, query_shape, key_shape):
        self.query_kernel = self.add_weight(
            name="query_kernel",
            shape=(query_shape[-1], self.rank),
            initializer=clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )
        self.key_kernel = self.add_weight(
            name="key_kernel",
            shape=(key_shape[-1], self.rank),
            initializer=clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )

    def score(self, query, key):
        return score_ops.low_rank_score(query, key, self.query_kernel, self.key_kernel)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "rank": self.rank,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            }
        )
        return config
