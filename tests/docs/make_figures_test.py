"""The figure generator's checks, on one small figure (the whole `make figures` run
trains models and serves a notebook in Voila for about two minutes: not part of
`make test`). What a published page shows is listed in tests/docs/published_figures_test.py."""

import os

import numpy as np
import pytest

from keras_attention.widgets.export import CHROMIUM_ARGS
from keras_attention.widgets.export import find_chromium
from tests.docs.published_figures_test import make_figures

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium installed (run .ci/install-browser.sh)"
)


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()


@pytest.mark.parametrize("title", ["Attention", "a title far longer than its heatmap " * 3])
def test_a_figure_is_saved_only_when_its_page_is_legible(page, tmp_path, title):
    from keras_attention.widgets import export_html
    from keras_attention.widgets import heatmap

    generator = make_figures()
    tokens = ["il", "a", "m'", "entarté"]
    figure = heatmap(np.eye(4), tokens, tokens, title=title, width=320, height=300)
    page.goto("file://" + export_html(figure, str(tmp_path / "figure.html")))
    page.evaluate("document.body.classList.add('figure-heatmap')")
    shot = generator.Shot("figure.png", "heatmap", width=640)
    if len(title) > 20:
        with pytest.raises(SystemExit, match="illegible at 640 px.*far longer"):
            generator.shoot(page, [shot], str(tmp_path))
        assert not (tmp_path / "figure.png").exists()
        return
    generator.shoot(page, [shot], str(tmp_path))
    from PIL import Image

    with Image.open(tmp_path / "figure.png") as saved:
        mode, width = saved.mode, saved.width
    assert mode == "P" and os.path.getsize(tmp_path / "figure.png") <= generator.MAX_BYTES
    # Cropped to what the 320 px figure paints (the page's white margin gone), and a margin.
    assert 280 <= width <= 320 + 2 * 8, width
