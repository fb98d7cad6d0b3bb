"""The API reference site: built with warnings as errors, every public symbol on it."""

import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import pytest

import keras_attention
from keras_attention import _quiet

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]  # translators import on TF only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def every_public_symbol():
    """(module, name, defining path) for each name of each `__all__` in the package."""
    found = []
    modules = ["keras_attention"] + [
        info.name for info in pkgutil.walk_packages(keras_attention.__path__, "keras_attention.")
    ]
    for module_name in modules:
        if module_name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if not inspect.ismodule(value):
                found.append((module_name, name, f"{value.__module__}.{value.__qualname__}"))
    return found


class Site(dict):
    """{page path: HTML}, and `directory`, where the site was built."""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(
        os.environ, PYTHONPATH=path, KERAS_BACKEND="tensorflow", **{_quiet.ENV_VARIABLE: "1"}
    )
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "WARNING" not in result.stderr, result.stderr[-5000:]
    pages = Site()
    pages.directory = str(site_dir)
    for folder, _, files in os.walk(site_dir):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(folder, name)
                pages[os.path.relpath(path, site_dir)] = pathlib.Path(path).read_text(
                    encoding="utf-8"
                )
    return pages


def test_every_public_symbol_has_an_entry(site):
    ids = set()
    for name, page in site.items():
        if name.startswith("api" + os.sep):
            ids |= set(re.findall(r'id="([\w.]+)"', page))
    symbols = every_public_symbol()
    assert len(symbols) > 50
    missing = [f"{module}.{name}" for module, name, path in symbols if path not in ids]
    assert missing == []


def test_guides_are_pages_and_the_readme_is_home(site):
    guides = sorted(
        name for name in os.listdir(os.path.join(ROOT, "docs", "guides")) if name.endswith(".md")
    )
    assert len(guides) >= 5
    for name in guides:
        assert os.path.join("guides", name[:-3] + ".html") in site, name
    home = site["index.html"]
    assert "A 30-second example" in home and "LuongAttention" in home
    assert 'href="guides/long-sequences.html"' in home


def test_each_symbol_is_listed_once_with_a_signature(site):
    for module, _, path in every_public_symbol():
        if module not in ("keras_attention", "keras_attention.models"):
            continue
        page = site[os.path.join("api", module + ".html")]
        assert page.count(f'id="{path}"') == 1, path
    page = site[os.path.join("api", "keras_attention.html")]
    heading = page[
        page.index('id="keras_attention.layers.multi_head_attention.MultiHeadAttention"') :
    ]
    signature = heading[: heading.index("</pre>") if "</pre>" in heading else 5000]
    assert "num_heads" in re.sub(r"<[^>]+>", "", signature), signature[:2000]
    # Types in the parameter lists: from literal defaults where the code has no annotation.
    mha = page[page.index('id="keras_attention.layers.multi_head_attention.MultiHeadAttention"') :]
    mha = mha[
        : mha.index('class="doc doc-object doc-class"')
        if 'class="doc doc-object doc-class"' in mha
        else None
    ]
    for name, type_name in (("use_bias", "bool"), ("dropout", "float"), ("num_heads", None)):
        item = mha[mha.index(f"<b><code>{name}</code></b>") :][:300]
        if type_name:
            assert f'title="{type_name}">{type_name}</span>' in item, item
        else:  # required, no annotation: no guessed type
            assert "title=" not in item.split("</li>")[0], item
    # The sidebar names each symbol once (not also as `keras_attention.X`).
    assert "keras_attention.MultiHeadAttention</a>" not in page


def test_site_needs_no_network(site):
    for name, page in site.items():
        external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?:[^"]+)"', page)
        assert external == [], (name, external)


CHROMIUM_PAGES = ("index.html", "api/keras_attention.html")


def test_pages_fit_a_1280_px_window_and_show_signatures(site, tmp_path_factory):
    widgets_export = pytest.importorskip("keras_attention.widgets.export")
    chromium = widgets_export.find_chromium()
    if chromium is None:
        pytest.skip("no chromium installed (run .ci/install-browser.sh)")
    from playwright.sync_api import sync_playwright

    site_dir = site.directory
    shots = tmp_path_factory.mktemp("screenshots")
    # Served as a site is (the search plugin's worker cannot load from
    # file://, a page error), from this machine only.
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=site_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=list(widgets_export.CHROMIUM_ARGS)
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for name in CHROMIUM_PAGES:
                page.goto(base + name)
                page.screenshot(path=str(shots / (name.replace("/", "_") + ".png")), full_page=True)
                widths = page.evaluate(
                    "[document.documentElement.scrollWidth, document.body.scrollWidth,"
                    " window.innerWidth]"
                )
                assert max(widths[:2]) <= widths[2], (name, widths)
                if name.startswith("api/"):
                    signature = page.locator(
                        '[id="keras_attention.layers.multi_head_attention.MultiHeadAttention"]'
                        ' ~ .doc-signature, [id="keras_attention.layers.multi_head_attention.'
                        'MultiHeadAttention"] + .doc-signature'
                    ).first
                    if signature.count() == 0:
                        signature = page.locator(".doc-signature").first
                    assert signature.is_visible()
                    box = signature.bounding_box()
                    assert box["x"] >= 0 and box["x"] + box["width"] <= 1280, box
                    assert "num_heads" in signature.inner_text()
                    # Every parameter table and code block inside the window.
                    overflowing = page.evaluate(
                        "[...document.querySelectorAll('table, pre')].filter("
                        "e => e.getBoundingClientRect().right > window.innerWidth + 1"
                        " || e.scrollWidth > e.clientWidth + 1).length"
                    )
                    assert overflowing == 0, overflowing
        finally:
            browser.close()
            server.shutdown()
            server.server_close()
