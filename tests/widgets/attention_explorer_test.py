import keras
import numpy as np
import pytest

import keras_attention
from keras_attention.widgets import AttentionExplorer
from keras_attention.widgets import figures
from tests.widgets.split_heads_attention import SplitHeadsAttention
from tests.widgets.split_heads_attention import reference_weights


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
    assert list(explorer.layer_choice.options) == [
        "two_heads",
        "four_heads",
        "luong",
        "rollout (all layers)",
        "flow (all layers)",
    ]
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
    np.testing.assert_allclose(
        explorer.detail_matrix, keras.ops.convert_to_numpy(luong)[1], rtol=1e-5
    )
    assert explorer.detail_source.data["x_token"][:5] == list("abcde")


def test_rollout_and_flow_are_views_of_the_captured_weights(fake_comm):
    from bokeh.models import CustomJS

    from keras_attention import analysis

    x = np.random.default_rng(7).normal(size=(2, 5, 8)).astype("float32")
    model = make_model()
    explorer = AttentionExplorer(model, x, query_tokens=list("abcde"), example=1)
    _, luong = model.get_layer("luong")(x, return_attention_scores=True)
    # The three layers, first called first, as rollout's stack (example 1 of the batch).
    layers = [
        reference_weights(x, 2)[1:],
        reference_weights(x, 4)[1:],
        keras.ops.convert_to_numpy(luong)[1:],
    ]
    explorer.layer_choice.value = "rollout (all layers)"
    # Head h of every layer: the fewest heads (luong's one) bound the choice.
    assert list(explorer.head_choice.options) == ["mean of heads"]
    np.testing.assert_allclose(
        explorer.detail_matrix, analysis.attention_rollout(layers)[0], rtol=1e-5
    )
    assert explorer.detail_figure.title.text == "rollout (all layers), mean of heads"
    assert explorer.model_view_source.selected.indices == []  # no thumbnail is the detail
    explorer.layer_choice.value = "flow (all layers)"
    flow = analysis.attention_flow(layers)[0]
    np.testing.assert_allclose(explorer.detail_matrix, flow, rtol=1e-5, atol=1e-7)
    # The export embeds both, computed at export.
    frames = explorer.standalone_layout().select_one({"type": CustomJS, "name": "swap_frame"})
    frames = frames.args["frames"]
    exported = frames["flow (all layers)|mean of heads"]["data"]["detail_source"]["weight"]
    np.testing.assert_allclose(np.reshape(exported, (5, 5)), flow, rtol=1e-5, atol=1e-7)
    assert "rollout (all layers)|mean of heads" in frames


def test_rollout_of_one_head_of_every_layer_and_no_views_without_a_stack(fake_comm):
    from keras_attention import analysis

    x = np.random.default_rng(8).normal(size=(1, 5, 8)).astype("float32")
    inputs = keras.Input((5, 8))
    two = SplitHeadsAttention(2, name="first")(inputs)
    model = keras.Model(inputs, SplitHeadsAttention(2, name="second")(two))
    explorer = AttentionExplorer(model, x)
    explorer.layer_choice.value = "rollout (all layers)"
    assert list(explorer.head_choice.options) == ["mean of heads", 0, 1]
    explorer.head_choice.value = 1
    second = reference_weights(keras.ops.convert_to_numpy(model.get_layer("first")(x)), 2)
    expected = analysis.attention_rollout([reference_weights(x, 2), second], heads=[1])[0]
    np.testing.assert_allclose(explorer.detail_matrix, expected, rtol=1e-5)
    # One layer is no stack: no rollout or flow in the menu.
    single = keras.Model(inputs, SplitHeadsAttention(2, name="only")(inputs))
    assert list(AttentionExplorer(single, x).layer_choice.options) == ["only"]


