"""Real-browser checks of exported files in Debian chromium (the widgets in
JupyterLab, Notebook 7 and Voila are in frontends_test.py).

Skipped only when no chromium is installed (`.ci/install-browser.sh` installs
it). Playwright's own browser download is not used: chromium is launched from
its system path with flags that keep it off the network.
"""

import contextlib

import numpy as np
import pytest

from keras_attention.widgets import export_html
from keras_attention.widgets import figures
from keras_attention.widgets.export import CHROMIUM_ARGS
from keras_attention.widgets.export import find_chromium

CHROMIUM = find_chromium()
MALICIOUS = "<img/src=x/onerror=alert(1)>"  # the slashes make it a valid <img> with onerror

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (run .ci/install-browser.sh)"),
]


@contextlib.contextmanager
def browser_page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS),
                                             headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
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
        page.wait_for_function("window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=30_000)
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
