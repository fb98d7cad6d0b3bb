"""Save figures as standalone HTML (BokehJS inlined) or PNG (headless chromium)."""

import os
import shutil
import subprocess
import tempfile

from bokeh.core.templates import get_env
from bokeh.document import Document
from bokeh.embed import file_html
from bokeh.models import InlineStyleSheet
from bokeh.models import LayoutDOM
from bokeh.models.widgets import Widget
from bokeh.resources import INLINE

from keras_attention import validation
from keras_attention.widgets import _theme

# Where Debian's `chromium` package puts the browser; `KERAS_ATTENTION_CHROMIUM` overrides.
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Flags that keep a headless chromium from reaching the network or a sandbox it
# cannot create inside containers.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


# An exported page in a dark browser: the page itself, not only its figures (which
# `_theme` repaints), goes dark. Bokeh's own page is white and its template has no hook for it.
PAGE_TEMPLATE = get_env().from_string(
    """{% extends "file.html.jinja" %}
{% block preamble %}<style>
  :root { color-scheme: light dark; }
  @media (prefers-color-scheme: dark) {
    html, body { background-color: #111111; color: #d4d4d4; }
  }
</style>{% endblock %}"""
)

# Bokeh's widgets (selects, sliders, text) draw in shadow roots with colours fixed on
# `:host`, so the page's style cannot reach them: each gets this sheet in an export.
DARK_WIDGETS_CSS = """
@media (prefers-color-scheme: dark) {
  :host {
    color-scheme: dark;
    --color: #d4d4d4;
    --background-color: #1e1e1e;
    --hover-color: #2a2a2a;
    --border-color: #6a6a6a;
    --divider-color: #4a4a4a;
    --surface-background-color: #2a2a2a;
    --disabled-background-color: #2a2a2a;
    --disabled-color: #9a9a9a;
    --inactive-bg: #2a2a2a;
    --inverted-color: #111111;
    color: var(--color);
  }
  select:not([multiple]).bk-input, select:not([size]).bk-input {
    background-image: LIGHT_ARROW;
  }
}
"""
# Bokeh's select arrow, light on a dark select (Bokeh's own is black).
_LIGHT_ARROW = (
    'url(\'data:image/svg+xml;utf8,<svg version="1.1" viewBox="0 0 25 20" '
    'xmlns="http://www.w3.org/2000/svg"><path d="M 0,0 25,0 12.5,20 Z" '
    'fill="%23d4d4d4" /></svg>\')'
)
DARK_WIDGETS_CSS = DARK_WIDGETS_CSS.replace("LIGHT_ARROW", _LIGHT_ARROW)
DARK_WIDGETS_NAME = "follow_dark_page"


def export_html(obj, path, title="keras-attention"):
    """Write a Bokeh object, or a widget, to a standalone HTML file that works offline.

    BokehJS is inlined (no CDN), so the file opens without network access or
    a kernel. A widget (`DecodingStepper`, `AttentionExplorer`,
    `LiveAttention`) is exported through its `standalone_layout()`: every
    decoding step / layer and head / recorded frame is embedded, and its
    controls (Bokeh sliders and selects with JavaScript callbacks) still work.
    The page follows the browser's light or dark setting (`prefers-color-scheme`):
    its background, its figures and its controls. Returns the path.
    """
    path = _check_path("export_html", path)
    if not isinstance(title, str):
        raise TypeError(f"export_html: `title` must be a string. Received: title={title!r}")
    if hasattr(obj, "standalone_layout"):
        obj = obj.standalone_layout()
    if not isinstance(obj, (LayoutDOM, Document)):
        raise TypeError(
            "export_html: `obj` must be a Bokeh layout or figure, or a keras_attention widget. "
            f"Received: {type(obj).__name__}"
        )
    if isinstance(obj, LayoutDOM) and obj.document is None:
        Document().add_root(obj)
    document = obj if isinstance(obj, Document) else obj.document
    if document is not None and document.roots:
        # Light or dark as the browser that opens the file prefers.
        _theme.follow_page_theme(document, document.roots[0])
        _follow_dark_page(document)
    html = file_html(obj, resources=INLINE, title=title, template=PAGE_TEMPLATE)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(html)
    return path


