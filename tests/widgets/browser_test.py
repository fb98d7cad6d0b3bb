"""Real-browser checks of exported files in Debian chromium (the widgets in
JupyterLab, Notebook 7 and Voila are in frontends_test.py).

Skipped only when no chromium is installed (`.ci/install-browser.sh` installs
it). Playwright's own browser download is not used: chromium is launched from
its system path with flags that keep it off the network.
"""

import contextlib
import json

import numpy as np
import pytest

from keras_attention.widgets import export_html
from keras_attention.widgets import figures
from keras_attention.widgets.export import CHROMIUM_ARGS
from keras_attention.widgets.export import find_chromium
from tests.widgets import bokeh_page
from tests.widgets import text_boxes
from tests.widgets.legibility import _COLOUR_HELPERS

CHROMIUM = find_chromium()
MALICIOUS = "<img/src=x/onerror=alert(1)>"  # the slashes make it a valid <img> with onerror

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium installed (run .ci/install-browser.sh)"
    ),
]


@contextlib.contextmanager
def browser_page(tmp_path, color_scheme="light", width=1400):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            page = browser.new_page(
                viewport={"width": width, "height": 1000}, color_scheme=color_scheme
            )
            page.alerts = []
            page.on("dialog", lambda dialog: (page.alerts.append(dialog.message), dialog.dismiss()))
            try:
                yield page
            except BaseException:
                shot = tmp_path / "failure.png"
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(shot), full_page=True)
                    print(f"screenshot of the failing page: {shot}")
                raise
        finally:
            browser.close()


def test_exported_html_draws_offline_and_shows_tokens_as_text(tmp_path):
    from PIL import Image

    weights = np.random.default_rng(0).dirichlet(np.ones(4), size=3)
    fig = figures.heatmap(weights, ["il", MALICIOUS, "m'", "entarté"], ["he", "hit", MALICIOUS])
    path = export_html(fig, str(tmp_path / "heatmap.html"))
    with browser_page(tmp_path) as page:
        # Any request leaving the file would mean a CDN dependency.
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto("file://" + path)
        page.wait_for_function(
            "window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=30_000
        )
        page.wait_for_timeout(500)
        shot = tmp_path / "heatmap.png"
        page.screenshot(path=str(shot))
        assert page.alerts == []
        assert page.evaluate("document.querySelectorAll('img[onerror]').length") == 0
        assert all(url.startswith(("file://", "data:")) for url in requests), requests
    image = np.asarray(Image.open(shot).convert("RGB"))
    colours = {tuple(pixel) for pixel in image.reshape(-1, 3)[::7]}
    assert len(colours) > 20, "the heatmap was not drawn"


def test_export_png_draws_the_figure(tmp_path):
    from PIL import Image

    from keras_attention.widgets import export_png

    fig = figures.heatmap(np.random.default_rng(1).random((5, 5)), title="png")
    path = export_png(fig, str(tmp_path / "heatmap.png"), width=500, height=450)
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[:2] == (450, 500)
    assert len({tuple(p) for p in image.reshape(-1, 3)[::5]}) > 20


def read_source(name, column):
    return (
        "(() => { const doc = window.Bokeh.documents[0];"
        f" const s = doc.get_model_by_name({name!r});"
        " const d = s.data;"
        f" return Array.from(d instanceof Map ? d.get({column!r}) : d[{column!r}]); }})()"
    )


@contextlib.contextmanager
def offline_export(tmp_path, widget, name, color_scheme="light", width=1400):
    """The widget exported and opened from disk; asserts nothing was fetched."""
    path = export_html(widget, str(tmp_path / f"{name}.html"))
    with browser_page(tmp_path, color_scheme, width) as page:
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto("file://" + path)
        page.wait_for_function(
            "window.Bokeh && window.Bokeh.documents && window.Bokeh.documents.length > 0"
            " && Object.keys(window.Bokeh.index).length > 0",
            timeout=30_000,
        )
        yield page
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        assert page.alerts == []
        assert all(url.startswith(("file://", "data:")) for url in requests), requests


def set_model(page, name, attribute, value):
    page.evaluate(f"window.Bokeh.documents[0].get_model_by_name({name!r}).{attribute} = {value!r}")


# The exported alignment's rows as drawn: its y range and the labels of its y axis.
READ_ALIGNMENT_AXIS = """() => {
  const fig = window.Bokeh.documents[0].get_model_by_name("alignment_figure");
  const axis = fig.left.find((r) => r.major_label_overrides !== undefined);
  const labels = axis.major_label_overrides;
  return {range: [fig.y_range.start, fig.y_range.end], ticks: Array.from(axis.ticker.ticks),
          labels: axis.ticker.ticks.map((t) => labels instanceof Map ? labels.get(t) : labels[t])};
}"""
READ_SCORES_RANGE = """() => {
  const r = window.Bokeh.documents[0].get_model_by_name("scores_figure").y_range;
  return [r.start, r.end]; }"""


