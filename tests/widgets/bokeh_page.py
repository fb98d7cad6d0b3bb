"""Finding Bokeh figures in a browser page, to click and hover them like a user."""

# `[name, x, y]` -> page coordinates of data point (x, y) of the newest figure named `name`.
POINT_OF = """([name, x, y]) => {
  const views = [];
  const walk = (v) => {
    if (v.model.name === name) views.push(v);
    for (const c of (v.child_views ?? [])) walk(c);
  };
  for (const root of window.Bokeh.index) walk(root);
  if (!views.length) return null;
  const view = views[views.length - 1];
  const rect = view.canvas_view.el.getBoundingClientRect();
  return [rect.left + view.frame.x_scale.compute(x), rect.top + view.frame.y_scale.compute(y)];
}"""

SCROLL_TO = POINT_OF.replace("([name, x, y])", "(name)").replace(
    "const rect = view.canvas_view.el.getBoundingClientRect();",
    "view.el.scrollIntoView({block: 'center'}); return null;",
)

# `name` -> the newest Bokeh model with that name (documents are searched newest first).
MODEL = """(name) => {
  const docs = window.Bokeh.documents;
  for (let i = docs.length - 1; i >= 0; i--) {
    const m = docs[i].get_model_by_name(name);
    if (m) return m;
  }
  return null;
}"""


def point_of(page, figure_name, x, y):
    """Page coordinates of a data point of a figure, after scrolling it into view."""
    page.evaluate(SCROLL_TO, figure_name)
    page.wait_for_timeout(100)
    point = page.evaluate(POINT_OF, [figure_name, x, y])
    assert point is not None, f"no figure named {figure_name!r} is drawn"
    return point


def column(page, source_name, name):
    """A column of the newest data source called `source_name`, as a list."""
    return page.evaluate(
        f"([source, name]) => {{ const s = ({MODEL})(source); const d = s.data;"
        " return Array.from(d instanceof Map ? d.get(name) : d[name]); }",
        [source_name, name],
    )


def selected(page, source_name):
    return page.evaluate(f"(source) => Array.from(({MODEL})(source).selected.indices)", source_name)


def thumbnail_point(page, index):
    """Page coordinates of the centre of model-view thumbnail `index` (its source's x, y)."""
    x, y = (
        column(page, "model_view_source", "x")[index],
        column(page, "model_view_source", "y")[index],
    )
    return point_of(page, "model_view_figure", x, y)


def token_point(page, position, side="query"):
    """Page coordinates of a head-view token (queries at x=-0.55, keys at x=1.55)."""
    return point_of(page, "head_view_figure", -0.55 if side == "query" else 1.55, position)


# Every piece of text a visible figure paints, with the colour it is painted in and the
# colour behind it: `[figure, what, text colour, background]`, colours as "#rrggbb".
READ_TEXT_COLOURS = r"""() => {
  const ctx = document.createElement("canvas").getContext("2d");
  const rgb = (c) => {  // "#rrggbb" (the alpha of an "rgba(...)" is left out)
    ctx.fillStyle = "#010203";
    ctx.fillStyle = String(c);
    const style = ctx.fillStyle;
    if (style.startsWith("#")) return style;
    const [r, g, b] = style.match(/[\d.]+/g).map(Number);
    return "#" + [r, g, b].map((x) => x.toString(16).padStart(2, "0")).join("");
  };
  const value = (v) => (v !== null && typeof v === "object" && "value" in v ? v.value : v);
  const shown = (view) => {
    for (let v = view; v != null; v = v.parent) if (v.model?.visible === false) return false;
    return view.plot_view.el.isConnected && view.plot_view.el.getClientRects().length > 0;
  };
  const out = [];
  for (const view of Bokeh.index.all_views()) {
    const plot = view.plot_view;
    if (!plot?.model || view === plot || !view.model || !shown(view)) continue;
    const m = view.model, name = plot.model.name || plot.model.title?.text || "figure";
    const inside = rgb(plot.model.background_fill_color);
    const border = rgb(plot.model.border_fill_color);
    if (view.glyph && "text_color" in m.glyph.properties && view.glyph.data_size > 0) {
      out.push([name, "text glyph", rgb(value(m.glyph.text_color)), inside]);
    }
    if ("major_label_text_color" in m.properties) {
      out.push([name, `${m.type} labels`, rgb(m.major_label_text_color), border]);
    }
    if ("axis_label_text_color" in m.properties && m.axis_label) {
      out.push([name, "axis label", rgb(m.axis_label_text_color), border]);
    }
    if (m.type === "Title" && m.text) out.push([name, "title", rgb(m.text_color), border]);
  }
  return out;
}"""


def contrast(foreground, background):
    """WCAG 2 contrast ratio of two "#rrggbb" colours (1 to 21)."""

    def luminance(colour):
        channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    high, low = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def assert_text_contrasts(page, minimum=3.0):
    """Every label, title and text glyph painted at WCAG contrast `minimum` or more
    (3:1 is WCAG's level for large text and graphics: our 9-10pt labels need at least that)."""
    texts = page.evaluate(READ_TEXT_COLOURS)
    assert texts, "no text painted by Bokeh in the page"
    low = [(*t, round(contrast(t[2], t[3]), 2)) for t in texts if contrast(t[2], t[3]) < minimum]
    assert not low, f"text below {minimum}:1 contrast: {low}"
    return texts
