import pathlib
import re

import numpy as np
import pytest
from bokeh.models import ColumnDataSource
from bokeh.models import HoverTool

from keras_attention.widgets import export_html
from keras_attention.widgets import figures

MALICIOUS = "<img src=x onerror=alert(1)>"


def matrix_from_source(source):
    data = source.data
    rows, cols = max(data["row"]) + 1, max(data["col"]) + 1
    grid = np.full((rows, cols), np.nan)
    grid[data["row"], data["col"]] = data["weight"]
    return grid


def test_heatmap_source_holds_every_cell_at_its_position():
    weights = np.random.default_rng(0).random((3, 5))
    fig = figures.heatmap(weights, list("abcde"), ["x", "y", "z"])
    source = figures.heatmap_source(fig)
    np.testing.assert_allclose(matrix_from_source(source), weights)
    assert source.data["x_token"][:5] == list("abcde")
    assert source.data["y_token"][5] == "y"


def test_repeated_tokens_keep_distinct_positions():
    fig = figures.heatmap(np.eye(3), ["the", "cat", "the"], ["the", "the", "cat"])
    assert fig.xaxis[0].major_label_overrides == {0: "the", 1: "cat", 2: "the"}


def test_tooltips_never_render_token_html():
    fig = figures.heatmap(np.eye(2), [MALICIOUS, "b"], ["a", "b"])
    for hover in fig.select({"type": HoverTool}):
        assert all("{safe}" not in field for _, field in hover.tooltips)


def test_token_count_mismatch_names_the_argument():
    with pytest.raises(ValueError, match="x_tokens.*one entry per position \\(3\\).*2 tokens"):
        figures.heatmap(np.eye(3), ["a", "b"])
    with pytest.raises(ValueError, match="2-D array.*\\(2, 2, 2\\)"):
        figures.heatmap(np.zeros((2, 2, 2)))


def test_downsample_is_a_block_mean():
    weights = np.random.default_rng(1).random((10, 7))
    small, row_step, col_step = figures.downsample(weights, 4)
    assert (row_step, col_step) == (3, 2)
    # Reference: explicit loops over blocks (the last blocks are partial).
    for i in range(small.shape[0]):
        for j in range(small.shape[1]):
            block = weights[i * 3 : (i + 1) * 3, j * 2 : (j + 1) * 2]
            assert small[i, j] == pytest.approx(block.mean())


def test_image_heatmap_of_a_long_sequence_is_downsampled():
    fig = figures.image_heatmap(np.ones((1000, 300)), max_size=100)
    image = fig.select_one({"type": ColumnDataSource}).data["image"][0]
    assert image.shape == (100, 100)
    assert "(10x3 block mean)" in fig.title.text


def test_distribution_bars_hold_the_distribution():
    weights = np.array([0.1, 0.6, 0.3])
    fig = figures.distribution_bars(weights, ["il", "a", "entarté"])
    data = figures.heatmap_source(fig).data
    assert data["weight"] == pytest.approx(weights.tolist())
    assert data["token"] == ["il", "a", "entarté"]


def test_weighted_sum_last_row_is_weights_times_values():
    rng = np.random.default_rng(2)
    weights, values = rng.dirichlet(np.ones(4)), rng.normal(size=(4, 3))
    fig = figures.weighted_sum(weights, values, list("abcd"))
    grid = matrix_from_source(figures.heatmap_source(fig))
    expected = sum(w * v for w, v in zip(weights, values, strict=True))
    np.testing.assert_allclose(grid[-1], expected)
    np.testing.assert_allclose(grid[1], weights[1] * values[1])


def test_head_grid_has_one_heatmap_per_head():
    weights = np.random.default_rng(3).random((3, 4, 5))
    grid = figures.head_grid(weights)
    sources = [s for s in grid.select({"type": ColumnDataSource}) if "weight" in s.data]
    assert len(sources) == 3
    got = sorted(tuple(np.round(matrix_from_source(s).ravel(), 6)) for s in sources)
    want = sorted(tuple(np.round(w.ravel(), 6)) for w in weights)
    assert got == want