def _follow_dark_page(document):
    """Give every Bokeh widget of `document` the dark sheet (once: an export may repeat)."""
    sheet = None
    for model in list(document.models):
        if not isinstance(model, Widget):
            continue
        if any(getattr(s, "name", None) == DARK_WIDGETS_NAME for s in model.stylesheets):
            continue
        if sheet is None:
            sheet = InlineStyleSheet(css=DARK_WIDGETS_CSS, name=DARK_WIDGETS_NAME)
        model.stylesheets = [*model.stylesheets, sheet]


def _check_path(owner, path):
    """`path` as a str, or our error: an int would be taken by `open` as a file
    descriptor (written to and closed: `1` is stdout), None gives `open`'s
    TypeError naming neither the function nor the argument."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{owner}: `path` must be a file path (str or os.PathLike); file "
            f"descriptors are not accepted. Received: path={path!r}"
        )
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path or os.path.isdir(path):
        raise ValueError(
            f"{owner}: `path` must name a file to write, not "
            f"{'a directory' if path else 'an empty string'}. Received: path={path!r}"
        )
    return path


def find_chromium():
    """Path of a chromium executable, or `None`.

    Checks `$KERAS_ATTENTION_CHROMIUM`, then `chromium` (Debian:
    `apt-get install chromium`) and common alternatives on `$PATH`.
    """
    override = os.environ.get("KERAS_ATTENTION_CHROMIUM")
    if override:
        return override if os.path.exists(override) else None
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def export_png(obj, path, width=900, height=700, chromium=None, timeout_s=60):
    """Render a Bokeh object to PNG with headless chromium (optional dependency).

    Needs a chromium browser (Debian: `apt-get install chromium`); no selenium
    or webdriver. The figure is first exported to standalone HTML, then
    chromium screenshots it after BokehJS has drawn.

    Raises:
        RuntimeError: no chromium was found, or it failed.
    """
    path = _check_path("export_png", path)
    if not isinstance(obj, (LayoutDOM, Document)) and not hasattr(obj, "standalone_layout"):
        raise TypeError(
            "export_png: `obj` must be a Bokeh layout or figure, or a keras_attention widget. "
            f"Received: {type(obj).__name__}"
        )
    width = validation.validate_positive_int("export_png", "width", width)
    height = validation.validate_positive_int("export_png", "height", height)
    timeout_s = validation.validate_real(
        "export_png", "timeout_s", timeout_s, low=0, include_low=False
    )
    if chromium is not None and not isinstance(chromium, (str, os.PathLike)):
        raise TypeError(
            "export_png: `chromium` must be the path of a chromium executable or None. "
            f"Received: chromium={chromium!r}"
        )
    browser = chromium or find_chromium()
    if browser is None:
        raise RuntimeError(
            "export_png needs a chromium browser (Debian: `apt-get install chromium`, or set "
            "KERAS_ATTENTION_CHROMIUM to its path). Use export_html to save without a browser."
        )
    with tempfile.TemporaryDirectory(prefix="keras_attention_png_") as workdir:
        page = export_html(obj, os.path.join(workdir, "figure.html"))
        command = [
            browser,
            "--headless",
            *CHROMIUM_ARGS,
            "--hide-scrollbars",
            f"--user-data-dir={os.path.join(workdir, 'profile')}",
            f"--window-size={int(width)},{int(height)}",
            # Lets BokehJS finish drawing before the screenshot is taken.
            "--virtual-time-budget=5000",
            f"--screenshot={os.path.abspath(path)}",
            "file://" + page,
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0 or not os.path.exists(path):
        raise RuntimeError(
            f"export_png: chromium failed (exit {result.returncode}): {result.stderr[-2000:]}"
        )
    return path
