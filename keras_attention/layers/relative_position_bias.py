"""T5's bucketed relative position bias, as a `score_mod` with a learned table."""

import math

import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export


@keras_attention_export("layers")
class RelativePositionBias(keras.layers.Layer):
    """T5's relative position bias (Raffel et al., 2020), for `score_mod=`.

    Each head adds a learned scalar to the logit of query `i` and key `j`,
    looked up by the bucket of the relative position `j - i`: exact buckets
    for distances below `num_buckets // 2` (of each direction when
    `bidirectional`), logarithmically wider ones up to `max_distance`, and one
    last bucket beyond. Pass the layer as a `MultiHeadAttention`'s
    `score_mod`: the kernels read its table per tile (never an `L x L` bias
    in the blockwise kernel) and its weight `embeddings` `(num_buckets,
    num_heads)` trains with the model on every kernel, the blockwise one
    included, and saves with it.

    Args:
        num_heads: the attention layer's number of query heads.
        num_buckets: number of buckets (T5: 32).
        max_distance: distance from which every position shares the last
            bucket (T5: 128).
        bidirectional: encoder attention (both directions, half the
            buckets each) or decoder attention (`False`: keys after the
            query share bucket 0).
        embeddings_initializer: initializer of the table.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Example:

    >>> import numpy as np, keras_attention as ka
    >>> bias = ka.layers.RelativePositionBias(num_heads=2)
    >>> layer = ka.MultiHeadAttention(2, 4, score_mod=bias)
    >>> tuple(layer(np.ones((1, 5, 8), "float32")).shape)
    (1, 5, 8)
    """

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        owner = type(self).__name__
        self.num_heads = validation.validate_positive_int(owner, "num_heads", num_heads)
        self.num_buckets = validation.validate_positive_int(owner, "num_buckets", num_buckets)
        if self.num_buckets < (4 if bidirectional is True else 2):
            raise ValueError(
                f"{owner}: `num_buckets` must be at least 4 (2 when not bidirectional). "
                f"Received: num_buckets={num_buckets!r}"
            )
        self.max_distance = validation.validate_positive_int(owner, "max_distance", max_distance)
        self.bidirectional = validation.validate_bool(owner, "bidirectional", bidirectional)
        exact = (self.num_buckets // 2 if self.bidirectional else self.num_buckets) // 2
        if self.max_distance <= exact:
            raise ValueError(
                f"{owner}: `max_distance` must exceed the exact buckets ({exact}). "
                f"Received: max_distance={max_distance!r}, num_buckets={num_buckets!r}"
            )
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
        )
        self.built = True

    def bucket(self, relative_position):
        """T5's bucket of each relative position `key - query` (int32)."""
        n = -ops.cast(relative_position, "int32")
        buckets = self.num_buckets
        result = ops.zeros_like(n)
        if self.bidirectional:
            buckets //= 2
            result = result + ops.cast(ops.less(n, 0), "int32") * buckets
            n = ops.abs(n)
        else:
            n = ops.maximum(n, 0)
        exact = buckets // 2
        small = ops.less(n, exact)
        scale = (buckets - exact) / math.log(self.max_distance / exact)
        # Where n < exact the log is unused (and n may be 0): a safe 1 there.
        log_ratio = ops.log(ops.cast(ops.maximum(n, 1), "float32") / exact)
        large = exact + ops.cast(log_ratio * scale, "int32")
        large = ops.minimum(large, buckets - 1)
        return result + ops.where(small, n, large)

    @property
    def score_weights(self):
        """The weights `modify_scores` reads, in its argument order."""
        return [self.embeddings]

    def modify_scores(self, score, batch, head, q_idx, k_idx, embeddings):
        """The `score_mod`: `score + embeddings[bucket(k - q), head]`."""
        flat = ops.reshape(ops.cast(embeddings, score.dtype), (-1,))
        index = self.bucket(k_idx - q_idx) * self.num_heads + head
        return score + ops.take(flat, index)

    def call(self, score, batch, head, q_idx, k_idx):
        return self.modify_scores(score, batch, head, q_idx, k_idx, self.embeddings)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
