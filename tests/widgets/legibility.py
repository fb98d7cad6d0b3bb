"""What BokehJS painted in a browser page: every label legible and readable.

One check for everything we show: the browser tests (`tests/widgets`) and the
figure generator (`docs/make_figures.py`) call the same functions on a
Playwright page, so a published figure passes exactly what a test asserts.

Bokeh paints tick labels and titles on a canvas, so the DOM has no box for
them. `READ_TEXT_BOXES` asks every axis view of the page for its tick labels
as it paints them (`compute_labels`, placed at the ticks' screen positions
with the axis' standoff, orientation and font, the same steps as
`AxisView._draw_oriented_labels`) and every title view for the size of its
text, and returns what does not fit:

- `overlaps`: two tick labels of one axis whose boxes intersect (only for
  axes that paint every label, Bokeh's default `AllLabels` policy;
  `NoOverlap` drops overlapping labels itself);
- `cut`: a tick label or a title that runs past its figure's canvas;
- `checked`: how many axes and titles were looked at, so a test can tell
  that the page was read at all.

`READ_TEXT_COLOURS` reads the colour of every label, title and text glyph and
the colour painted behind it; `assert_text_contrasts` holds them to a WCAG
contrast ratio (the dark theme's check).

Needs only a Playwright page (`page.evaluate`); nothing here imports Playwright.
"""

READ_TEXT_BOXES = """
() => {
  const out = {overlaps: [], cut: [], checked: {axes: 0, titles: 0, labels: 0}};
  if (!window.Bokeh || !window.Bokeh.index) return out;
  const shown = (view) => {
    for (let v = view; v != null; v = v.parent) {
      if (v.model && v.model.visible === false) return false;
    }
    const el = view.plot_view.canvas_view?.el ?? view.plot_view.el;
    return el != null && el.isConnected && el.getClientRects().length > 0;
  };
  const describe = (view) =>
    `${view.plot_view.model.name || view.plot_view.model.title?.text || "figure"}`;
  const canvasOf = (view) => (view.canvas ?? view.plot_view.canvas_view).bbox;
  const slack = 0.5;
  // How deep two convex quadrilaterals intersect (px; <= 0: apart), by separating axes:
  // rotated labels' bounding boxes overlap where the text itself does not.
  const intersection = (a, b) => {
    let depth = Infinity;
    for (const quad of [a, b]) {
      for (let i = 0; i < 4; i++) {
        const [x0, y0] = quad[i], [x1, y1] = quad[(i + 1) % 4];
        const length = Math.hypot(x1 - x0, y1 - y0);
        if (length === 0) continue;
        const nx = (y0 - y1) / length, ny = (x1 - x0) / length;
        const project = (q) => q.map(([x, y]) => x * nx + y * ny);
        const pa = project(a), pb = project(b);
        const overlap = Math.min(Math.max(...pa), Math.max(...pb))
          - Math.max(Math.min(...pa), Math.min(...pb));
        depth = Math.min(depth, overlap);
      }
    }
    return depth;
  };  // px: anti-aliased edges of neighbouring labels may touch
  for (const view of window.Bokeh.index.all_views()) {
    if (typeof view.compute_labels === "function" && view.tick_coords && view.plot_view) {
      if (!shown(view) || !view.model.major_label_text_font_size) continue;
      const policy = view.model.major_label_policy.constructor.__name__;
      const coords = view.tick_coords.major;
      const ticks = coords[view.dimension];
      if (ticks.length === 0) continue;
      const labels = view.compute_labels(ticks);
      const [sxs, sys] = view.scoords(coords);
      const [nx, ny] = view.normals;
      const standoff = view.model.major_label_standoff;
      const orient = view.model.major_label_orientation;
      const {vertical_align, align} = view.panel.get_label_text_heuristics(orient);
      labels.visuals = view.visuals.major_label_text.values();
      labels.angle = view.panel.get_label_angle_heuristic(orient);
      labels.base_font_size = view.plot_view.base_font_size;
      const boxes = [];
      for (let i = 0; i < labels.length; i++) {
        const label = labels.items[i];
        label.position = {sx: sxs[i] + nx * standoff, sy: sys[i] + ny * standoff,
                          x_anchor: align, y_anchor: vertical_align};
        if ("align" in label) label.align = align;
        const text = String(label.text ?? label._text ?? "");
        const b = label.bbox();
        const {p0, p1, p2, p3} = label.rect();  // the text's rectangle, rotated as painted
        boxes.push({text, left: b.left, right: b.right, top: b.top, bottom: b.bottom,
                    corners: [p0, p1, p2, p3].map((p) => [p.x, p.y])});
      }
      out.checked.axes += 1;
      out.checked.labels += boxes.length;
      const canvas = canvasOf(view);
      // Bokeh shifts the first and last label back inside the canvas; any other that is out is cut.
      for (let i = 1; i < boxes.length - 1; i++) {
        const b = boxes[i];
        if (b.text && (b.left < -slack || b.top < -slack || b.right > canvas.width + slack
                       || b.bottom > canvas.height + slack)) {
          out.cut.push({figure: describe(view), text: b.text, box: b,
                        canvas: [canvas.width, canvas.height]});
        }
      }
      if (policy !== "AllLabels") continue;
      const along = view.dimension === 0 ? (b) => b.left : (b) => b.top;
      const order = boxes.filter((b) => b.text).sort((a, b) => along(a) - along(b));
      for (let i = 1; i < order.length; i++) {
        const a = order[i - 1], b = order[i];
        const depth = intersection(a.corners, b.corners);
        if (depth > slack) {
          out.overlaps.push({figure: describe(view), texts: [a.text, b.text], by: depth});
        }
      }
    } else if (view.model && view.model.constructor.__name__ === "Title" && view.plot_view
               && typeof view._get_size === "function") {
      if (!view.model.text || !shown(view)) continue;
      const size = view._get_size();
      const canvas = canvasOf(view);
      out.checked.titles += 1;
      const horizontal = view.panel.is_horizontal;
      const width = horizontal ? size.width : size.height;
      // Where BokehJS starts the text (TitleView._get_position): from its panel's edge
      // (after the axis and border room), not from the canvas' edge.
      const bbox = view.layout?.bbox;
      const [low, high, room] = horizontal
        ? [bbox?.left ?? 0, bbox?.right ?? canvas.width, canvas.width]
        : [bbox?.top ?? 0, bbox?.bottom ?? canvas.height, canvas.height];
      const align = view.model.align, offset = view.model.offset;
      const start = align === "center" ? (low + high - width) / 2
        : (align === "right") === horizontal ? high - offset - width : low + offset;
      if (start < -slack || start + width > room + slack) {
        out.cut.push({figure: describe(view), text: view.model.text, width, start, room});
      }
    }
  }
  return out;
}
"""