def test_rollout_and_flow_are_offered_up_to_their_token_limits(fake_comm, monkeypatch):
    from keras_attention.widgets import attention_explorer

    x = np.zeros((1, 5, 8), "float32")
    monkeypatch.setattr(attention_explorer, "FLOW_MAX_TOKENS", 4)
    options = AttentionExplorer(make_model(), x).layer_choice.options
    assert options[-1] == "rollout (all layers)"
    monkeypatch.setattr(attention_explorer, "ROLLOUT_MAX_TOKENS", 4)
    assert "rollout (all layers)" not in AttentionExplorer(make_model(), x).layer_choice.options


def stacked_model(num_heads=2):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((5, 8))
    hidden = keras_attention.MultiHeadAttention(num_heads, 4, name="mha0")(inputs)
    hidden = keras_attention.MultiHeadAttention(num_heads, 4, name="mha1")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, keras.layers.Dense(3, name="logits")(pooled))


def direct_loss_and_weights(model, x, y, masks):
    """The loss and mha1's weights with `head_mask` passed to each layer's call (not
    through the explorer's `masking_heads`)."""
    mha0, mha1 = model.get_layer("mha0"), model.get_layer("mha1")
    hidden = mha0(x, x, head_mask=masks["mha0"])
    hidden, weights = mha1(hidden, hidden, head_mask=masks["mha1"], return_attention_scores=True)
    logits = model.get_layer("logits")(model.get_layer("pool")(hidden))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    return float(keras.ops.convert_to_numpy(loss)), keras.ops.convert_to_numpy(weights)[0]


def test_a_click_on_the_head_grid_masks_the_head_and_the_loss_and_maps_follow(fake_comm):
    from keras_attention import analysis

    model = stacked_model()
    x = np.random.default_rng(9).normal(size=(4, 5, 8)).astype("float32")
    y = np.array([0, 1, 2, 1])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    explorer = AttentionExplorer(model, x, targets=y, loss=loss)
    ones = {"mha0": np.ones(2, "float32"), "mha1": np.ones(2, "float32")}
    baseline, _ = direct_loss_and_weights(model, x, y, ones)
    assert explorer.loss == pytest.approx(baseline, rel=1e-5)
    expected = analysis.head_importance(model, [(x, y)], loss)
    data = explorer.importance_source.data
    assert list(zip(data["layer"], data["head"], strict=True)) == [
        ("mha0", 0),
        ("mha0", 1),
        ("mha1", 0),
        ("mha1", 1),
    ]
    np.testing.assert_allclose(
        data["importance"], np.concatenate([expected["mha0"], expected["mha1"]]), rtol=1e-5
    )
    explorer.layer_choice.value = "mha1"
    before = explorer.detail_matrix
    explorer.importance_source.selected.indices = [1]  # what a click on (mha0, head 1) sets
    masked = {"mha0": np.array([1, 0], "float32"), "mha1": np.ones(2, "float32")}
    loss_masked, weights_masked = direct_loss_and_weights(model, x, y, masked)
    assert explorer.masked_heads() == [("mha0", 1)]
    assert explorer.loss == pytest.approx(loss_masked, rel=1e-5)
    assert abs(explorer.loss - baseline) > 1e-4
    # The map of the layer above changes with its input, to the masked model's weights.
    np.testing.assert_allclose(explorer.detail_matrix, weights_masked.mean(axis=0), rtol=1e-4)
    assert not np.allclose(explorer.detail_matrix, before, rtol=1e-4)
    assert explorer.importance_source.selected.indices == []  # ready for the next click
    assert dict(explorer.importance_figure.select_one({"name": "head_mask_source"}).data) == {
        "x": [1],
        "y": [0],
    }
    assert "loss" in explorer.loss_html.value
    # A second click unmasks it.
    explorer.importance_source.selected.indices = [1]
    assert explorer.masked_heads() == [] and explorer.loss == pytest.approx(baseline, rel=1e-5)
    np.testing.assert_allclose(explorer.detail_matrix, before, rtol=1e-5)
    # The export: the grid as it is, the loss in its title.
    explorer.toggle_head("mha1", 0)
    document = explorer.standalone_layout()
    grid = document.select_one({"name": "head_importance_figure"})
    assert f"loss {explorer.loss:.4f}" in grid.title.text
    assert dict(grid.select_one({"name": "head_mask_source"}).data) == {"x": [0], "y": [1]}