def assert_alignment_drawn(page, tokens):
    """One labelled row per decoded token, and no blank row below them."""
    drawn = page.evaluate(READ_ALIGNMENT_AXIS)
    assert drawn["range"] == [len(tokens) - 0.5, -0.5]
    assert drawn["ticks"] == list(range(len(tokens))) and drawn["labels"] == tokens


def test_exported_stepper_replays_every_step_without_a_kernel(tmp_path, fake_comm):
    from keras_attention.widgets import DecodingStepper
    from tests.widgets.fake_translator import FakeTranslator

    stepper = DecodingStepper(FakeTranslator(), "il a m' " + MALICIOUS)
    steps = [stepper.next_token() for _ in range(3)]
    stepper.back()  # the export holds the whole decoded line, not only up to the current step
    values = stepper.session.values
    with offline_export(tmp_path, stepper, "stepper") as page:
        page.wait_for_function(f"{read_source('alignment_source', 'row')}.length === 12")
        np.testing.assert_allclose(
            page.evaluate(read_source("alignment_source", "weight")),
            np.ravel([s.attention for s in steps]),
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            page.evaluate(read_source("distribution_source", "weight")),
            steps[-1].attention,
            rtol=1e-6,
        )
        assert_alignment_drawn(page, [s.token for s in steps])
        scores_range = page.evaluate(READ_SCORES_RANGE)
        assert min(scores_range) <= min(0, steps[-1].scores.min()) and max(scores_range) >= max(
            0, steps[-1].scores.max()
        )
        set_model(page, "step_slider", "value", 1)
        page.wait_for_function(f"{read_source('alignment_source', 'row')}.length === 4")
        assert_alignment_drawn(page, [steps[0].token])
        np.testing.assert_allclose(
            page.evaluate(read_source("distribution_source", "weight")),
            steps[0].attention,
            rtol=1e-6,
        )
        weighted = np.reshape(page.evaluate(read_source("weighted_sum_source", "weight")), (5, -1))
        np.testing.assert_allclose(weighted[-1], steps[0].attention @ values, rtol=1e-5)
        assert page.evaluate(read_source("candidate_source", "token")) == [
            t for t, _ in steps[0].candidates
        ]
        # Bokeh draws the Div in a shadow root; Playwright's locators reach into it.
        assert page.get_by_text(MALICIOUS).count() >= 1
        assert page.locator("img").count() == 0


def test_exported_transformer_stepper_switches_heads_without_a_kernel(tmp_path, fake_comm):
    from keras_attention.widgets import DecodingStepper
    from tests.widgets.fake_translator import FakeTranslator

    stepper = DecodingStepper(FakeTranslator(heads=(2, 3), with_scores=False), "il a m'")
    steps = [stepper.next_token() for _ in range(2)]
    with offline_export(tmp_path, stepper, "transformer_stepper") as page:
        page.wait_for_function(f"{read_source('alignment_source', 'row')}.length === 6")
        np.testing.assert_allclose(
            page.evaluate(read_source("distribution_source", "weight")),
            steps[-1].attention[-1].mean(axis=0),
            rtol=1e-6,
        )
        page.locator("select").nth(1).select_option("2")  # the head select, a real control
        page.wait_for_function(
            f"Math.abs({read_source('distribution_source', 'weight')}[0]"
            f" - {float(steps[-1].attention[-1, 2, 0])}) < 1e-6"
        )
        np.testing.assert_allclose(
            page.evaluate(read_source("alignment_source", "weight")),
            np.ravel([s.attention[-1, 2] for s in steps]),
            rtol=1e-6,
        )


