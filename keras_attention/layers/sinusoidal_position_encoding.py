import numbers

import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export


def check_start_index(layer, start_index):
    """Rejects negative Python start indices; tensors pass through unchecked."""
    if isinstance(start_index, bool) or (
        isinstance(start_index, numbers.Integral) and start_index < 0
    ):
        raise ValueError(
            f"{validation.owner_name(layer)}: `start_index` must "
            f"be a non-negative integer. Received: start_index={start_index!r}"
        )
    if not isinstance(start_index, numbers.Integral) and "int" not in str(
        getattr(start_index, "dtype", "")
    ):
        raise TypeError(
            f"{validation.owner_name(layer)}: `start_index` must "
            f"be an integer or an integer scalar tensor. Received: "
            f"start_index={start_index!r}"
        )


def check_sequence_rank(layer, shape):
    if len(shape) < 2:
        raise ValueError(
            f"{validation.owner_name(layer)}: `inputs` must have "
            f"rank >= 2 (..., sequence, features). Received: inputs with shape "
            f"{tuple(shape)}"
        )


@keras_attention_export("layers")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The fixed sine/cosine position encoding of the Transformer.

    From [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762): for
    position `pos` and feature `2i` or `2i + 1`,

        PE(pos, 2i)     = sin(pos / max_wavelength ** (2i / d))
        PE(pos, 2i + 1) = cos(pos / max_wavelength ** (2i / d))

    The layer returns the encoding, not the sum: add it to the embeddings
    with `keras.layers.Add()`, which keeps the Keras mask of an
    `Embedding(mask_zero=True)` (the `+` operator drops it).
    It has no weights; it is computed in float32 and cast to the layer's
    compute dtype, so it stays accurate at large positions in float16 models.

    Args:
        max_wavelength: the longest wavelength, `10000` in the paper.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(..., T, d)`, typically the embedded tokens `(B, T, d)`.
            Only its shape is used.
        start_index: position of the first step, an integer or an integer
            scalar tensor (e.g. the loop index while decoding one token at a
            time).

    Returns:
        The encoding of positions `start_index .. start_index + T - 1`,
        broadcast to the shape of `inputs`.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 16, mask_zero=True)(tokens)
    >>> x = keras.layers.Add()([x, keras_attention.SinusoidalPositionEncoding()(x)])
    >>> model = keras.Model(tokens, x)
    >>> tuple(model(np.array([[3, 1, 4]])).shape)
    (1, 3, 16)
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        if (
            isinstance(max_wavelength, bool)
            or not isinstance(max_wavelength, (int, float))
            or not max_wavelength > 0
        ):
            raise ValueError(
                f"SinusoidalPositionEncoding: `max_wavelength` must be a "
                f"positive number. Received: max_wavelength={max_wavelength!r}"
            )
        self.max_wavelength = max_wavelength
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0):
        check_sequence_rank(self, inputs.shape)
        check_start_index(self, start_index)
        shape = ops.shape(inputs)
        length, features = shape[-2], shape[-1]
        positions = ops.cast(ops.arange(length), "float32") + ops.cast(start_index, "float32")
        feature_index = ops.arange(features)
        # Features 2i and 2i + 1 share the frequency max_wavelength ** (-2i / d).
        exponent = ops.cast(2 * (feature_index // 2), "float32") / ops.cast(features, "float32")
        frequencies = ops.power(float(self.max_wavelength), -exponent)
        angles = positions[:, None] * frequencies[None, :]  # (T, d)
        is_cosine = ops.equal(feature_index % 2, 1)
        encoding = ops.where(is_cosine[None, :], ops.cos(angles), ops.sin(angles))
        encoding = ops.cast(encoding, self.compute_dtype)
        return ops.broadcast_to(encoding, shape)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, start_index=0):
        check_sequence_rank(self, inputs.shape)
        check_start_index(self, start_index)
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength})
        return config