def direct_logits(model, x, masks):
    """The logits with `head_mask` passed to each layer's call (not `masking_heads`)."""
    hidden = model.get_layer("mha0")(x, x, head_mask=masks["mha0"])
    hidden = model.get_layer("mha1")(hidden, hidden, head_mask=masks["mha1"])
    return keras.ops.convert_to_numpy(model.get_layer("logits")(model.get_layer("pool")(hidden)))


def test_a_masked_head_is_marked_and_what_it_changes_is_shown(fake_comm):
    # Masking the last layer's head changes no map (none lies after it), only the output
    # and the loss: the model view crosses it out and the widget shows the output (#52).
    model = stacked_model()
    x = np.random.default_rng(9).normal(size=(4, 5, 8)).astype("float32")
    y = np.array([0, 1, 2, 1])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    explorer = AttentionExplorer(model, x, targets=y, loss=loss, example=2)
    assert "first-order estimate" in explorer.importance_figure.title.text
    before = {name: w.copy() for name, w in explorer.weights.items()}
    marks = explorer.model_view_figure.select_one({"name": "model_view_mask_source"})
    assert dict(marks.data) == {"x": [], "y": []}
    explorer.toggle_head("mha1", 1)
    masked = {"mha0": np.ones(2, "float32"), "mha1": np.array([1, 0], "float32")}
    cell = thumbnail(explorer, "mha1", 1)
    data = explorer.model_view_source.data
    assert dict(marks.data) == {"x": [data["x"][cell]], "y": [data["y"][cell]]}
    for name, weights in explorer.weights.items():  # no map changed ...
        np.testing.assert_allclose(weights, before[name], rtol=1e-5)
    ones = {"mha0": np.ones(2, "float32"), "mha1": np.ones(2, "float32")}
    unmasked_logits, masked_logits = (direct_logits(model, x, m)[2] for m in (ones, masked))
    assert not np.allclose(unmasked_logits, masked_logits, atol=1e-4)  # ... the output did
    np.testing.assert_allclose(explorer.baseline_output, unmasked_logits, rtol=1e-5)
    np.testing.assert_allclose(explorer.output, masked_logits, rtol=1e-5)
    shown = explorer.loss_html.value
    assert "no attention map lies after mha1" in shown
    for label, logits in (("unmasked", unmasked_logits), ("masked", masked_logits)):
        top = int(np.argmax(logits))
        assert f"<th style='text-align:left'>{label}</th><td><b>{top} (" in shown
    change = explorer.loss - explorer.baseline_loss
    assert abs(change) > 1e-4 and f"measured change {change:+.4f}" in shown
    assert "first-order estimate" in shown
    # A head of the first layer: the map after it changes, and the widget says which.
    explorer.toggle_head("mha1", 1)
    explorer.toggle_head("mha0", 0)
    assert "the maps of the 1 layer after mha0 (mha1) change" in explorer.loss_html.value
    assert not np.allclose(explorer.weights["mha1"], before["mha1"], atol=1e-4)
    # The export shows the same: crossed-out thumbnails and the effect beside the grid.
    document = explorer.standalone_layout()
    cell = thumbnail(explorer, "mha0", 0)
    assert dict(document.select_one({"name": "model_view_mask_source"}).data) == {
        "x": [data["x"][cell]],
        "y": [data["y"][cell]],
    }
    assert document.select_one({"name": "mask_effect"}).text == explorer.mask_effect_html()


