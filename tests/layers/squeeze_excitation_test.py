import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import SqueezeExcitation
from tests.testing import assert_config_covers_init
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_squeeze_excitation(inputs, w1, b1, w2, b2):
    descriptor = inputs.mean(axis=(1, 2))
    hidden = np.maximum(descriptor @ w1 + b1, 0.0)
    weights = sigmoid(hidden @ w2 + b2)
    return inputs * weights[:, None, None, :], weights


def test_matches_numpy_computation_from_the_layer_weights():
    layer = SqueezeExcitation(ratio=4, bias_initializer="random_normal")
    inputs = random_inputs((2, 5, 3, 12))
    outputs, weights = layer(inputs, return_attention_scores=True)
    w1, b1, w2, b2 = [ops.convert_to_numpy(w) for w in layer.weights]
    assert w1.shape == (12, 3) and w2.shape == (3, 12)
    expected_outputs, expected_weights = numpy_squeeze_excitation(inputs, w1, b1, w2, b2)
    np.testing.assert_allclose(ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected_outputs, atol=1e-5)


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: SqueezeExcitation(ratio=4, **kwargs),
        tmp_path,
        query_shape=(2, 4, 3, 8),
        cross_attention=False,
    )
    layer = SqueezeExcitation(ratio=2, kernel_initializer="ones", bias_initializer="ones")
    assert_config_covers_init(layer)
    clone = SqueezeExcitation.from_config(layer.get_config())
    clone.build((None, 4, 4, 6))
    np.testing.assert_array_equal(ops.convert_to_numpy(clone.weights[0]), np.ones((6, 3)))
    np.testing.assert_array_equal(ops.convert_to_numpy(clone.weights[1]), np.ones(3))


def test_functional_scores_have_the_symbolic_shape():
    images = keras.Input((None, None, 8))
    outputs, weights = SqueezeExcitation(ratio=2)(images, return_attention_scores=True)
    assert tuple(outputs.shape) == (None, None, None, 8)
    assert tuple(weights.shape) == (None, 8)
    model = keras.Model(images, [outputs, weights])
    eager_outputs, eager_weights = model(random_inputs((3, 5, 4, 8)))
    assert tuple(eager_outputs.shape) == (3, 5, 4, 8)
    assert tuple(eager_weights.shape) == (3, 8)


@pytest.mark.parametrize("shape", [(2, 4, 8), (2, 3, 4, 4, 8)])
def test_rejects_inputs_that_are_not_rank_4(shape):
    with pytest.raises(
        ValueError, match=r"rank 4.*" + str(shape).replace("(", r"\(").replace(")", r"\)")
    ):
        SqueezeExcitation(ratio=2)(np.zeros(shape, "float32"))


def test_rejects_fewer_channels_than_ratio():
    with pytest.raises(ValueError, match=r"ratio=16.*\(1, 4, 4, 8\)"):
        SqueezeExcitation(ratio=16)(np.zeros((1, 4, 4, 8), "float32"))


@pytest.mark.parametrize("ratio", [0, -2, 1.5, None])
def test_rejects_bad_ratio(ratio):
    with pytest.raises(ValueError, match="ratio"):
        SqueezeExcitation(ratio=ratio)
