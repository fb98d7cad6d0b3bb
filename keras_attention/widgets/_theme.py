"""Bokeh figures that follow the page's light or dark theme.

Bokeh paints on canvases with colours of its own, so in JupyterLab's dark
theme every figure stayed a white card. `follow_page_theme(document, root)`
attaches one generic callback to the document's `document_ready` event. It
reads the page's theme (JupyterLab and Notebook 7 mark `<body>` with
`data-jp-theme-light`; elsewhere, e.g. an exported file, the browser's
`prefers-color-scheme`) and gives the chrome of every model (plot and border
backgrounds, outlines, axes, ticks, grid lines, titles, colour bars, text
glyphs left at Bokeh's default grey) the theme's colours, taken from
JupyterLab's CSS variables where the page has them. Only properties still at
Bokeh's light default change, and the original values come back in the light
theme, so colours a figure set on purpose (the palettes, the bars) stay. A
theme switched later repaints (a `MutationObserver` on `<body>`). Figures are
transparent (their white fills removed in Python, before anything is drawn)
and stay so in a front end's dark theme, so every figure sits on the front
end's own background; an exported file gets opaque dark fills (its page is
white). Opaque fills left thin grey frames (the antialiased edge of the first,
white paint) and, on Voila's lighter output area, boxes of uneven width.
"""

from bokeh.models import CustomJS

FOLLOW_THEME_JS = """
const doc = root.document;
const body = document.body;
const dark = () => body.dataset.jpThemeLight !== undefined ? body.dataset.jpThemeLight === "false"
  : window.matchMedia("(prefers-color-scheme: dark)").matches;
const css = (name, fallback) => getComputedStyle(body).getPropertyValue(name).trim() || fallback;
const originals = (window.__kaThemeOriginals ??= new WeakMap());
const apply = () => {
  // Figures come transparent (see follow_page_theme) and stay so in a front end's dark
  // theme: each front end puts the widget on its own background (Voila's output area is
  // lighter than JupyterLab's cell). An exported file's page is Bokeh's plain white one:
  // there dark fills are opaque.
  const on = dark(), text = css("--jp-ui-font-color1", "#d4d4d4"),
    back = body.dataset.jpThemeLight !== undefined ? null : "#111111";
  const colours = {background_fill_color: [null, back], border_fill_color: [null, back],
    outline_line_color: ["#e5e5e5", back], grid_line_color: ["#e5e5e5", "#2e2e2e"],
    axis_line_color: ["black", "#9a9a9a"], major_tick_line_color: ["black", "#9a9a9a"],
    minor_tick_line_color: ["black", "#9a9a9a"], major_label_text_color: ["#444444", text],
    axis_label_text_color: ["#444444", text], title_text_color: ["#444444", text],
    text_color: ["#444444", text]};
  for (const model of doc.all_models) {
    const saved = originals.get(model) ?? {};
    for (const [name, [light, themed]] of Object.entries(colours)) {
      if (!(name in model.properties)) continue;
      const value = model[name], plain = value?.value !== undefined ? value.value : value;
      const wrap = (v) => (value?.value !== undefined ? {...value, value: v} : v);
      if (on && String(plain).toLowerCase() === String(light)) {
        saved[name] = value; model[name] = wrap(themed);
      }
      else if (!on && name in saved) { model[name] = saved[name]; delete saved[name]; }
    }
    originals.set(model, saved);
  }
};
apply();
new MutationObserver(apply).observe(body,
  {attributes: true, attributeFilter: ["data-jp-theme-light"]});
"""


CALLBACK_NAME = "follow_page_theme"


def follow_page_theme(document, root):
    """Make every figure of `document` follow the page's light/dark theme
    (`root`: one of its models).

    Once per document: a document exported twice, or wrapped in a widget and
    exported, keeps one callback (two would observe the page twice).
    """
    # Transparent instead of Bokeh's white fills (the same on a white page): an opaque
    # fill painted before the theme callback ran left its antialiased edge (a quarter of
    # a pixel of white) on the canvas after the callback changed it, a thin grey frame
    # around every panel in dark (#42), and an opaque dark fill showed as boxes of uneven
    # width on Voila's lighter background.
    for model in document.models:
        for name in ("background_fill_color", "border_fill_color"):
            value = getattr(model, name, None)
            if isinstance(value, str) and value.lower() in ("#ffffff", "white"):
                setattr(model, name, None)
    callbacks = document.callbacks.js_event_callbacks.get("document_ready", [])
    if any(getattr(callback, "name", None) == CALLBACK_NAME for callback in callbacks):
        return
    document.js_on_event(
        "document_ready", CustomJS(args=dict(root=root), code=FOLLOW_THEME_JS, name=CALLBACK_NAME)
    )