def test_a_layer_given_query_and_value_shows_its_masked_output(fake_comm):
    layer = keras_attention.MultiHeadAttention(2, 4, name="mha", seed=0)
    query, value = np.random.default_rng(4).normal(size=(2, 1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(layer, (query, value), scores_on_demand=False)
    explorer.toggle_head("mha", 1)
    expected = layer(query, value, head_mask=np.array([1.0, 0.0], "float32"))
    np.testing.assert_allclose(explorer.output, keras.ops.convert_to_numpy(expected)[0], rtol=1e-5)
    np.testing.assert_allclose(
        explorer.baseline_output, keras.ops.convert_to_numpy(layer(query, value))[0], rtol=1e-5
    )


def test_the_first_rollout_pick_says_it_is_computing(fake_comm, monkeypatch):
    from keras_attention.widgets import _captured

    x = np.random.default_rng(9).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(stacked_model(), x)
    computing = _captured.combined_attention
    shown_while_computing = []

    def spy(*args, **kwargs):
        shown_while_computing.append(explorer.info_html.value)
        return computing(*args, **kwargs)

    monkeypatch.setattr(_captured, "combined_attention", spy)
    explorer.layer_choice.value = "rollout (all layers)"
    assert len(shown_while_computing) == 1 and "computing" in shown_while_computing[0]
    assert "computing" not in explorer.info_html.value
    explorer.layer_choice.value = "mha0"
    explorer.layer_choice.value = "rollout (all layers)"  # computed once
    assert len(shown_while_computing) == 1


def test_without_targets_the_grid_masks_heads_and_shows_no_loss(fake_comm):
    x = np.random.default_rng(9).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(stacked_model(), x)
    assert explorer.importance is None and explorer.loss is None
    assert all(np.isnan(explorer.importance_source.data["importance"]))
    explorer.toggle_head("mha0", 0)
    assert explorer.masked_heads() == [("mha0", 0)]
    assert explorer.loss_html.value.startswith("<b>1 head masked</b>")
    with pytest.raises(ValueError, match=r"toggle_head: `head` must be in \[0, 2\)"):
        explorer.toggle_head("mha0", 2)
    with pytest.raises(ValueError, match=r"toggle_head: `layer`.*Received: layer='nope'"):
        explorer.toggle_head("nope", 0)
    # No MultiHeadAttention, no grid.
    assert AttentionExplorer(make_model(), x).importance_source is None


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"loss": "mse"}, ValueError, r"`loss` needs `targets`.*Received: loss='mse'"),
        ({"targets": np.zeros(1)}, ValueError, r"`targets` needs a `loss`.*not compiled"),
        ({"targets": np.zeros(1), "loss": "nonsense"}, ValueError, r"loss='nonsense'"),
        ({"targets": np.zeros(1), "loss": 3}, TypeError, r"Received: loss=3"),
    ],
)
def test_bad_targets_and_loss_are_refused(fake_comm, options, error, message):
    x = np.zeros((1, 5, 8), "float32")
    with pytest.raises(error, match=rf"^AttentionExplorer: .*{message}"):
        AttentionExplorer(stacked_model(), x, **options)


def test_targets_need_heads_to_score(fake_comm):
    with pytest.raises(ValueError, match="score the heads of.*MultiHeadAttention"):
        AttentionExplorer(make_model(), np.zeros((1, 5, 8), "float32"), targets=[0], loss="mse")


def test_a_long_windows_heatmap_is_as_tall_as_the_head_view_beside_it(fake_comm):
    from keras_attention.widgets import attention_explorer

    x = np.random.default_rng(2).normal(size=(1, 80, 8)).astype("float32")
    inputs = keras.Input((80, 8))
    explorer = AttentionExplorer(
        keras.Model(inputs, SplitHeadsAttention(2, name="long")(inputs)), x, max_tokens=64
    )
    # The bars go under the heatmap; together they end where the head view ends (#42).
    view_height = explorer.head_view_figure.height
    assert view_height >= 64 * 15
    assert explorer.detail_figure.height + attention_explorer.BARS_HEIGHT == view_height
    assert explorer.bars_figure.width == explorer.detail_figure.width


def thumbnail(explorer, layer, head):
    data = explorer.model_view_source.data
    return [
        i
        for i, (name, h) in enumerate(zip(data["layer"], data["head"], strict=True))
        if (name, h) == (layer, head)
    ][0]


