import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import CBAM
from tests.testing import assert_config_covers_init
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_same_conv(image, kernel, bias):
    """(B, H, W, Cin) * (k, k, Cin, 1) with zero 'same' padding, k odd."""
    k = kernel.shape[0]
    pad = k // 2
    padded = np.pad(image, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    batch, height, width, _ = image.shape
    out = np.zeros((batch, height, width))
    for i in range(height):
        for j in range(width):
            window = padded[:, i : i + k, j : j + k, :]
            out[:, i, j] = np.einsum("bhwc,hwc->b", window, kernel[..., 0])
    return out + bias[0]


def numpy_cbam(inputs, w1, b1, w2, b2, conv_kernel, conv_bias):
    def mlp(x):
        return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2

    channel = sigmoid(mlp(inputs.mean(axis=(1, 2))) + mlp(inputs.max(axis=(1, 2))))
    refined = inputs * channel[:, None, None, :]
    pooled = np.stack([refined.mean(-1), refined.max(-1)], axis=-1)
    spatial = sigmoid(numpy_same_conv(pooled, conv_kernel, conv_bias))
    return refined * spatial[..., None], channel, spatial


@pytest.mark.parametrize("kernel_size", [3, 5])
def test_matches_numpy_computation_from_the_layer_weights(kernel_size):
    layer = CBAM(ratio=2, kernel_size=kernel_size, bias_initializer="random_normal")
    inputs = random_inputs((2, 6, 5, 8))
    outputs, (channel, spatial) = layer(inputs, return_attention_scores=True)
    weights = [ops.convert_to_numpy(w) for w in layer.weights]
    assert [w.shape for w in weights] == [
        (8, 4),
        (4,),
        (4, 8),
        (8,),
        (kernel_size, kernel_size, 2, 1),
        (1,),
    ]
    expected_outputs, expected_channel, expected_spatial = numpy_cbam(inputs, *weights)
    np.testing.assert_allclose(ops.convert_to_numpy(channel), expected_channel, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(spatial), expected_spatial, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected_outputs, atol=1e-5)


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: CBAM(ratio=4, kernel_size=3, **kwargs),
        tmp_path,
        query_shape=(2, 4, 3, 8),
        cross_attention=False,
    )
    layer = CBAM(ratio=2, kernel_size=5, kernel_initializer="ones", bias_initializer="ones")
    assert_config_covers_init(layer)
    clone = CBAM.from_config(layer.get_config())
    assert clone.kernel_size == 5 and clone.ratio == 2
    clone.build((None, 4, 4, 6))
    np.testing.assert_array_equal(ops.convert_to_numpy(clone.weights[4]), np.ones((5, 5, 2, 1)))


def test_functional_scores_have_the_symbolic_shape():
    images = keras.Input((None, None, 8))
    outputs, (channel, spatial) = CBAM(ratio=2, kernel_size=3)(images, return_attention_scores=True)
    assert tuple(channel.shape) == (None, 8)
    assert tuple(spatial.shape) == (None, None, None)
    model = keras.Model(images, [outputs, channel, spatial])
    eager = model(random_inputs((3, 5, 4, 8)))
    assert [tuple(x.shape) for x in eager] == [(3, 5, 4, 8), (3, 8), (3, 5, 4)]


@pytest.mark.parametrize("shape", [(2, 4, 8), (2, 3, 4, 4, 8)])
def test_rejects_inputs_that_are_not_rank_4(shape):
    with pytest.raises(ValueError, match=r"CBAM.*rank 4"):
        CBAM(ratio=2, kernel_size=3)(np.zeros(shape, "float32"))


def test_rejects_fewer_channels_than_ratio():
    with pytest.raises(ValueError, match=r"ratio=8.*\(1, 4, 4, 4\)"):
        CBAM()(np.zeros((1, 4, 4, 4), "float32"))


@pytest.mark.parametrize("kernel_size", [0, -3, 4, 2.5])
def test_rejects_bad_kernel_size(kernel_size):
    with pytest.raises(ValueError, match=f"kernel_size={kernel_size}"):
        CBAM(kernel_size=kernel_size)


@pytest.mark.parametrize("ratio", [0, -1, "8"])
def test_rejects_bad_ratio(ratio):
    with pytest.raises(ValueError, match="ratio"):
        CBAM(ratio=ratio)