def test_exported_causal_stepper_replays_each_steps_cache_without_a_kernel(tmp_path, fake_comm):
    """A causal LM's stepper exported (#52): its cache panel and model view
    follow the step slider in the page, each step's cells the session's."""
    pytest.importorskip("keras_hub")
    from keras_attention.interchange import keras_hub_models
    from keras_attention.widgets import DecodingStepper
    from tests import causal_lms

    lm = causal_lms.gemma_causal_lm(0, 10, sliding_window=3)
    keras_hub_models.replace_keras_hub_attention(lm)
    stepper = DecodingStepper(lm, "keras", max_length=10)
    steps = [stepper.next_token() for _ in range(4)]
    with offline_export(tmp_path, stepper, "causal_stepper") as page:
        for position in (4, 2):
            set_model(page, "step_slider", "value", position)
            views = steps[position - 1].caches
            page.wait_for_function(
                f"{read_source('alignment_source', 'row')}.length === {position * 9}"
            )
            assert page.evaluate(read_source("cache_source", "position")) == [
                int(p) for view in views for p in view.positions
            ]
            states = page.evaluate(read_source("cache_source", "state"))
            assert states.count("written") == len(views)
            # The model view: every layer and head's row for this step's token.
            np.testing.assert_allclose(
                np.reshape(page.evaluate(read_source("heads_source", "weight")), (4, 9))[
                    :, : len(steps[position - 1].context_tokens)
                ],
                steps[position - 1].attention.reshape(4, -1),
                atol=1e-6,
            )
        text_boxes.assert_legible(page, minimum_axes=8)


@pytest.mark.tf_only
def test_exported_explorer_switches_layers_and_heads_without_a_kernel(tmp_path, fake_comm):
    import keras

    import keras_attention
    from keras_attention.widgets import AttentionExplorer

    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 8))
    mixed = keras_attention.MultiHeadAttention(4, 2, name="mha")(inputs)
    model = keras.Model(inputs, keras_attention.LuongAttention(name="luong")(mixed))
    x = np.random.default_rng(0).normal(size=(1, 5, 8)).astype("float32")
    tokens = ["a", "b", MALICIOUS, "d", "e"]
    explorer = AttentionExplorer(
        model, x, query_tokens=tokens, targets=np.zeros((1, 5, 8), "float32"), loss="mse"
    )
    explorer.toggle_head("mha", 1)  # exported as masked: every map is the masked model's
    weights = explorer.weights
    rollout, flow = (explorer.select(f"{view} (all layers)") for view in ("rollout", "flow"))
    detail = read_source("detail_source", "weight")

    def shows(matrix):
        expected = json.dumps(np.ravel(matrix).tolist())
        return f"{detail}.every((v, i) => Math.abs(v - {expected}[i]) < 1e-6)"

    with offline_export(tmp_path, explorer, "explorer") as page:
        page.wait_for_function(shows(weights["mha"].mean(axis=0)))
        # Before any hover the bars preview the first query (they were empty, #42).
        page.wait_for_function(f"{read_source('head_view_bars', 'weight')}.length === 5")
        np.testing.assert_allclose(
            bokeh_page.column(page, "head_view_bars", "weight"),
            weights["mha"].mean(axis=0)[0],
            rtol=1e-6,
        )
        assert bokeh_page.selected(page, "detail_source") == []  # nothing dimmed
        selects = page.locator("select")
        selects.nth(1).select_option("3")
        page.wait_for_function(shows(weights["mha"][3]))
        selects.nth(0).select_option("luong")
        page.wait_for_function(shows(weights["luong"][0]))
        # A one-head layer offers head 0 only.
        assert selects.nth(1).locator("option").all_inner_texts() == ["0"]
        assert page.evaluate(read_source("detail_source", "x_token"))[:5] == tokens
        # Model view: a click on a thumbnail selects it as the detail (and outlines it).
        page.mouse.click(*bokeh_page.thumbnail_point(page, 2))  # mha, head 2
        page.wait_for_function(shows(weights["mha"][2]))
        assert bokeh_page.selected(page, "model_view_source") == [2]
        # Head view: hovering query "b" highlights its row and shows its weights as bars ...
        page.mouse.move(*bokeh_page.token_point(page, 1))
        page.wait_for_function(
            f"{json.dumps(list(range(5, 10)))}.join() === "
            "window.Bokeh.documents[0].get_model_by_name('detail_source').selected.indices.join()"
        )
        np.testing.assert_allclose(
            bokeh_page.column(page, "head_view_bars", "weight"), weights["mha"][2][1], rtol=1e-6
        )
        # ... a click on key "d" keeps its column (the weight each query gives it) after the
        # pointer leaves.
        page.mouse.click(*bokeh_page.token_point(page, 3, side="key"))
        page.mouse.move(5, 5)
        page.wait_for_timeout(200)
        assert bokeh_page.selected(page, "detail_source") == [3, 8, 13, 18, 23]
        np.testing.assert_allclose(
            bokeh_page.column(page, "head_view_bars", "weight"), weights["mha"][2][:, 3], rtol=1e-6
        )
        # Another head keeps the focus on that key and redraws its bars.
        selects.nth(1).select_option("0")
        page.wait_for_function(shows(weights["mha"][0]))
        page.wait_for_timeout(200)
        np.testing.assert_allclose(
            bokeh_page.column(page, "head_view_bars", "weight"), weights["mha"][0][:, 3], rtol=1e-6
        )
        # Rollout and flow, computed at export, from the layer select.
        selects.nth(0).select_option("rollout (all layers)")
        page.wait_for_function(shows(rollout))
        assert selects.nth(1).locator("option").all_inner_texts() == ["mean of heads"]
        selects.nth(0).select_option("flow (all layers)")
        page.wait_for_function(shows(flow))
        # The head grid, static: the masked head crossed out, the loss at export in its title.
        assert bokeh_page.column(page, "head_mask_source", "x") == [1]
        title = page.evaluate(f"({bokeh_page.MODEL})('head_importance_figure').title.text")
        assert f"loss {explorer.loss:.4f} (1 head masked" in title
        assert "first-order estimate" in title
        # ... and in the model view (its own map does not show it, #52), with its effect.
        thumbnails = bokeh_page.column(page, "model_view_source", "x")
        assert bokeh_page.column(page, "model_view_mask_source", "x") == [thumbnails[1]]
        effect = page.locator("table.prediction")
        assert effect.count() == 1 and effect.is_visible()
        assert effect.inner_text().split("\n")[0].startswith("unmasked")
        assert page.get_by_text("the maps of the 1 layer after mha (luong) change").is_visible()
        # The light page stays light (the dark sheet applies to a dark page only).
        assert page_colours(page)[0][2:] == ["#000000", "#ffffff"]