def test_the_model_view_shows_every_layer_and_head_with_one_colour_bar(fake_comm):
    from bokeh.models import ColorBar

    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(make_model(), x)
    data = explorer.model_view_source.data
    assert list(zip(data["layer"], data["head"], strict=True)) == [
        ("two_heads", 0),
        ("two_heads", 1),
        *(("four_heads", h) for h in range(4)),
        ("luong", 0),
    ]
    images = explorer.model_view_figure.select_one({"name": "model_view_images"}).data["image"]
    expected = [*reference_weights(x, 2)[0], *reference_weights(x, 4)[0]]
    # The split heads' images, in order; the last one (luong) has no reference here.
    for image, head in zip(images, expected, strict=False):
        np.testing.assert_allclose(image, head, rtol=1e-5)
    colour_bar = explorer.model_view_figure.select_one({"type": ColorBar})
    assert colour_bar.color_mapper.high == pytest.approx(max(float(np.max(i)) for i in images))
    # The detail (mean of two_heads) is outlined: both of its thumbnails.
    assert explorer.model_view_source.selected.indices == [0, 1]


def test_clicking_a_thumbnail_selects_it_as_the_detail(fake_comm):
    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(make_model(), x, query_tokens=list("abcde"))
    index = thumbnail(explorer, "four_heads", 2)
    explorer.model_view_source.selected.indices = [index]  # what a tap in the page sets
    assert (explorer.layer_choice.value, explorer.head_choice.value) == ("four_heads", 2)
    np.testing.assert_allclose(explorer.detail_matrix, reference_weights(x, 4)[0, 2], rtol=1e-5)
    assert explorer.detail_figure.title.text == "four_heads, head 2"
    assert explorer.model_view_source.selected.indices == [index]
    explorer.model_view_source.selected.indices = [thumbnail(explorer, "two_heads", 1)]
    np.testing.assert_allclose(explorer.detail_matrix, reference_weights(x, 2)[0, 1], rtol=1e-5)
    # The dropdowns move the outline too; the mean outlines every head of the layer.
    explorer.head_choice.value = "mean of heads"
    assert explorer.model_view_source.selected.indices == [0, 1]


def test_the_head_view_lists_the_windows_tokens_and_reads_the_detail(fake_comm):
    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(make_model(), x, query_tokens=list("abcde"))
    tokens = explorer.token_source.data
    assert tokens["side"] == ["query"] * 5 + ["key"] * 5 and tokens["token"] == list("abcde") * 2
    assert tokens["position"] == [*range(5), *range(5)]
    # Its lines are drawn from the heatmap's own cells (so they follow every change).
    lines = explorer.head_view_figure.select_one({"name": "head_view_lines"})
    assert lines.data_source is explorer.detail_source
    explorer.focus_token(3, side="key")
    assert explorer.token_source.selected.indices == [8]
    # Laid out for its tokens from the start (the page's first draw uses this state).
    assert (explorer.head_view_figure.y_range.start, explorer.head_view_figure.y_range.end) == (
        4.5,
        -0.5,
    )
    with pytest.raises(ValueError, match="no query token at window position 7"):
        explorer.focus_token(7)
    # Its data is set before the page draws it (no change to react to): the bars are drawn
    # when the page is ready, not at the first hover (#42).
    ready = explorer.detail_widget._document.callbacks.js_event_callbacks["document_ready"]
    assert figures.HEAD_VIEW_REDRAW in [callback.name for callback in ready]


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
    # The detail labels no more positions than fit, each with its own text; the head view
    # has a row per token of the 64-token window, 15 px each, so 9pt labels do not overlap.
    x_axis = explorer.detail_figure.xaxis[0]
    assert 10 <= len(x_axis.ticker.ticks) <= 25
    assert all(x_axis.major_label_overrides[t] == str(86 + t) for t in x_axis.ticker.ticks)
    view = explorer.head_view_figure
    assert (view.y_range.start, view.y_range.end) == (63.5, -0.5) and view.height >= 64 * 15


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
    assert y_axis.major_label_overrides[0] == "200" and y_axis.major_label_overrides[
        y_axis.ticker.ticks[-1]
    ] == str(200 + y_axis.ticker.ticks[-1])
    # Colours span the window's weights (~1/300 here), not 0-1.
    mapper = explorer.detail_figure.select_one({"type": LinearColorMapper})
    assert mapper.high == pytest.approx(window.max(), rel=1e-5) and mapper.high < 0.1
    # The overview has a colour bar and outlines the window.
    assert explorer.overview_figure.select_one({"type": ColorBar}) is not None
    assert dict(explorer.window_source.data) == {
        "left": [-0.5],
        "right": [63.5],
        "top": [199.5],
        "bottom": [263.5],
    }
    # The toolbar sits below the plot, not on the title's line.
    assert explorer.detail_figure.toolbar_location == "below"


