from keras_attention.api_export import keras_attention_export
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.machinery.utils import clone_initializer
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.ops import linformer


@keras_attention_export("layers")
class LinformerAttention(BaseMultiHeadAttention):
    """Multi-head attention over keys and values projected along time.

    Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity"
    (https://arxiv.org/abs/2006.04768). Learned `(max_length,
    projected_length)` matrices `E` and `F` mix the `Tv <= max_length` key
    and value positions into `projected_length` summaries, and exact softmax
    attention runs over those: `O(Tq * projected_length)`.

    Trainable weights: `key_projection` (`E`) and `value_projection` (`F`),
    shared by all heads, then those of `MultiHeadAttention` with the same
    arguments in the same order (Keras lists a layer's own weights before its
    sublayers'), so `trainable_weights[2:]` move to and from a
    `MultiHeadAttention` with `set_weights`.

    Args:
        num_heads, key_dim: as `MultiHeadAttention`.
        projected_length: number `k` of projected key/value positions.
        max_length: the longest key sequence the layer accepts; at least
            `projected_length`.
        **kwargs: the other `BaseMultiHeadAttention` arguments (the kernel
            initializer/regularizer/constraint also apply to `E` and `F`).

    Call arguments: as `BaseMultiHeadAttention` (no decoding `cache`), without
    `use_causal_mask` or `attention_mask` (projection mixes positions, so
    neither has a meaning). Masked keys/values are zeroed before the
    projection and contribute nothing.

    Returns:
        `(B, Tq, dim)`; with `return_attention_scores=True` also the implied
        weights over the original positions, `P F^T` of shape
        `(B, H, Tq, Tv)`: the output is exactly these times the values, but
        they are not a probability distribution.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.LinformerAttention(
    ...     num_heads=2, key_dim=4, projected_length=8, max_length=64)
    >>> tuple(layer(np.ones((1, 30, 8), "float32")).shape)
    (1, 30, 8)
    """

    def __init__(self, num_heads, key_dim, projected_length, max_length, **kwargs):
        name = "LinformerAttention"
        validate_positive_int(name, "projected_length", projected_length)
        validate_positive_int(name, "max_length", max_length)
        if projected_length > max_length:
            # More summaries than positions is no longer a projection: it
            # costs more than exact attention and approximates nothing.
            raise ValueError(
                f"{name}: `projected_length` must not exceed `max_length` "
                f"({max_length}); use MultiHeadAttention for exact attention. "
                f"Received: projected_length={projected_length}"
            )
        super().__init__(num_heads, key_dim, **kwargs)
        self.projected_length = projected_length
        self.max_length = max_length

    def build(self, query_shape, value_shape=None, key_shape=None):
        self._check_length(query_shape if value_shape is None else value_shape)
        super().build(query_shape, value_shape, key_shape)
        shape = (self.max_length, self.projected_length)
        for name in ("key_projection", "value_projection"):
            setattr(
                self,
                name,
                self.add_weight(
                    name=name,
                    shape=shape,
                    initializer=clone_initializer(self.kernel_initializer),
                    regularizer=self.kernel_regularizer,
                    constraint=self.kernel_constraint,
                ),
            )

    def _check_length(self, keys_shape):
        length = keys_shape[1] if keys_shape is not None and len(keys_shape) == 3 else None
        if length is not None and length > self.max_length:
            raise ValueError(
                self._error(
                    f"the key sequence is longer than `max_length` "
                    f"({self.max_length}). Received: key length {length}"
                )
            )

    def _check_call_options(self, query, value, attention_mask, use_causal_mask):
        if use_causal_mask or attention_mask is not None:
            raise ValueError(
                self._error(
                    "Linformer projects keys along time, so it cannot apply "
                    "`use_causal_mask` or an `attention_mask`; use key/value "
                    f"masks. Received: use_causal_mask={use_causal_mask}, "
                    f"attention_mask={'a tensor' if attention_mask is not None else None}"
                )
            )
        keys = query if value is None else value
        if hasattr(keys, "shape"):
            self._check_length(tuple(keys.shape))

    def _attend(self, query, key, value, mask, *, dropout, return_weights):
        # Causal and explicit masks are rejected by `_check_call_options`.
        return linformer.linformer_attention(
            query,
            key,
            value,
            self.key_projection,
            self.value_projection,
            key_mask=mask.key_mask,
            scale=self._scale,
            dropout=dropout,
            return_weights=return_weights,
        )

    def get_config(self):
        config = super().get_config()
        config.update({"projected_length": self.projected_length, "max_length": self.max_length})
        return config
