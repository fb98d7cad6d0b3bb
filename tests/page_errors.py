"""Every browser page a test opens fails the test on a page error or a BokehJS error.

`tests/conftest.py` wraps Playwright's `new_page` (of a browser and of a
context), so this holds for every browser test without each one asking:
an uncaught exception in the page (BokehJS' "Size mismatch" was one, while
the data sources held the right rows) or an error BokehJS logs is reported
at the end of the test that opened the page.

Jupyter's own noise is not ours and is not counted: console errors of
front-end extensions that fail to load in Voila, of fonts and MathJax
fetched from CDNs that the offline test machine cannot reach, and the two
start-up exceptions of Notebook 7 listed below.
"""

# Uncaught in Notebook 7's own start-up in our test environment (its extensions are
# built for other JupyterLab versions), on every page, with or without a widget.
JUPYTER_PAGE_ERRORS = (
    "Cannot read properties of undefined (reading 'schema')",
    "Command 'filebrowser:open-path' not registered.",
)

# Logged by BokehJS with its "[bokeh x.y.z]" prefix, at warning level, when a
# source's columns disagree in length: rows are then drawn from stale indices.
BOKEH_DATA_WARNINGS = ("columns of inconsistent lengths",)


def _is_bokeh(message):
    text = message.text
    return "[bokeh" in text or "bokeh" in (message.location or {}).get("url", "").rsplit("/", 1)[-1]


# Errors not yet reported, of every watched page: the test running reports them.
_unreported = []


def watch(page):
    """Records `page`'s errors (in `page.page_errors` and for `take()`)."""
    page.page_errors = []

    def record(text):
        page.page_errors.append(text)
        _unreported.append(f"{_url(page)}: {text}")

    def on_console(message):
        if message.type == "error" and _is_bokeh(message):
            record(f"BokehJS console error: {message.text}")
        elif message.type == "warning" and any(w in message.text for w in BOKEH_DATA_WARNINGS):
            record(f"BokehJS warning: {message.text}")

    page.on("console", on_console)

    def on_page_error(error):
        if str(error) not in JUPYTER_PAGE_ERRORS or "bokeh" in (error.stack or "").lower():
            record(f"page error: {error}")

    page.on("pageerror", on_page_error)
    return page


def take():
    """The errors recorded since the last call."""
    errors = list(_unreported)
    _unreported.clear()
    return errors


def _url(page):
    try:
        return page.url
    except Exception:  # a closed page
        return "(closed page)"
