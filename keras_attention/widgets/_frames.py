"""Frames: every state of a view computed in Python, swapped into Bokeh models.

A view (the stepper's panels, the explorer's detail, LiveAttention's
heatmaps) is drawn by one pure function that returns a *frame*:

    {"data": {model_key: {column: [...]}},       # columns that replace the source's
     "props": {model_key: {attribute: value}}}

`models` maps each key to a Bokeh model (a data source, a range, a title,
an axis, a ticker, a colour mapper, a figure). The live widget applies the
frame it needs in Python (`apply_frame`); an export embeds every frame and
`swap_frame_callback` shows the one its controls point at. Ranges, titles
and tick labels are properties of the frame, set with its data, so the two
paths cannot disagree and the page holds no view logic.
"""

from bokeh.models import CustomJS
from bokeh.models import LinearColorMapper
from bokeh.models import Slider

# Looks up the frame named by the controls' values ("v0|v1|..."), then sets
# every data source and property it lists. A plain object in "props" is a
# map (tick-label overrides); Bokeh sends maps with string keys as objects.
SWAP_FRAME_JS = """
const key = controls.map((control) => String(control.value)).join("|");
const frame = frames instanceof Map ? frames.get(key) : frames[key];
if (frame === undefined) return;
const entries = (o) => (o instanceof Map ? [...o.entries()] : Object.entries(o));
for (const [name, data] of entries(frame.data)) {  // the columns given replace those of the source
  models[name].data = Object.fromEntries([...entries(models[name].data), ...entries(data)]);
}
for (const [name, attributes] of entries(frame.props)) {
  for (const [attribute, value] of entries(attributes)) {
    const plain = value !== null && typeof value === "object" && !Array.isArray(value)
      && !(value instanceof Map);
    models[name][attribute] = plain
      ? new Map(entries(value).map(([k, v]) => [Number(k), v]))
      : value;
  }
}
"""


# The models of a figure that a frame may set, by the suffix of their key.
FIGURE_PARTS = {
    "figure": lambda fig: fig,
    "title": lambda fig: fig.title,
    "x_range": lambda fig: fig.x_range,
    "y_range": lambda fig: fig.y_range,
    "x_axis": lambda fig: fig.xaxis[0],
    "y_axis": lambda fig: fig.yaxis[0],
    "x_ticker": lambda fig: fig.xaxis[0].ticker,
    "y_ticker": lambda fig: fig.yaxis[0].ticker,
    "mapper": lambda fig: fig.select_one({"type": LinearColorMapper}),
}


def figure_models(key, fig, parts):
    """`{f"{key}_{part}": model}` for each of `parts` (names in `FIGURE_PARTS`) of
    `fig`: the entries of `models` through which frames set its range, title, ticks..."""
    return {f"{key}_{part}": FIGURE_PARTS[part](fig) for part in parts}


def frame_key(*values):
    """The key of a frame: the controls' values as the page reads them (`String(value)`)."""
    return "|".join(str(value) for value in values)


def swap_frame_callback(models, frames, controls):
    """A `CustomJS` showing `frames[frame_key(*control values)]` in `models`.

    Attach it to each control's `value` and to the document's
    `document_ready` event (the first frame is then drawn on opening).
    """
    return CustomJS(
        args=dict(models=models, frames=frames, controls=list(controls)),
        code=SWAP_FRAME_JS,
        name="swap_frame",
    )


def frame_slider(first, last, title, name):
    """The Bokeh `Slider` of an export, over frames `first..last` and at `last`;
    disabled when there is one frame (its range is then one wider: Bokeh needs
    `end > start`)."""
    return Slider(
        start=first,
        end=max(last, first + 1),
        value=last,
        step=1,
        title=title,
        name=name,
        width=400,
        disabled=last == first,
        tooltips=False,  # the title shows the value; a bubble covered the title
    )


def apply_frame(models, frame):
    """Show `frame` in a live document: only what changed goes over the widget comm."""
    for name, data in frame["data"].items():
        set_data(models[name], data)
    for name, attributes in frame["props"].items():
        model = models[name]
        for attribute, value in attributes.items():
            if getattr(model, attribute) != value:
                setattr(model, attribute, value)


def set_data(source, data):
    """Give `source` these columns (the others are kept), sent as a patch (same
    length) or a stream (rows appended) when that says the same with fewer bytes."""
    old = source.data
    if set(data) <= set(old):
        old_length = len(next(iter(old.values()), []))
        new_length = len(next(iter(data.values()), []))
        if new_length == old_length:
            changed = {k: list(data[k]) for k in data if list(old[k]) != list(data[k])}
            if changed and new_length:
                source.patch({k: [(slice(0, new_length), v)] for k, v in changed.items()})
            return
        if (
            set(data) == set(old)
            and new_length > old_length
            and all(list(old[k]) == list(data[k][:old_length]) for k in data)
        ):
            source.stream({k: list(data[k][old_length:]) for k in data})
            return
    source.data = {**{k: list(v) for k, v in old.items()}, **{k: list(v) for k, v in data.items()}}