def assert_legible(page, minimum_axes=1):
    """No two tick labels of an axis overlap and no label or title is cut, on the whole page."""
    found = page.evaluate(READ_TEXT_BOXES)
    assert found["checked"]["axes"] >= minimum_axes, found["checked"]
    assert not found["overlaps"], found["overlaps"][:8]
    assert not found["cut"], found["cut"][:8]
    return found["checked"]


def wait_until_drawn(page, timeout_s=60):
    """Waits until the page's Bokeh views stop appearing (every embedded document drawn)."""
    import time

    deadline, last, same = time.monotonic() + timeout_s, -1, 0
    count = "() => window.Bokeh && Bokeh.index ? [...Bokeh.index.all_views()].length : 0"
    while same < 3:
        assert time.monotonic() < deadline, "the page's Bokeh views never settled"
        page.wait_for_timeout(300)
        now = page.evaluate(count)
        same = same + 1 if now == last and now > 0 else 0
        last = now


# Colour helpers both page scripts below start with: `rgb` ("#rrggbb"; an "rgba(...)"'s
# alpha is left out), `up` (an element's parent, crossing Bokeh's shadow roots) and
# `behind` (the first opaque background from an element up: what a transparent figure,
# as in a front end's dark theme, is painted on).
_COLOUR_HELPERS = r"""
  const ctx = document.createElement("canvas").getContext("2d");
  const rgb = (c) => {
    ctx.fillStyle = "#010203";
    ctx.fillStyle = String(c);
    const style = ctx.fillStyle;
    if (style.startsWith("#")) return style;
    const [r, g, b] = style.match(/[\d.]+/g).map(Number);
    return "#" + [r, g, b].map((x) => x.toString(16).padStart(2, "0")).join("");
  };
  const up = (e) => e.parentElement || e.getRootNode().host;
  const behind = (el) => {
    for (let e = el; e; e = up(e)) {
      const c = getComputedStyle(e).backgroundColor;
      if (c && c !== "transparent" && !/^rgba\(.*,\s*0\)$/.test(c)) return rgb(c);
    }
    return "#ffffff";
  };
"""

# Every piece of text a visible figure paints, with the colour it is painted in and the
# colour behind it: `[figure, what, text colour, background]`, colours as "#rrggbb".
READ_TEXT_COLOURS = (
    "() => {"
    + _COLOUR_HELPERS
    + r"""
  const value = (v) => (v !== null && typeof v === "object" && "value" in v ? v.value : v);
  const fill = (c, el) => (c === null || c === undefined ? behind(el) : rgb(c));
  const shown = (view) => {
    for (let v = view; v != null; v = v.parent) if (v.model?.visible === false) return false;
    return view.plot_view.el.isConnected && view.plot_view.el.getClientRects().length > 0;
  };
  const out = [];
  for (const view of Bokeh.index.all_views()) {
    const plot = view.plot_view;
    if (!plot?.model || view === plot || !view.model || !shown(view)) continue;
    const m = view.model, name = plot.model.name || plot.model.title?.text || "figure";
    const inside = fill(plot.model.background_fill_color, plot.el);
    const border = fill(plot.model.border_fill_color, plot.el);
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
)


# Every visible figure whose opaque border fill differs from the page behind it:
# `[figure, fill, page]`. In a dark front end such a figure reads as a box with a frame
# of the page's colour (#42: Voila's output area is lighter than JupyterLab's cell).
READ_FRAMES = (
    "() => {"
    + _COLOUR_HELPERS
    + r"""
  const out = [];
  for (const view of Bokeh.index.all_views()) {  // the figures' own views
    if (!view.model || !("border_fill_color" in view.model.properties)) continue;
    if (!view.el.isConnected || !view.el.getClientRects().length) continue;
    const fill = view.model.border_fill_color;
    if (fill === null || fill === undefined) continue;
    const page = behind(up(view.el));
    if (rgb(fill) !== page) out.push([view.model.title?.text || "figure", rgb(fill), page]);
  }
  return out;
}"""
)


def assert_no_frames(page):
    """No figure paints a background box that differs from the page behind it."""
    framed = page.evaluate(READ_FRAMES)
    assert not framed, f"figures painted as boxes on a different background: {framed}"


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