# The page and every Bokeh widget's text (selects, their labels, sliders, divs), each
# `[what, element, text colour, background]`: widgets draw in shadow roots, out of the
# page's style.
READ_PAGE_COLOURS = (
    "() => {"
    + _COLOUR_HELPERS
    + r"""
  const out = [["page", "body", rgb(getComputedStyle(document.body).color),
                behind(document.body)]];
  for (const view of Bokeh.index.all_views()) {
    const root = view.el?.shadowRoot;
    if (!root || !view.model || !("stylesheets" in view.model.properties)) continue;
    for (const el of root.querySelectorAll("select, label, .bk-slider-title, .bk-clearfix")) {
      if (!el.getClientRects().length || !el.textContent.trim()) continue;
      out.push([view.model.name || view.model.type, el.tagName.toLowerCase(),
                rgb(getComputedStyle(el).color), behind(el)]);
    }
  }
  return out;
}"""
)


def page_colours(page):
    return page.evaluate(READ_PAGE_COLOURS)


def test_dark_theme_labels_contrast_with_their_background(tmp_path, fake_comm):
    # The head view's token labels were painted black on the dark background (#42); the
    # page and its menus stayed white, and the explorer was 1301 px wide at 1280 (#52).
    import keras

    import keras_attention
    from keras_attention.widgets import AttentionExplorer
    from keras_attention.widgets import DecodingStepper
    from keras_attention.widgets import LiveAttention
    from tests.widgets.fake_translator import FakeTranslator

    inputs = keras.Input((4, 8))
    hidden = keras_attention.MultiHeadAttention(4, 2, name="encoder_block_0_attention")(inputs)
    outputs = keras_attention.MultiHeadAttention(4, 2, name="encoder_block_1_attention")(hidden)
    model = keras.Model(inputs, outputs)
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype("float32")
    explorer = AttentionExplorer(
        model,
        x,
        query_tokens=["il", "a", "m'", "entarté"],
        targets=np.zeros((1, 4, 8), "float32"),
        loss="mse",
    )
    explorer.toggle_head("encoder_block_1_attention", 2)
    stepper = DecodingStepper(FakeTranslator(), "il a m' entarté")
    stepper.next_token()
    live = LiveAttention(model, x, snapshot_dir=None)  # its frame slider
    for name, widget in (("explorer", explorer), ("stepper", stepper), ("live", live)):
        with offline_export(
            tmp_path, widget, f"{name}_dark", color_scheme="dark", width=1280
        ) as page:
            page.wait_for_function(  # the theme callback has run
                "[...Bokeh.documents[0].all_models].some((m) => m.background_fill_color"
                " !== undefined && String(m.background_fill_color) === '#111111')"
            )
            page.wait_for_timeout(300)
            texts = bokeh_page.assert_text_contrasts(page)
            # The page and the menus follow the dark page too, not only the figures.
            colours = page_colours(page)
            # Selects and their labels; the stepper's text; the slider's title.
            expected = {"body", "select", "label"} if name == "explorer" else {"body", "div"}
            assert {c[1] for c in colours} >= expected, colours
            dark = [c for c in colours if bokeh_page.contrast(c[3], "#000000") < 2]
            assert dark == colours, f"light backgrounds on a dark page: {colours}"
            readable = [c for c in colours if bokeh_page.contrast(c[2], c[3]) >= 4.5]
            assert readable == colours, colours
            if name == "explorer":
                assert any(t[:2] == ["head_view_figure", "text glyph"] for t in texts), texts
                # It fits a 1280 px window (the model view and the grid beside it did not).
                widths = page.evaluate(
                    "['model_view_figure', 'head_importance_figure'].map((n) =>"
                    " Bokeh.documents[0].get_model_by_name(n).width)"
                )
                assert sum(widths) > 1280, widths  # too wide for one line: they wrap
                assert page.evaluate("document.documentElement.scrollWidth") <= 1280


