import keras
import numpy as np
import pytest
from split_heads_attention import SplitHeadsAttention
from split_heads_attention import reference_weights

import keras_attention
from keras_attention.widgets import AttentionExplorer
from keras_attention.widgets import figures


def make_model(length=5, features=8):
    inputs = keras.Input((length, features))
    two = SplitHeadsAttention(2, name="two_heads")(inputs)
    four = SplitHeadsAttention(4, name="four_heads")(inputs)
    single = keras_attention.LuongAttention(name="luong")(inputs)
    return keras.Model(inputs, keras.layers.Concatenate()([two, four, single]))


def test_layer_and_head_choices_switch_the_detail_data(fake_comm):
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    model = make_model()
    explorer = AttentionExplorer(model, x, query_tokens=list("abcde"), example=1)
    assert list(explorer.layer_choice.options) == ["two_heads", "four_heads", "luong"]
    expected_two = reference_weights(x, 2)[1]
    np.testing.assert_allclose(explorer.detail_matrix, expected_two.mean(axis=0), rtol=1e-5)
    explorer.head_choice.value = 1
    np.testing.assert_allclose(explorer.detail_matrix, expected_two[1], rtol=1e-5)
    explorer.layer_choice.value = "four_heads"
    assert list(explorer.head_choice.options) == ["mean of heads", 0, 1, 2, 3]
    explorer.head_choice.value = 3
    np.testing.assert_allclose(explorer.detail_matrix, reference_weights(x, 4)[1, 3], rtol=1e-5)
    explorer.layer_choice.value = "luong"
    _, luong = model.get_layer("luong")(x, return_attention_scores=True)
    np.testing.assert_allclose(explorer.detail_matrix, keras.ops.convert_to_numpy(luong)[1], rtol=1e-5)
    assert explorer.detail_source.data["x_token"][:5] == list("abcde")


def test_small_multiples_show_every_head_of_the_layer(fake_comm):
    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(make_model(), x)
    explorer.layer_choice.value = "four_heads"
    grid = explorer.grid_box.children[0]._model
    heads = {fig.title.text: figures.heatmap_source(fig) for fig, _, _ in grid.children
             if fig.name != "head_grid_scale"}
    assert sorted(heads) == [f"head {i}" for i in range(4)]
    for index, expected in enumerate(reference_weights(x, 4)[0]):
        np.testing.assert_allclose(np.reshape(heads[f"head {index}"].data["weight"], (5, 5)), expected, rtol=1e-5)


def test_long_sequences_get_an_overview_and_a_window(fake_comm):
    length = 150
    x = np.random.default_rng(2).normal(size=(1, length, 8)).astype("float32")
    inputs = keras.Input((length, 8))
    model = keras.Model(inputs, SplitHeadsAttention(2, name="long")(inputs))
    explorer = AttentionExplorer(model, x, max_tokens=64)
    expected = reference_weights(x, 2)[0].mean(axis=0)
    assert explorer.query_start.layout.display is None and explorer.query_start.max == 150 - 64
    assert len(explorer.overview_box.children) == 1
    assert explorer.detail_matrix.shape == (64, 64)
    explorer.query_start.value = 50
    explorer.key_start.value = 86
    np.testing.assert_allclose(explorer.detail_matrix, expected[50:114, 86:150], rtol=1e-5)
    assert explorer.detail_source.data["y_token"][0] == "50"


def test_a_long_input_window_is_shown_honestly(fake_comm):
    from bokeh.models import ColorBar
    from bokeh.models import LinearColorMapper

    length = 300
    x = np.random.default_rng(3).normal(size=(1, length, 8)).astype("float32")
    inputs = keras.Input((length, 8))
    model = keras.Model(inputs, SplitHeadsAttention(2, name="long")(inputs))
    explorer = AttentionExplorer(model, x, max_tokens=64)
    explorer.query_start.value = 200
    window = reference_weights(x, 2)[0].mean(axis=0)[200:264, 0:64]
    # Axes read the absolute positions of the window.
    y_axis = explorer.detail_figure.yaxis[0]
    assert y_axis.major_label_overrides[0] == "200" and y_axis.major_label_overrides[y_axis.ticker.ticks[-1]] \
        == str(200 + y_axis.ticker.ticks[-1])
    # Colours span the window's weights (~1/300 here), not 0-1.
    mapper = explorer.detail_figure.select_one({"type": LinearColorMapper})
    assert mapper.high == pytest.approx(window.max(), rel=1e-5) and mapper.high < 0.1
    # The overview has a colour bar and outlines the window.
    assert explorer.overview_figure.select_one({"type": ColorBar}) is not None
    assert dict(explorer.window_source.data) == {"left": [-0.5], "right": [63.5], "top": [199.5], "bottom": [263.5]}
    # The toolbar sits below the plot, not on the title's line.
    assert explorer.detail_figure.toolbar_location == "below"


def test_a_one_head_layer_is_not_shown_twice(fake_comm):
    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(make_model(), x)
    assert len(explorer.grid_box.children) == 1
    explorer.layer_choice.value = "luong"
    assert list(explorer.head_choice.options) == [0]
    assert explorer.grid_box.children == () and explorer.grid_heading.layout.display == "none"


def test_model_without_attention_layers_is_rejected(fake_comm):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no keras_attention attention layers.*Sequential"):
        AttentionExplorer(model, np.ones((1, 3)))


def test_inputs_the_model_cannot_take_are_rejected(fake_comm):
    with pytest.raises(ValueError, match=r"calling Functional .* failed.*Received: inputs of shape \(1, 5, 3\)"):
        AttentionExplorer(make_model(), np.ones((1, 5, 3), "float32"))


def test_example_outside_the_batch_is_rejected(fake_comm):
    with pytest.raises(ValueError, match=r"`example` must be in \[0, 2\). Received: example=2"):
        AttentionExplorer(make_model(), np.ones((2, 5, 8), "float32"), example=2)


class Block(keras.layers.Layer):
    """Like the Transformer blocks: a sublayer named `self_attention`, made in build."""

    def build(self, input_shape):
        self.attention = SplitHeadsAttention(2, name="self_attention")

    def call(self, x):
        return self.attention(x)


def test_layers_sharing_a_name_are_told_apart_by_path(fake_comm):
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, Block(name="block_1")(Block(name="block_0")(inputs)))
    x = np.random.default_rng(4).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(model, x)
    assert list(explorer.layer_choice.options) == ["block_0/self_attention", "block_1/self_attention"]
    np.testing.assert_allclose(explorer.select("block_0/self_attention", 1), reference_weights(x, 2)[0, 1], rtol=1e-5)
