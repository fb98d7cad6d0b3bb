import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import PositionEmbedding
from tests.testing import assert_config_covers_init
from tests.testing import run_layer_contract_test


def test_returns_the_table_rows_for_each_position():
    layer = PositionEmbedding(sequence_length=10)
    output = ops.convert_to_numpy(layer(np.zeros((3, 4, 5), "float32")))
    table = ops.convert_to_numpy(layer.embeddings)
    assert table.shape == (10, 5)
    assert output.shape == (3, 4, 5)
    for batch in range(3):
        np.testing.assert_array_equal(output[batch], table[:4])


@pytest.mark.parametrize("as_tensor", [False, True])
def test_start_index_gives_the_matching_rows_of_the_full_embedding(as_tensor):
    layer = PositionEmbedding(sequence_length=12)
    full = ops.convert_to_numpy(layer(np.zeros((2, 12, 4), "float32")))
    start = ops.convert_to_tensor(7, "int32") if as_tensor else 7
    step = ops.convert_to_numpy(layer(np.zeros((2, 2, 4), "float32"), start_index=start))
    np.testing.assert_array_equal(step, full[:, 7:9])


def test_initializer_is_used_and_serialized():
    layer = PositionEmbedding(sequence_length=3, initializer="ones")
    layer.build((None, 3, 2))
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.embeddings), np.ones((3, 2)))
    clone = PositionEmbedding.from_config(layer.get_config())
    clone.build((None, 3, 2))
    np.testing.assert_array_equal(ops.convert_to_numpy(clone.embeddings), np.ones((3, 2)))


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: PositionEmbedding(sequence_length=8, **kwargs),
        tmp_path,
        cross_attention=False,
    )
    assert_config_covers_init(PositionEmbedding(sequence_length=8))


def test_embeddings_train():
    model = keras.Sequential([keras.Input((4, 3)), PositionEmbedding(sequence_length=6)])
    before = ops.convert_to_numpy(model.layers[0].embeddings).copy()
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    model.fit(np.zeros((2, 4, 3)), np.ones((2, 4, 3)), epochs=1, verbose=0)
    after = ops.convert_to_numpy(model.layers[0].embeddings)
    # Only the rows the sequences cover receive gradients.
    assert not np.allclose(before[:4], after[:4])
    np.testing.assert_array_equal(before[4:], after[4:])


@pytest.mark.parametrize("sequence_length", [0, -3, 2.5, None])
def test_rejects_bad_sequence_length(sequence_length):
    with pytest.raises(ValueError, match="sequence_length"):
        PositionEmbedding(sequence_length=sequence_length)


def test_rejects_sequences_longer_than_sequence_length():
    layer = PositionEmbedding(sequence_length=4)
    with pytest.raises(ValueError, match=r"sequence_length=4.*\(1, 5, 3\)"):
        layer(np.zeros((1, 5, 3), "float32"))
    with pytest.raises(ValueError, match=r"sequence_length=4.*start_index=2"):
        layer(np.zeros((1, 3, 3), "float32"), start_index=2)
    with pytest.raises(ValueError, match="sequence_length=4"):
        keras.Sequential([keras.Input((6, 3)), PositionEmbedding(sequence_length=4)])


def test_rejects_negative_start_index():
    with pytest.raises(ValueError, match="start_index=-1"):
        PositionEmbedding(sequence_length=4)(np.zeros((1, 2, 3), "float32"), start_index=-1)
