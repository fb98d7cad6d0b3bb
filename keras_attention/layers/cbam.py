import keras
from keras import ops

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import utils
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.layers.squeeze_excitation import ChannelAttentionBase
from keras_attention.layers.squeeze_excitation import check_feature_map_shape
from keras_attention.ops import masking


@keras_attention_export("layers")
class CBAM(ChannelAttentionBase):
    """Convolutional Block Attention Module: channel, then spatial attention.

    From [Woo et al., 2018](https://arxiv.org/abs/1807.06521).

    - Channel attention: global average and global max pooling give two
      `(B, C)` descriptors; one shared MLP (`C -> C // ratio`, ReLU, `-> C`)
      scores both, and `sigmoid(mlp(avg) + mlp(max))` is the weight of each
      channel. The input is scaled by it.
    - Spatial attention: the mean and the max over channels of that result
      give a `(B, H, W, 2)` map; a `kernel_size x kernel_size` convolution
      ("same" padding) and a sigmoid turn it into a weight per pixel, which
      scales the channel-refined map.

    Args:
        ratio: reduction ratio of the channel MLP; `C // ratio` must be at
            least 1.
        kernel_size: odd size of the spatial convolution (7 in the paper).
        kernel_initializer: initializer of the MLP and convolution kernels.
        bias_initializer: initializer of their biases.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: channels-last feature map `(B, H, W, C)`.
        return_attention_scores: also return the attention weights.

    Returns:
        `(B, H, W, C)`, and with `return_attention_scores=True` also the pair
        `(channel_weights (B, C), spatial_weights (B, H, W))`, all in `(0, 1)`.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> images = np.random.rand(2, 8, 8, 16).astype("float32")
    >>> layer = keras_attention.CBAM(ratio=8, kernel_size=7)
    >>> outputs, (channel, spatial) = layer(images, return_attention_scores=True)
    >>> tuple(outputs.shape), tuple(channel.shape), tuple(spatial.shape)
    ((2, 8, 8, 16), (2, 16), (2, 8, 8))
    """

    def __init__(
        self,
        ratio=8,
        kernel_size=7,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(ratio, kernel_initializer, bias_initializer, **kwargs)
        validate_positive_int("CBAM", "kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(
                "CBAM: `kernel_size` must be odd so that the 'same' convolution "
                f"is centred on each pixel. Received: kernel_size={kernel_size}"
            )
        self.kernel_size = kernel_size

    def build(self, inputs_shape):
        channels = check_feature_map_shape(self, inputs_shape, self.ratio)
        # No sigmoid here: it follows the sum of both descriptors' scores.
        self.channel_squeeze_dense, self.channel_excite_dense = self._build_channel_mlp(
            channels, prefix="channel_"
        )
        self.spatial_conv = keras.layers.Conv2D(
            1,
            self.kernel_size,
            padding="same",
            name="spatial_conv",
            **utils.sublayer_arguments(self),
        )
        self.spatial_conv.build((None, inputs_shape[1], inputs_shape[2], 2))
        self.built = True

    def _channel_mlp(self, descriptor):
        return self.channel_excite_dense(self.channel_squeeze_dense(descriptor))

    def call(self, inputs, return_attention_scores=False):
        check_feature_map_shape(self, inputs.shape, self.ratio)
        inputs = utils.cast_to_compute_dtype(self, inputs)  # integer maps
        # Pooled in float32: large half-precision maps would lose digits.
        wide = ops.cast(inputs, "float32")
        average = ops.cast(ops.mean(wide, axis=(1, 2)), inputs.dtype)  # (B, C)
        maximum = masking.row_max(inputs, axis=(1, 2))  # (B, C)
        channel_weights = ops.sigmoid(
            self._channel_mlp(average) + self._channel_mlp(maximum)
        )  # (B, C)
        refined = inputs * channel_weights[:, None, None, :]

        wide = ops.cast(refined, "float32")
        pooled = ops.stack(
            [ops.mean(wide, axis=-1), masking.row_max(wide, axis=-1)], axis=-1
        )  # (B, H, W, 2)
        spatial_weights = ops.sigmoid(
            self.spatial_conv(ops.cast(pooled, inputs.dtype))[..., 0]
        )  # (B, H, W)
        outputs = refined * spatial_weights[..., None]
        if return_attention_scores:
            return outputs, (channel_weights, spatial_weights)
        return outputs

    def compute_output_spec(self, inputs, return_attention_scores=False):
        outputs, channel_weights = self._output_specs(inputs)
        if not return_attention_scores:
            return outputs
        spatial_weights = keras.KerasTensor(tuple(inputs.shape[:3]), dtype=self.compute_dtype)
        return outputs, (channel_weights, spatial_weights)

    def get_config(self):
        config = super().get_config()
        config["kernel_size"] = self.kernel_size
        return config