def test_a_one_head_layer_is_not_shown_twice(fake_comm):
    x = np.random.default_rng(1).normal(size=(1, 5, 8)).astype("float32")
    explorer = AttentionExplorer(make_model(), x)
    explorer.layer_choice.value = "luong"
    assert list(explorer.head_choice.options) == [0]  # no "mean of heads" of one head
    assert explorer.model_view_source.selected.indices == [thumbnail(explorer, "luong", 0)]
    # A model with a single head has no model view: its only thumbnail is the detail.
    inputs = keras.Input((5, 8))
    single = keras.Model(inputs, keras_attention.LuongAttention(name="luong")(inputs))
    explorer = AttentionExplorer(single, x)
    assert explorer.model_view_widget.layout.display == "none"
    assert explorer.model_view_source.data["layer"] == ["luong"]


def test_model_without_attention_layers_is_rejected(fake_comm):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no keras_attention attention layers.*Sequential"):
        AttentionExplorer(model, np.ones((1, 3)))


def test_inputs_the_model_cannot_take_are_rejected(fake_comm):
    with pytest.raises(
        ValueError, match=r"calling Functional .* failed.*Received: inputs of shape \(1, 5, 3\)"
    ):
        AttentionExplorer(make_model(), np.ones((1, 5, 3), "float32"))


def test_example_outside_the_batch_is_rejected(fake_comm):
    with pytest.raises(ValueError, match=r"`example` must be in \[0, 2\). Received: example=2"):
        AttentionExplorer(make_model(), np.ones((2, 5, 8), "float32"), example=2)


@pytest.mark.parametrize(
    "argument, value, error",
    [
        ("query_tokens", 5, TypeError),
        ("key_tokens", "abcde", TypeError),
        ("query_tokens", ["a", 1, "c", "d", "e"], TypeError),
        ("example", -1, ValueError),
        ("example", 1.0, ValueError),
    ],
)
def test_bad_arguments_are_refused_naming_them_before_the_call(
    fake_comm, monkeypatch, argument, value, error
):
    import re

    from keras_attention.widgets import _captured

    calls = []
    monkeypatch.setattr(_captured, "call_and_capture", lambda *a: calls.append(a))
    with pytest.raises(
        error,
        match=rf"^AttentionExplorer: `{argument}`.*Received: "
        rf"{re.escape(f'{argument}={value!r}')}",
    ):
        AttentionExplorer(make_model(), np.ones((2, 5, 8), "float32"), **{argument: value})
    assert calls == []  # refused before the model was called


def test_numpy_example_and_token_arrays_are_accepted(fake_comm):
    tokens = np.array(["a", "b", "c", "d", "e"])
    explorer = AttentionExplorer(
        make_model(), np.ones((2, 5, 8), "float32"), example=np.int64(1), query_tokens=tokens
    )
    assert explorer.example == 1 and explorer.query_tokens == list(tokens)


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
    assert list(explorer.layer_choice.options)[:2] == [
        "block_0/self_attention",
        "block_1/self_attention",
    ]
    np.testing.assert_allclose(
        explorer.select("block_0/self_attention", 1), reference_weights(x, 2)[0, 1], rtol=1e-5
    )


