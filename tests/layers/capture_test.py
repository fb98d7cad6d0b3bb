import keras
import numpy as np
import pytest
from keras import ops

import keras_attention
from keras_attention.layers import capture_attention


def test_stacked_blocks_keep_every_layers_scores():
    model = keras.Sequential(
        [
            keras.Input((5, 8)),
            keras_attention.TransformerEncoderBlock(2, 4, 16, name="b1"),
            keras_attention.TransformerEncoderBlock(2, 4, 16, name="b2"),
        ]
    )
    x = np.random.default_rng(0).standard_normal((1, 5, 8)).astype("float32")
    with capture_attention(model) as captured:
        model(x)
    assert sorted(captured.scores) == [
        "sequential/b1/self_attention",
        "sequential/b2/self_attention",
    ]
    # Each entry is that block's own weights, as the block itself reports them.
    _, expected = model.get_layer("b1")(x, return_attention_scores=True)
    np.testing.assert_allclose(
        captured.scores["sequential/b1/self_attention"][0],
        ops.convert_to_numpy(expected),
        atol=1e-6,
    )
    with pytest.raises(KeyError, match="2 attention layers are named 'self_attention'"):
        captured["self_attention"]


def test_lookup_by_unique_name_and_recording_stops_on_exit():
    layer = keras_attention.LuongAttention(name="att")
    x = np.ones((1, 3, 2), "float32")
    with capture_attention(layer) as captured:
        layer(x)
        layer(x)
    layer(x)  # outside the context: not recorded
    assert len(captured["att"]) == 2
    assert captured["att"][0].shape == (1, 3, 3)


def test_model_without_attention_is_rejected():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="has no keras_attention attention layers"):
        capture_attention(model)
