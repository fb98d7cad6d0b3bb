import keras
from keras import ops

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.machinery import utils
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.ops import favor

KERNELS = ("softmax", "relu")


@keras_attention_export("layers")
class PerformerAttention(BaseMultiHeadAttention):
    """Multi-head attention in linear time with FAVOR+ random features.

    Choromanski et al. 2021, "Rethinking Attention with Performers"
    (https://arxiv.org/abs/2009.14794). The softmax kernel is approximated
    by positive orthogonal random features, so attention costs
    `O(L * num_features * key_dim)` time and linear memory instead of
    `O(L^2)`. Features are computed in float32 under any dtype policy, with
    the usual stabilisation (inputs scaled by `key_dim^-1/4`, the largest
    exponent subtracted, a small epsilon added); see
    `keras_attention.ops.favor`. The non-causal softmax kernel (the default)
    with static lengths never holds the whole `(L, num_features)` feature
    maps: it runs over chunks of the sequence under a recomputing gradient
    (`favor.chunked_softmax_attention`), so forward + backward memory is
    `O(L * key_dim)`.

    The projections are those of `MultiHeadAttention` with the same
    arguments, in the same order, so `trainable_weights` move between the
    two with `set_weights`. The random projection is a non-trainable float32
    weight `(num_features, key_dim)` drawn from `seed` in `build` and saved
    with the model, so serving is deterministic. `redraw_features()` (or the
    `RedrawFeatures` callback during training) draws a new one; the count of
    redraws is the non-trainable int32 weight `redraws`, saved too, so a
    loaded layer's next redraw is the one the saved layer would have drawn.

    Args:
        num_heads, key_dim: as `MultiHeadAttention`.
        num_features: number of random features `m`; more is more accurate
            (error roughly `1 / m`) and slower.
        kernel: `"softmax"` (FAVOR+, approximates softmax attention) or
            `"relu"` (the Performer's generalised ReLU kernel).
        orthogonal: draw the projection with orthogonal blocks of `key_dim`
            rows (lower variance) rather than independent Gaussian rows.
        causal: always attend causally (query `i` sees keys `j <= i`) by
            chunked prefix sums. Self-attention only. `use_causal_mask=True`
            at call time does the same for one call.
        seed: seed of the projection and its redraws; `None` draws a fresh
            one (saved with the model all the same).
        chunk_size: sequence chunk length of the chunked kernels (the causal
            prefix sums and the memory-linear non-causal kernel).
        **kwargs: the other `BaseMultiHeadAttention` arguments (`value_dim`,
            `num_key_value_heads`, `use_bias`, `output_shape`, `use_gate`,
            initializers, ...). `dropout` must be 0: dropping entries of an
            attention matrix that is never formed has no linear-time
            equivalent.

    Call arguments: as `BaseMultiHeadAttention` (no decoding `cache`). Masked keys
    contribute nothing. An explicit `attention_mask` has no linear-time form:
    giving one computes the `(B, H, Tq, Tv)` kernel matrix of the same
    features (quadratic, but the same approximation).

    Returns:
        `(B, Tq, dim)`; with `return_attention_scores=True` also the implied
        approximate weights `(B, H, Tq, Tv)` (`O(Tq * Tv)`, for
        visualisation), float32.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.PerformerAttention(
    ...     num_heads=2, key_dim=4, num_features=16, causal=True, seed=0)
    >>> tuple(layer(np.ones((1, 30, 8), "float32")).shape)
    (1, 30, 8)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        num_features=256,
        kernel="softmax",
        orthogonal=True,
        causal=False,
        seed=None,
        chunk_size=128,
        **kwargs,
    ):
        name = "PerformerAttention"
        validate_positive_int(name, "num_features", num_features)
        if kernel not in KERNELS:
            raise ValueError(
                f"{name}: `kernel` must be one of {KERNELS}. Received: kernel={kernel!r}"
            )
        for argument, value in (("orthogonal", orthogonal), ("causal", causal)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"{name}: `{argument}` must be True or False. Received: {argument}={value!r}"
                )
        dropout = kwargs.get("dropout", 0.0)
        if dropout:
            raise ValueError(
                f"{name}: `dropout` of attention weights has no linear-time "
                "form (the weights are never formed); apply dropout to the "
                f"layer's output instead. Received: dropout={dropout!r}"
            )
        super().__init__(num_heads, key_dim, seed=seed, **kwargs)
        self.chunk_size = validate_positive_int(name, "chunk_size", chunk_size)
        self.num_features = num_features
        self.kernel = kernel
        self.orthogonal = orthogonal
        self.causal = causal

    def _draw_projection(self, redraw):
        seed = None if self.seed is None else (self.seed, redraw)
        return favor.random_projection(
            self.num_features, self.key_dim, orthogonal=self.orthogonal, seed=seed
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        initial = self._draw_projection(0)
        # Created after the parent's weights and non-trainable, so that
        # `trainable_weights` are exactly MultiHeadAttention's.
        self.projection = self.add_weight(
            name="projection",
            shape=(self.num_features, self.key_dim),
            dtype="float32",
            initializer=lambda shape, dtype=None: ops.convert_to_tensor(initial, dtype="float32"),
            trainable=False,
        )
        # How many redraws this projection is past the first: layer state,
        # saved with the model, so a loaded layer redraws onwards.
        self.redraws = self.add_weight(
            name="redraws",
            shape=(),
            dtype="int32",
            initializer="zeros",
            trainable=False,
        )
        # The same count as a Python int: redraws run from callbacks, where
        # under a tf.distribute strategy the variable's value is a
        # MirroredVariable that NumPy cannot read. `load_own_variables`
        # reads the saved count back into it.
        self._redraw_count = 0

    def load_own_variables(self, store):
        super().load_own_variables(store)
        self._redraw_count = int(ops.convert_to_numpy(self.redraws))

    def redraw_features(self):
        """Draws a new random projection (deterministic given `seed`).

        The `k`-th redraw of a layer with `seed=s` uses NumPy seed `(s, k)`;
        the projection drawn in `build` is `(s, 0)`.
        """
        if not self.built:
            raise ValueError(
                self._error(
                    "redraw_features needs a built layer (call it once). Received: an unbuilt layer"
                )
            )
        redraw = self._redraw_count + 1
        self._redraw_count = redraw
        self.redraws.assign(redraw)
        self.projection.assign(self._draw_projection(redraw))

    def _check_call_options(self, query, value, attention_mask, use_causal_mask):
        self._reject_per_head_mask(attention_mask)
        if (self.causal or use_causal_mask) and value is not None and value is not query:
            raise ValueError(
                self._error(
                    "causal attention is self-attention only: call the layer "
                    "on the query alone (value=None). Received: a `value` with "
                    f"shape {tuple(value.shape)} and causal={self.causal}, "
                    f"use_causal_mask={use_causal_mask}"
                )
            )

    def _attend(self, query, key, value, mask, *, return_weights, **_):
        # `dropout > 0` is rejected at construction; the base zeroes masked
        # query rows, and a per-head mask is refused by `_check_call_options`.
        return favor.favor_attention(
            query,
            key,
            value,
            self.projection,
            kernel=self.kernel,
            causal=self.causal or mask.causal,
            key_mask=mask.key_mask,
            attention_mask=None if mask.pair_mask is None else mask.pair_mask[:, 0],
            chunk_size=self.chunk_size,
            return_weights=return_weights,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_features": self.num_features,
                "kernel": self.kernel,
                "orthogonal": self.orthogonal,
                "causal": self.causal,
                "chunk_size": self.chunk_size,
            }
        )
        return config


@keras_attention_export("layers")
class RedrawFeatures(keras.callbacks.Callback):
    """Redraws the random features of every `PerformerAttention` in the model.

    The Performer paper redraws features periodically during training; this
    callback calls `redraw_features()` on each `PerformerAttention` layer
    (nested ones included) every `every_n_steps` training batches.

    Args:
        every_n_steps: number of training batches between redraws.

    Example:

    >>> import keras_attention
    >>> callback = keras_attention.layers.RedrawFeatures(every_n_steps=1000)
    """

    def __init__(self, every_n_steps):
        super().__init__()
        self.every_n_steps = validate_positive_int("RedrawFeatures", "every_n_steps", every_n_steps)
        self._steps = 0

    def _performer_layers(self):
        return [
            layer for layer in utils.sublayers(self.model) if isinstance(layer, PerformerAttention)
        ]

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps % self.every_n_steps:
            return
        # On JAX, reading `self.model` syncs fit's state into the variables,
        # so the next step reads the redrawn projection back.
        for layer in self._performer_layers():
            layer.redraw_features()

    def get_config(self):
        return {"every_n_steps": self.every_n_steps}