def numpy_rows(layer, x, q0, q1, head):
    """Weights of query rows [q0, q1) of one head, from the layer's projections in NumPy."""
    x = np.asarray(x, "float64")[0]
    wq, bq = (np.asarray(w, "float64") for w in (layer.query_dense.kernel, layer.query_dense.bias))
    wk, bk = (np.asarray(w, "float64") for w in (layer.key_dense.kernel, layer.key_dense.bias))
    q = np.einsum("td,de->te", x[q0:q1], wq[:, head]) + bq[head]
    k = np.einsum("td,de->te", x, wk[:, head]) + bk[head]
    logits = q @ k.T / np.sqrt(wq.shape[-1])
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


def test_scores_on_demand_windows_are_the_layers_exact_rows(fake_comm, monkeypatch):
    from bokeh.models import CustomJS

    from keras_attention.ops import dense_attention

    length = 300
    x = np.random.default_rng(5).normal(size=(1, length, 8)).astype("float32")
    layer = keras_attention.MultiHeadAttention(2, 4, name="long", seed=0)
    layer(x[:, :4])  # built

    # The path that forms the full (Tq, Tv) weights never runs.
    def no_full_weights(*args, **kwargs):
        raise AssertionError("the full weights were formed")

    monkeypatch.setattr(dense_attention, "dense_attention", no_full_weights)
    explorer = AttentionExplorer(layer, x, scores_on_demand=True, max_tokens=64, rows_per_call=100)
    assert explorer.weights is None and explorer.shapes == {"long": (2, length, length)}
    explorer.query_start.value = 200
    explorer.key_start.value = 120
    explorer.head_choice.value = 1
    np.testing.assert_allclose(
        explorer.detail_matrix, numpy_rows(layer, x, 200, 264, 1)[:, 120:184], rtol=2e-4, atol=1e-7
    )
    assert (
        explorer.detail_source.data["y_token"][0] == "200"
        and explorer.detail_source.data["x_token"][0] == "120"
    )
    # The overview: block means of the mean of heads, computed 100 rows at a time.
    full = (numpy_rows(layer, x, 0, length, 0) + numpy_rows(layer, x, 0, length, 1)) / 2
    expected, _, _ = figures.downsample(full, 128)
    overview = explorer.overview_figure.select_one({"name": "overview_source"}).data["image"][0]
    np.testing.assert_allclose(overview, expected, rtol=2e-4, atol=1e-7)
    assert dict(explorer.window_source.data) == {
        "left": [119.5],
        "right": [183.5],
        "top": [199.5],
        "bottom": [263.5],
    }
    # The export embeds that window of each head, still without the full weights.
    callback = explorer.standalone_layout().select_one({"type": CustomJS, "name": "swap_frame"})
    detail = callback.args["frames"]["long|0"]["data"]["detail_source"]
    assert (
        max(detail["row"]) + 1,
        max(detail["col"]) + 1,
        detail["y_token"][0],
        detail["x_token"][0],
    ) == (64, 64, "200", "120")
    np.testing.assert_allclose(
        np.reshape(detail["weight"], (64, 64)),
        numpy_rows(layer, x, 200, 264, 0)[:, 120:184],
        rtol=2e-4,
        atol=1e-7,
    )
    # ... beside the same overview, with the same window outlined.
    document = callback.document
    exported = document.select_one({"name": "overview_0"})
    assert exported.visible and callback.args["frames"]["long|0"]["props"]["overview_0"] == {
        "visible": True
    }
    np.testing.assert_allclose(
        exported.select_one({"name": "overview_source"}).data["image"][0],
        expected,
        rtol=2e-4,
        atol=1e-7,
    )
    assert dict(exported.select_one({"name": "window_source"}).data) == dict(
        explorer.window_source.data
    )