def test_exported_long_explorer_shows_each_long_layers_overview(tmp_path, fake_comm):
    import keras

    import keras_attention
    from keras_attention.widgets import AttentionExplorer

    keras.utils.set_random_seed(0)
    inputs = keras.Input((150, 8))
    long = keras_attention.MultiHeadAttention(2, 4, name="long")(inputs)
    model = keras.Model(inputs, keras_attention.MultiHeadAttention(2, 4, name="other")(long))
    x = np.random.default_rng(0).normal(size=(1, 150, 8)).astype("float32")
    explorer = AttentionExplorer(model, x, max_tokens=64)
    # Visible overview figures, by name, as the page draws them.
    shown = (
        "[...Bokeh.index.all_views()].filter((v) => String(v.model.name).startsWith('overview_')"
        " && v.model.visible && v.el.getBoundingClientRect().width > 0).map((v) => v.model.name)"
    )
    with offline_export(tmp_path, explorer, "long_explorer") as page:
        page.wait_for_function(
            f"(() => {{ const s = {shown}; return s.length === 1 && s[0] === 'overview_0'; }})()"
        )
        text_boxes.assert_legible(page, minimum_axes=4)
        page.locator("select").nth(0).select_option("other")
        page.wait_for_function(
            f"(() => {{ const s = {shown}; return s.length === 1 && s[0] === 'overview_1'; }})()"
        )
        # A long rollout: its window and its own overview.
        page.locator("select").nth(0).select_option("rollout (all layers)")
        page.wait_for_function(
            f"(() => {{ const s = {shown}; return s.length === 1 && s[0] === 'overview_2'; }})()"
        )
        text_boxes.assert_legible(page, minimum_axes=4)


@pytest.mark.tf_only
def test_exported_live_attention_replays_every_frame_without_a_kernel(tmp_path, fake_comm):
    import keras

    import keras_attention
    from keras_attention.widgets import LiveAttention

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 4)),
            keras_attention.LuongAttention(score="general", name="self_attention"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x = np.random.default_rng(0).normal(size=(16, 6, 4)).astype("float32")
    live = LiveAttention(
        model,
        x[:2],
        every_n_batches=1,
        min_interval_s=0,
        overhead_budget=1.0,
        snapshot_dir=None,
        color_range="fit",  # as rollout's default: each frame's colours span its values
    )
    model.fit(x, x[:, :, :1].sum(axis=1), batch_size=4, epochs=2, verbose=0, callbacks=[live])
    frames = [matrices["self_attention"] for _, matrices in live.frames]
    assert len(frames) == 1 + live.updates and not np.allclose(frames[0], frames[-1], atol=1e-3)
    weights = read_source("frame_source_self_attention", "weight")
    with offline_export(tmp_path, live, "live") as page:
        for index in (len(frames) - 1, 0, 3):
            if index != len(frames) - 1:
                set_model(page, "frame_slider", "value", index)
            expected = json.dumps(frames[index].ravel().tolist())
            page.wait_for_function(f"{weights}.every((v, i) => Math.abs(v - {expected}[i]) < 1e-6)")
            high = page.evaluate(
                "[...Bokeh.documents[0].all_models].filter((m) => m.type === 'ColorBar')"
                ".map((m) => m.color_mapper.high)"
            )
            assert high == pytest.approx([frames[index].max()]), (index, high)
            if index == len(frames) - 1:  # the longest title: "self_attention · epoch 2 end · loss"
                page.wait_for_timeout(300)
                text_boxes.assert_legible(page, minimum_axes=3)
        # The slider's title ("frame: 3") is not covered by a value bubble over the handle.
        assert page.locator(".bk-slider-title").first.inner_text().startswith("frame")
        assert page.locator(".noUi-tooltip").count() == 0
