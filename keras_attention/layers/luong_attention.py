import keras
from keras import ops

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.layers.utils import clone_initializer
from keras_attention.layers.utils import inverse_sqrt
from keras_attention.layers.utils import validate_positive_int
from keras_attention.ops import scores as score_ops

SCORES = ("dot", "general", "concat")


@keras_attention_export("layers")
class LuongAttention(ScoreAttention):
    """Multiplicative (Luong) attention with the three scores of the paper.

    Luong, Pham and Manning, "Effective Approaches to Attention-based Neural
    Machine Translation", 2015 (https://arxiv.org/abs/1508.04025).

    - `score="dot"`: `q . k` (query and key need the same feature size).
    - `score="general"`: `q^T W k`, with `W` of shape `(dq, dk)`.
    - `score="concat"`: `v^T tanh(W [q; k])`, with `W` of shape
      `(dq + dk, units)`.

    `scale=True` divides every score by `sqrt(dk)`; with `score="dot"` that is
    the scaled dot-product attention of the Transformer.

    Args:
        score: one of `"dot"`, `"general"`, `"concat"`.
        units: hidden width of the `concat` score; defaults to `dk`. Only
            valid with `score="concat"`.
        scale: divide scores by `sqrt(dk)`.
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        kernel_initializer: initializer for `W` (and `v`).
        kernel_regularizer: regularizer for `W` (and `v`).

    Call arguments and returns: see `ScoreAttention`.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.LuongAttention(score="general")
    >>> out = layer(np.ones((2, 3, 4), "float32"), np.ones((2, 6, 5), "float32"))
    >>> tuple(out.shape)
    (2, 3, 5)
    """

    def __init__(
        self,
        score="dot",
        units=None,
        scale=False,
        dropout=0.0,
        seed=None,
        kernel_initializer="glorot_uniform",
        kernel_regularizer=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        if score not in SCORES:
            raise ValueError(
                f"LuongAttention: `score` must be one of {SCORES}. "
                f"Received: score={score!r}"
            )
        if units is not None and score != "concat":
            raise ValueError(
                "LuongAttention: `units` only applies to score='concat'. "
                f"Received: units={units!r} with score={score!r}"
            )
        self.score_mode = score
        self.units = validate_positive_int(
            "LuongAttention", "units", units, allow_none=True
        )
        self.scale = bool(scale)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    def build_score(self, query_shape, key_shape):
        query_dim, key_dim = query_shape[-1], key_shape[-1]
        self._scale_factor = inverse_sqrt(key_dim) if self.scale else None
        if self.score_mode == "dot":
            if query_dim != key_dim:
                raise ValueError(
                    self._error(
                        "score='dot' needs query and key with the same number "
                        f"of features. Received: query features {query_dim}, "
                        f"key features {key_dim}. Use score='general' for "
                        "different sizes."
                    )
                )
        elif self.score_mode == "general":
            self.kernel = self.add_weight(
                name="kernel",
                shape=(query_dim, key_dim),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
        else:
            units = self.units or key_dim
            self.kernel = self.add_weight(
                name="kernel",
                shape=(query_dim + key_dim, units),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
            self.score_vector = self.add_weight(
                name="score_vector",
                shape=(units,),
                initializer=clone_initializer(self.kernel_initializer),
                regularizer=self.kernel_regularizer,
            )
            self._query_dim = query_dim

    def score(self, query, key):
        if self.score_mode == "dot":
            scores = score_ops.dot_score(query, key)
        elif self.score_mode == "general":
            scores = score_ops.general_score(query, key, self.kernel)
        else:
            # W [q; k] = W_q q + W_k k: split W rather than tiling the concat.
            query_part = ops.matmul(query, self.kernel[: self._query_dim])
            key_part = ops.matmul(key, self.kernel[self._query_dim :])
            scores = score_ops.additive_score(query_part, key_part, self.score_vector)
        if self._scale_factor is not None:
            scores = scores * ops.cast(self._scale_factor, scores.dtype)
        return scores

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "score": self.score_mode,
                "units": self.units,
                "scale": self.scale,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
            }
        )
        return config
