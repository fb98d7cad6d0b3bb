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


# The contrast check is shared with the figure generator (docs/make_figures.py).
from tests.widgets.legibility import READ_TEXT_COLOURS  # noqa: E402, F401
from tests.widgets.legibility import assert_no_frames  # noqa: E402, F401
from tests.widgets.legibility import assert_text_contrasts  # noqa: E402, F401
from tests.widgets.legibility import contrast  # noqa: E402, F401
