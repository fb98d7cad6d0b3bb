import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import SinusoidalPositionEncoding
from tests.testing import assert_config_covers_init
from tests.testing import run_layer_contract_test


def numpy_encoding(positions, features, max_wavelength=10000.0):
    """PE(pos, 2i) = sin(pos / w^(2i/d)), PE(pos, 2i+1) = cos(same angle)."""
    encoding = np.zeros((len(positions), features))
    for row, pos in enumerate(positions):
        for j in range(features):
            angle = pos / max_wavelength ** (2 * (j // 2) / features)
            encoding[row, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return encoding


@pytest.mark.parametrize("features, max_wavelength", [(8, 10000), (7, 100.0)])
def test_matches_numpy_formula(features, max_wavelength):
    layer = SinusoidalPositionEncoding(max_wavelength=max_wavelength)
    inputs = np.zeros((2, 11, features), "float32")
    output = ops.convert_to_numpy(layer(inputs))
    expected = numpy_encoding(range(11), features, max_wavelength)
    assert output.shape == inputs.shape
    np.testing.assert_allclose(output[0], expected, atol=1e-5)
    np.testing.assert_allclose(output[1], expected, atol=1e-5)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_start_index_gives_the_matching_rows_of_the_full_encoding(as_tensor):
    layer = SinusoidalPositionEncoding()
    full = ops.convert_to_numpy(layer(np.zeros((1, 20, 6), "float32")))
    start = ops.convert_to_tensor(13, "int32") if as_tensor else 13
    step = ops.convert_to_numpy(layer(np.zeros((1, 3, 6), "float32"), start_index=start))
    np.testing.assert_allclose(step, full[:, 13:16], atol=1e-6)


def test_mixed_precision_stays_accurate_at_large_positions():
    layer = SinusoidalPositionEncoding(dtype="mixed_float16")
    output = layer(np.zeros((1, 4, 16), "float16"), start_index=5000)
    assert keras.backend.standardize_dtype(output.dtype) == "float16"
    expected = numpy_encoding(range(5000, 5004), 16)
    np.testing.assert_allclose(
        ops.convert_to_numpy(ops.cast(output, "float32"))[0], expected, atol=2e-3
    )


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: SinusoidalPositionEncoding(**kwargs),
        tmp_path,
        cross_attention=False,
    )
    layer = SinusoidalPositionEncoding(max_wavelength=500)
    assert_config_covers_init(layer)
    assert SinusoidalPositionEncoding.from_config(layer.get_config()).max_wavelength == 500


def test_keras_mask_survives_adding_the_encoding_with_an_add_layer():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True)(tokens)
    summed = keras.layers.Add()([embedded, SinusoidalPositionEncoding()(embedded)])
    # Masked average pooling sees the mask only if it propagated.
    pooled = keras.layers.GlobalAveragePooling1D()(summed)
    model = keras.Model(tokens, [summed, pooled])
    summed_value, pooled_value = model(np.array([[3, 5, 0, 0]]))
    summed_value = ops.convert_to_numpy(summed_value)
    np.testing.assert_allclose(
        ops.convert_to_numpy(pooled_value)[0], summed_value[0, :2].mean(0), atol=1e-6
    )


@pytest.mark.parametrize("max_wavelength", [0, -5, "10000", True])
def test_rejects_bad_max_wavelength(max_wavelength):
    with pytest.raises(ValueError, match="max_wavelength"):
        SinusoidalPositionEncoding(max_wavelength=max_wavelength)


def test_rejects_rank_one_inputs():
    with pytest.raises(ValueError, match=r"`inputs` must have rank >= 2.*\(5,\)"):
        SinusoidalPositionEncoding()(np.zeros((5,), "float32"))


@pytest.mark.parametrize("start_index", [-1, 1.5])
def test_rejects_bad_start_index(start_index):
    with pytest.raises((ValueError, TypeError), match="start_index"):
        SinusoidalPositionEncoding()(np.zeros((1, 3, 4), "float32"), start_index=start_index)