def test_export_html_inlines_bokehjs_and_needs_no_network(tmp_path):
    path = export_html(figures.heatmap(np.eye(2), [MALICIOUS, "b"]), tmp_path / "f.html")
    html = pathlib.Path(path).read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]+src=", html), "no external scripts (CDN) allowed"
    assert "Bokeh" in html and len(html) > 500_000  # BokehJS itself is inside the file
    # The token travels HTML-escaped inside the JSON document, never as markup.
    assert MALICIOUS not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(figures, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 4 and result.failed == 0


def test_head_grid_thumbnails_share_a_colour_bar_and_thin_their_labels():
    from bokeh.models import ColorBar
    from bokeh.models import LinearColorMapper

    heads = np.random.default_rng(0).dirichlet(np.ones(30), size=(3, 30))
    tokens = [f"t{i}" for i in range(30)]
    grid = figures.head_grid(heads, tokens, tokens, size=170)
    thumbnails = [fig for fig, _, _ in grid.children if fig.name != "head_grid_scale"]
    highs = {fig.select_one({"type": LinearColorMapper}).high for fig in thumbnails}
    assert len(highs) == 1 and highs.pop() == pytest.approx(heads.max())
    assert len(list(grid.select({"type": ColorBar}))) == 1
    ticks = thumbnails[0].xaxis[0].ticker.ticks
    assert (
        1 < len(ticks) < 30
        and thumbnails[0].xaxis[0].major_label_overrides[ticks[1]] == tokens[ticks[1]]
    )


def test_downsample_with_given_steps_lines_up_row_blocks_computed_apart():
    matrix = np.random.default_rng(3).random((10, 7))
    whole, _, _ = figures.downsample(matrix, 10**9, steps=(3, 2))
    top, _, _ = figures.downsample(matrix[:6], 10**9, steps=(3, 2))
    bottom, _, _ = figures.downsample(matrix[6:], 10**9, steps=(3, 2))
    np.testing.assert_allclose(np.concatenate([top, bottom]), whole)
    np.testing.assert_allclose(whole[0, 0], matrix[:3, :2].mean())
    np.testing.assert_allclose(whole[-1, -1], matrix[9:, 6:].mean())  # the partial last block


def test_image_heatmap_of_a_precomputed_summary_keeps_the_original_positions():
    fig = figures.image_heatmap(np.ones((4, 8)), full_shape=(400, 800))
    data = fig.select_one({"name": "overview_source"}).data
    assert (data["dw"], data["dh"]) == ([800], [400]) and np.shape(data["image"][0]) == (4, 8)
    assert "(100x100 block mean)" in fig.title.text


def test_model_view_needs_one_name_per_layer():
    with pytest.raises(ValueError, match="Received: 1 thumbnails, 2 names"):
        figures.model_view([np.ones((2, 3, 3))], ["a", "b"])
    with pytest.raises(ValueError, match=r"\(heads, Tq, Tv\). Received: shape \(3, 3\)"):
        figures.model_view([np.ones((3, 3))], ["a"])


def test_model_view_crosses_out_masked_heads():
    thumbnails = [np.ones((2, 3, 3)), np.ones((3, 3, 3))]
    fig = figures.model_view(thumbnails, ["a", "b"], masked=[None, [1.0, 0.0, 1.0]])
    cells = figures.model_view_source(fig).data
    (cell,) = [
        i for i, c in enumerate(zip(cells["layer"], cells["head"], strict=True)) if c == ("b", 1)
    ]
    marks = fig.select_one({"name": "model_view_mask_source"}).data
    assert dict(marks) == {"x": [cells["x"][cell]], "y": [cells["y"][cell]]}
    unmasked = figures.model_view(thumbnails, ["a", "b"])
    assert dict(unmasked.select_one({"name": "model_view_mask_source"}).data) == {
        "x": [],
        "y": [],
    }
    with pytest.raises(ValueError, match=r"model_view: `masked` must be .*one entry per layer"):
        figures.model_view(thumbnails, ["a", "b"], masked=[None])
    with pytest.raises(ValueError, match=r"model_view: `masked\[1\]` must have one entry per"):
        figures.model_view(thumbnails, ["a", "b"], masked=[None, [1.0, 0.0]])
    with pytest.raises((TypeError, ValueError), match=r"model_view: .*masked\[0\]"):
        figures.model_view(thumbnails, ["a", "b"], masked=[["x", "y"], None])


@pytest.mark.parametrize(
    "build, source_name",
    [
        (
            lambda heads: figures.model_view([np.ones((n, 2, 2)) for n in heads], ["enc", "dec"]),
            "model_view_source",
        ),
        (
            lambda heads: figures.head_importance_grid([np.ones(n) for n in heads], ["enc", "dec"]),
            "head_importance_source",
        ),
    ],
    ids=["model_view", "head_importance_grid"],
)
def test_layer_head_grids_name_the_head_and_layer_at_each_cell(build, source_name):
    fig = build([3, 2])
    cells = fig.select_one({"name": source_name}).data
    assert fig.xaxis[0].ticker.ticks == sorted(set(cells["x"]))
    assert fig.yaxis[0].ticker.ticks == sorted(set(cells["y"]))
    for layer, head, x, y in zip(
        cells["layer"], cells["head"], cells["x"], cells["y"], strict=True
    ):
        assert fig.xaxis[0].major_label_overrides[x] == f"head {head}"
        assert fig.yaxis[0].major_label_overrides[y] == layer


@pytest.mark.parametrize(
    "build",
    [
        lambda weights: figures.heatmap(weights[0]),
        lambda weights: figures.image_heatmap(weights[0]),
        lambda weights: figures.head_grid(weights),
        lambda weights: figures.model_view([weights], ["layer"]),
        lambda weights: figures.head_importance_grid([weights[:, 0, 0]], ["layer"]),
    ],
    ids=["heatmap", "image_heatmap", "head_grid", "model_view", "head_importance_grid"],
)
def test_colour_bars_tick_in_plain_decimals(build):
    from bokeh.models import ColorBar

    (bar,) = build(np.full((2, 3, 3), 0.003)).select({"type": ColorBar})
    assert bar.formatter.use_scientific is False  # "0.003", not Bokeh's "3.000e-3"


def test_an_export_follows_a_dark_page_with_one_sheet_per_control(tmp_path):
    from bokeh.layouts import column
    from bokeh.models import Select

    select = Select(options=["a", "b"], value="a")
    layout = column(select, figures.heatmap(np.eye(2)))
    for name in ("a.html", "b.html"):
        export_html(layout, str(tmp_path / name))
    assert [s.name for s in select.stylesheets] == ["follow_dark_page"]
    html = (tmp_path / "b.html").read_text(encoding="utf-8")
    assert "color-scheme: light dark" in html and "prefers-color-scheme: dark" in html


def test_bar_labels_are_no_more_than_fit_and_each_names_its_own_bar():
    tokens = [f"token{i}" for i in range(60)]
    fig = figures.distribution_bars(np.full(60, 1 / 60), tokens, width=400)
    ticks = fig.xaxis[0].ticker.ticks
    assert 2 <= len(ticks) <= (400 - 80) // 13
    assert all(fig.xaxis[0].major_label_overrides[t] == tokens[t] for t in ticks)


def test_exporting_twice_keeps_one_theme_callback(tmp_path):
    fig = figures.heatmap(np.full((2, 3), 1 / 3))
    for name in ("a.html", "b.html"):
        export_html(fig, str(tmp_path / name))
    callbacks = fig.document.callbacks._js_event_callbacks["document_ready"]
    assert [c.name for c in callbacks].count("follow_page_theme") == 1
    assert (tmp_path / "b.html").read_text(encoding="utf-8").count("const originals =") == 1
