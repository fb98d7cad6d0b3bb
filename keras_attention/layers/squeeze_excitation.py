import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import utils
from keras_attention.layers.machinery.utils import validate_positive_int


def check_feature_map_shape(layer, shape, ratio):
    """Raises unless `shape` is `(B, H, W, C)` with `C // ratio >= 1`."""
    if len(shape) != 4:
        raise ValueError(
            f"{validation.owner_name(layer)}: `inputs` must be a channels-last "
            f"feature map of rank 4 (batch, height, width, channels). "
            f"Received: inputs with shape {tuple(shape)}"
        )
    channels = shape[-1]
    if channels is None:
        raise ValueError(
            f"{validation.owner_name(layer)}: the channel dimension of `inputs` "
            f"must be known. Received: inputs with shape {tuple(shape)}"
        )
    if channels // ratio < 1:
        raise ValueError(
            f"{validation.owner_name(layer)}: `ratio` must not exceed the number "
            f"of channels, or the reduced layer would have "
            f"{channels} // {ratio} = 0 units. Received: ratio={ratio}, "
            f"inputs with shape {tuple(shape)}"
        )
    return channels


class ChannelAttentionBase(keras.layers.Layer):
    """What SE and CBAM share: `ratio`, the initializers and the channel MLP
    `C -> C // ratio` (ReLU) `-> C` over a `(B, H, W, C)` map."""

    def __init__(
        self,
        ratio,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.ratio = validate_positive_int(type(self).__name__, "ratio", ratio)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _build_channel_mlp(self, channels, prefix="", excite_activation=None):
        """The MLP's two `Dense` layers, built, named `{prefix}squeeze_dense`
        and `{prefix}excite_dense` (store them under those names)."""
        squeeze = keras.layers.Dense(
            channels // self.ratio,
            activation="relu",
            name=f"{prefix}squeeze_dense",
            **utils.sublayer_arguments(self),
        )
        squeeze.build((None, channels))
        excite = keras.layers.Dense(
            channels,
            activation=excite_activation,
            name=f"{prefix}excite_dense",
            **utils.sublayer_arguments(self),
        )
        excite.build((None, channels // self.ratio))
        return squeeze, excite

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def _output_specs(self, inputs):
        """The outputs' and the channel weights' `KerasTensor`s."""
        check_feature_map_shape(self, inputs.shape, self.ratio)
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        channel_weights = keras.KerasTensor(
            (inputs.shape[0], inputs.shape[-1]), dtype=self.compute_dtype
        )
        return outputs, channel_weights

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "ratio": self.ratio,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


@keras_attention_export("layers")
class SqueezeExcitation(ChannelAttentionBase):
    """Channel attention of Squeeze-and-Excitation networks.

    From [Hu et al., 2018](https://arxiv.org/abs/1709.01507). Squeeze: global
    average pooling turns each channel into one number. Excitation: a small
    MLP (`C -> C // ratio`, ReLU, `-> C`, sigmoid) turns these into a weight
    per channel. Scale: each channel of the input is multiplied by its weight.

    Args:
        ratio: reduction ratio of the MLP's hidden layer; `C // ratio` must be
            at least 1.
        kernel_initializer: initializer of both dense kernels.
        bias_initializer: initializer of both dense biases.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: channels-last feature map `(B, H, W, C)`.
        return_attention_scores: also return the channel weights.

    Returns:
        `(B, H, W, C)`, and with `return_attention_scores=True` also the
        channel weights `(B, C)`, each in `(0, 1)`.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> images = np.random.rand(2, 8, 8, 32).astype("float32")
    >>> layer = keras_attention.SqueezeExcitation(ratio=16)
    >>> outputs, channel_weights = layer(images, return_attention_scores=True)
    >>> tuple(outputs.shape), tuple(channel_weights.shape)
    ((2, 8, 8, 32), (2, 32))
    """

    def __init__(
        self,
        ratio=16,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(ratio, kernel_initializer, bias_initializer, **kwargs)

    def build(self, inputs_shape):
        channels = check_feature_map_shape(self, inputs_shape, self.ratio)
        self.squeeze_dense, self.excite_dense = self._build_channel_mlp(
            channels, excite_activation="sigmoid"
        )
        self.built = True

    def call(self, inputs, return_attention_scores=False):
        check_feature_map_shape(self, inputs.shape, self.ratio)
        inputs = utils.cast_to_compute_dtype(self, inputs)  # integer maps
        # Averaged in float32: large half-precision maps would lose digits.
        descriptor = ops.cast(
            ops.mean(ops.cast(inputs, "float32"), axis=(1, 2)), inputs.dtype
        )  # (B, C)
        weights = self.excite_dense(self.squeeze_dense(descriptor))  # (B, C)
        outputs = inputs * weights[:, None, None, :]
        if return_attention_scores:
            return outputs, weights
        return outputs

    def compute_output_spec(self, inputs, return_attention_scores=False):
        outputs, weights = self._output_specs(inputs)
        return (outputs, weights) if return_attention_scores else outputs
