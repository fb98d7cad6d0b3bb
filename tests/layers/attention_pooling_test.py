import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import AttentionPooling
from keras_attention.layers import LowRankAttention
from tests import reference
from tests.testing import assert_config_covers_init
from tests.testing import random_inputs


def test_matches_numpy_with_a_padding_mask():
    rng = np.random.default_rng(0)
    inputs = random_inputs((3, 6, 5), seed=1)
    mask = reference.random_mask(rng, 3, 6)
    layer = AttentionPooling(score="general")
    pooled, weights = layer(inputs, mask=mask, return_attention_scores=True)
    query = ops.convert_to_numpy(layer.query)[0, 0]
    kernel = ops.convert_to_numpy(layer.attention.kernel)
    scores = np.einsum("d,de,bte->bt", query, kernel, inputs)
    expected_weights = reference.softmax_with_mask(scores, mask)
    expected = np.einsum("bt,btd->bd", expected_weights, inputs)
    assert tuple(pooled.shape) == (3, 5)
    np.testing.assert_allclose(ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(pooled), expected, atol=1e-5)


def test_fully_masked_sequence_pools_to_zeros():
    inputs = random_inputs((2, 4, 3), seed=0)
    mask = np.array([[False] * 4, [True] * 4])
    pooled = ops.convert_to_numpy(AttentionPooling()(inputs, mask=mask))
    np.testing.assert_array_equal(pooled[0], 0.0)
    assert np.all(np.isfinite(pooled))


def _classifier(score="additive"):
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(30, 16, mask_zero=True),
            keras.layers.LSTM(16, return_sequences=True),
            AttentionPooling(score=score, name="pool"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )


def test_sequential_classifier_learns_to_attend_to_the_keyword(tmp_path):
    # Label = whether token 7 appears; sequences are padded with zeros.
    rng = np.random.default_rng(0)
    tokens = rng.integers(8, 30, size=(512, 10)).astype("int32")
    lengths = rng.integers(4, 11, size=512)
    labels = rng.integers(0, 2, size=512)
    for i, (length, label) in enumerate(zip(lengths, labels, strict=True)):
        tokens[i, length:] = 0
        if label:
            tokens[i, rng.integers(0, length)] = 7
    model = _classifier()
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=True,
    )
    model.fit(tokens, labels, epochs=12, batch_size=64, verbose=0)
    accuracy = model.evaluate(tokens, labels, verbose=0)[1]
    assert accuracy > 0.9
    # Padding gets no weight in the trained model.
    pool = model.get_layer("pool")
    states = model.layers[1](model.layers[0](tokens[:4]))
    _, weights = pool(states, mask=tokens[:4] != 0, return_attention_scores=True)
    assert np.all(ops.convert_to_numpy(weights)[tokens[:4] == 0] == 0)
    # Save and reload: identical predictions.
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(tokens[:8])), ops.convert_to_numpy(model(tokens[:8]))
    )


def test_config_round_trip_with_a_layer_as_score(tmp_path):
    layer = AttentionPooling(score=LowRankAttention(rank=2), dropout=0.0)
    assert_config_covers_init(layer)
    clone = AttentionPooling.from_config(layer.get_config())
    assert isinstance(clone.attention, LowRankAttention)
    assert clone.attention.rank == 2
    model = keras.Sequential([keras.Input((5, 4)), layer])
    path = str(tmp_path / "pool.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    x = random_inputs((2, 5, 4))
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(x)), ops.convert_to_numpy(model(x)))


def test_symbolic_shapes():
    inputs = keras.Input((7, 3))
    pooled, weights = AttentionPooling(score="dot")(inputs, return_attention_scores=True)
    assert tuple(pooled.shape) == (None, 3)
    assert tuple(weights.shape) == (None, 7)


def test_bad_score_and_rank():
    with pytest.raises(ValueError, match=r"AttentionPooling: `score` must be one of .*score='max'"):
        AttentionPooling(score="max")
    with pytest.raises(ValueError, match=r"`units` only applies.*units=3 with score='dot'"):
        AttentionPooling(score="dot", units=3)
    with pytest.raises(
        ValueError, match=r"AttentionPooling \(layer 'p'\): `inputs` must have rank 3.*\(2, 5\)"
    ):
        AttentionPooling(name="p")(np.ones((2, 5), "float32"))