def test_scores_on_demand_needs_a_layer_that_selects_heads(fake_comm):
    with pytest.raises(
        ValueError, match="scores_on_demand=True. needs an attention layer.*Functional"
    ):
        AttentionExplorer(make_model(), np.ones((1, 5, 8), "float32"), scores_on_demand=True)
    with pytest.raises(ValueError, match="Received: scores_on_demand='yes'"):
        AttentionExplorer(make_model(), np.ones((1, 5, 8), "float32"), scores_on_demand="yes")


LONG_CHILD = r"""
import json, resource, sys
import numpy as np, keras
import keras_attention
from ipywidgets.widgets.tests import utils
from keras_attention.widgets import AttentionExplorer

utils.setup_test_comm()
length, out = int(sys.argv[1]), sys.argv[2]
x = np.random.default_rng(6).normal(size=(1, length, 16)).astype("float32")
layer = keras_attention.MultiHeadAttention(2, 8, name="long", seed=0)
layer(x[:, :8])
np.savez(out + ".npz", x=x, *[np.asarray(w) for w in layer.get_weights()])
kilobytes = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
explorer = AttentionExplorer(layer, x[:, :64], max_tokens=64)  # warms the kernels up
before = kilobytes()
# "auto": scores on demand from 4096 keys
explorer = AttentionExplorer(layer, x, max_tokens=64, **json.loads(sys.argv[3]))
explorer.query_start.value = 9000
explorer.key_start.value = 12000
explorer.head_choice.value = 1
peak = kilobytes()
y_axis = explorer.detail_figure.yaxis[0]
mapper = explorer.detail_figure.select_one(
    {"type": keras_attention.widgets.figures.LinearColorMapper}
)
overview = explorer.overview_figure.select_one({"name": "overview_source"})
json.dump({"detail": explorer.detail_matrix.tolist(), "grown_mib": (peak - before) / 1024,
           "on_demand": explorer.weights is None, "first_label": y_axis.major_label_overrides[0],
           "window": dict(explorer.window_source.data), "high": mapper.high,
           "overview_shape": list(np.shape(overview.data["image"][0]))},
          open(out, "w"))
"""


@pytest.mark.slow
@pytest.mark.tf_only
def test_a_16384_token_window_is_exact_and_the_full_weights_are_never_formed(tmp_path):
    import json
    import os
    import subprocess
    import sys

    length, out = 16384, str(tmp_path / "long.json")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    options = os.environ.get(
        "KA_LONG_EXPLORER_OPTIONS", "{}"
    )  # e.g. '{"rows_per_call": 16384}' breaks it
    subprocess.run(
        [sys.executable, "-c", LONG_CHILD, str(length), out, options],
        check=True,
        env=env,
        timeout=600,
    )
    with open(out) as file:
        result = json.load(file)
    saved = np.load(out + ".npz")
    x, weights = saved["x"], [saved[f"arr_{i}"] for i in range(8)]
    layer = keras_attention.MultiHeadAttention(2, 8, seed=0)
    layer(x[:, :8])
    layer.set_weights(weights)
    assert result["on_demand"]
    print(f"explorer on {length} tokens: peak RSS grew {result['grown_mib']:.0f} MiB")
    # One head's full weights alone are 16384^2 x 4 bytes = 1 GiB (both heads: 2 GiB); the
    # explorer, every head's overview included, grew by less.
    assert result["grown_mib"] < 1024, result["grown_mib"]
    expected = numpy_rows(layer, x, 9000, 9064, 1)[:, 12000:12064]
    np.testing.assert_allclose(result["detail"], expected, rtol=2e-4, atol=1e-8)
    # Absolute positions, colours fitted to the window, the window outlined on a 128 x 128 overview.
    assert result["first_label"] == "9000"
    assert result["high"] == pytest.approx(expected.max(), rel=1e-4) and result["high"] < 0.05
    assert result["window"] == {
        "left": [11999.5],
        "right": [12063.5],
        "top": [8999.5],
        "bottom": [9063.5],
    }
    assert result["overview_shape"] == [128, 128]
