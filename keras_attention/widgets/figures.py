"""Pure figure builders: NumPy arrays in, Bokeh objects out.

The widgets only wire buttons and data sources to these figures, so every
figure can also be used on its own, saved with `export_html` (BokehJS inlined,
no CDN) or `export_png` (headless Debian chromium).

Token text is always drawn as text: axis labels are rendered on the canvas and
hover tooltips use Bokeh's default escaping (never the `{safe}` format), so a
token such as `<img src=x onerror=alert(1)>` shows up literally.
"""

import reprlib

import numpy as np
from bokeh.layouts import gridplot
from bokeh.models import BasicTickFormatter
from bokeh.models import ColorBar
from bokeh.models import ColumnDataSource
from bokeh.models import CustomJS
from bokeh.models import CustomJSTransform
from bokeh.models import FixedTicker
from bokeh.models import HoverTool
from bokeh.models import LinearColorMapper
from bokeh.models import Range1d
from bokeh.models import Segment
from bokeh.models import TapTool
from bokeh.palettes import RdBu11
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from keras_attention import validation

# Negative and positive features of the weighted sum: blue, white at 0, red.
DIVERGING = tuple(reversed(RdBu11))

# Above this many positions on an axis, tick labels would overlap.
MAX_LABELLED_TICKS = 60


def _numbers(values, name, argument):
    """`values` as a float64 array, or a TypeError naming `name` and `argument`
    (NumPy's own "could not convert string to float" names neither)."""
    if values is None or isinstance(values, (str, bytes)):
        ok = False
    else:
        try:
            array = np.asarray(values, dtype="float64")
            ok = True
        except (TypeError, ValueError):
            ok = False
    if not ok:
        raise TypeError(
            f"{name}: `{argument}` must be an array of numbers. "
            f"Received: {argument}={reprlib.repr(values)}"
        )
    return array


def _as_array(values, name, argument, ndim):
    """`values` as a float64 array of `ndim` dimensions, or our error."""
    array = _numbers(values, name, argument)
    if array.ndim != ndim:
        form = "a 2-D array (rows, columns)" if ndim == 2 else "a 1-D array"
        raise ValueError(f"{name}: `{argument}` must be {form}. Received: shape {array.shape}")
    return array


def _as_matrix(weights, name, argument="weights"):
    return _as_array(weights, name, argument, 2)


def _as_vector(values, name, argument="weights"):
    return _as_array(values, name, argument, 1)


_NO_TITLE = object()


def _options(name, title=_NO_TITLE, **sizes):
    """Checks a builder's `title` (a string) and pixel/count options (positive
    integers), naming `name`; returns the sizes as Python ints, in order."""
    if title is not _NO_TITLE and not isinstance(title, str):
        raise TypeError(f"{name}: `title` must be a string. Received: title={title!r}")
    return [validation.validate_positive_int(name, arg, value) for arg, value in sizes.items()]


def _labels(tokens, length, name, argument):
    """Token strings for `length` positions; positions are used when absent."""
    if tokens is None:
        return [str(i) for i in range(length)]
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        # A lone string would label the axis character by character.
        raise TypeError(
            f"{name}: `{argument}` must be a list of token strings or None. "
            f"Received: {argument}={tokens!r}"
        )
    tokens = [str(token) for token in tokens]
    if len(tokens) != length:
        raise ValueError(
            f"{name}: `{argument}` must have one entry per position ({length}). "
            f"Received: {len(tokens)} tokens"
        )
    return tokens


def tick_labels(labels, max_labels=None):
    """`(ticks, overrides)` labelling integer positions with token text.

    Repeated tokens stay distinct (one tick per position). Long axes label
    every n-th position, still with their own text, so a window of positions
    200-263 reads 200..263, not 0..63: at most `max_labels` labels, or
    `MAX_LABELLED_TICKS // 6` beyond `MAX_LABELLED_TICKS` positions by default.
    """
    labels = [str(label) for label in labels]
    if max_labels is None:
        max_labels = len(labels) if len(labels) <= MAX_LABELLED_TICKS else MAX_LABELLED_TICKS // 6
    step = max(1, int(np.ceil(len(labels) / max(int(max_labels), 1))))
    ticks = list(range(0, len(labels), step))
    return ticks, {i: labels[i] for i in ticks}


# Pixels a tick label needs along its axis so that neighbours do not touch (measured
# in the browser, tests/widgets/text_boxes.py): Bokeh's 11 px labels stacked
# (a y axis; a 14 px line box) or at the 0.9 rad slant of the x axes (the line
# box over sin 0.9).
PIXELS_PER_LABEL = 15
PIXELS_PER_SLANTED_LABEL = 19


def labels_that_fit(pixels, slanted=False):
    """How many tick labels an axis of `pixels` holds without overlapping
    (hover shows every token)."""
    return max(2, int(pixels) // (PIXELS_PER_SLANTED_LABEL if slanted else PIXELS_PER_LABEL))


def _label_axis(axis, labels, max_labels=None):
    """Label an axis with `tick_labels` (its FixedTicker is kept, so frames can set its ticks)."""
    ticks, overrides = tick_labels(labels, max_labels)
    if isinstance(axis.ticker, FixedTicker):
        axis.ticker.ticks = ticks
    else:
        axis.ticker = FixedTicker(ticks=ticks)
    axis.major_label_overrides = overrides


def stretch(obj, min_width=None, max_width=None):
    """Let a figure or layout fill the width of its cell (`sizing_mode="stretch_width"`).

    Its designed width becomes its minimum (the tick labels were counted for
    it, so a wider figure only gains room) and `max_width` keeps one panel from
    becoming a banner on a wide screen. Returns `obj`.
    """
    min_width = obj.width if min_width is None else min_width
    obj.sizing_mode = "stretch_width"
    obj.min_width = int(min_width)
    if max_width is not None:
        obj.max_width = int(max(max_width, min_width))
    return obj


def value_range(values, fixed=None):
    """`(start, end)` of a bar chart's value axis: holds every value and 0, 5% margin.

    `fixed=(start, end)` is returned when it holds the values (probabilities
    keep [0, 1]).
    """
    values = np.asarray(values, dtype="float64")
    finite = values[np.isfinite(values)]
    low = min(0.0, float(finite.min())) if finite.size else 0.0
    high = max(0.0, float(finite.max())) if finite.size else 0.0
    if fixed is not None and fixed[0] <= low and high <= fixed[1]:
        return float(fixed[0]), float(fixed[1])
    if high - low < 1e-12:
        return -1.0, 1.0
    margin = 0.05 * (high - low)
    return (low - margin if low < 0 else 0.0), (high + margin if high > 0 else 0.0)


def bar_data(values, tokens, owner="bar_data"):
    """The ColumnDataSource columns of `distribution_bars`: `position`, `weight`, `token`.

    `owner` is the function the user called, which errors name."""
    vector = _as_vector(values, owner)
    labels = _labels(tokens, len(vector), owner, "tokens")
    return {"position": list(range(len(vector))), "weight": vector.tolist(), "token": labels}


def _color_bar(mapper, title, name=None):
    """The colour scale of `mapper`: 8 px wide, `title` along it, ticks as plain
    decimals ("0.003", never Bokeh's default "3.000e-3" for small weights)."""
    return ColorBar(
        formatter=BasicTickFormatter(use_scientific=False),
        color_mapper=mapper,
        width=8,
        title=title,
        title_text_font_size="8pt",
        title_text_font_style="normal",
        name=name,
    )


def _matrix_figure(title, width, height, rows, cols, toolbar=True, **axis_labels):
    """A figure for a `rows` x `cols` matrix: cell `(i, j)` centred at `(j, i)`, row 0
    on top and the columns' axis above, like a matrix written out."""
    return figure(
        title=title,
        width=width,
        height=height,
        x_range=Range1d(-0.5, cols - 0.5),
        y_range=Range1d(rows - 0.5, -0.5),
        tools="pan,wheel_zoom,box_zoom,reset,save" if toolbar else "",
        # Below: above, the toolbar would share (and cover) the title's line.
        toolbar_location="below" if toolbar else None,
        x_axis_location="above",
        **axis_labels,
    )


def heatmap_data(weights, x_tokens=None, y_tokens=None, row_offset=0, owner="heatmap_data"):
    """The ColumnDataSource columns of a heatmap, one entry per cell (row-major).

    Columns: `row`, `col` (cell centres), `weight`, `x_token`, `y_token`.
    `owner` is the function the user called (`heatmap`), which errors name.
    """
    matrix = _as_matrix(weights, owner)
    rows, cols = matrix.shape
    x_labels = _labels(x_tokens, cols, owner, "x_tokens")
    y_labels = _labels(y_tokens, rows, owner, "y_tokens")
    row_index, col_index = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return {
        "row": (row_index.ravel() + row_offset).tolist(),
        "col": col_index.ravel().tolist(),
        "weight": matrix.ravel().tolist(),
        "x_token": [x_labels[c] for c in col_index.ravel()],
        "y_token": [y_labels[r] for r in row_index.ravel()],
    }


def heatmap(
    weights,
    x_tokens=None,
    y_tokens=None,
    *,
    title="Attention weights",
    x_axis_label="key / source",
    y_axis_label="query / output",
    source=None,
    rows=None,
    low=0.0,
    high=1.0,
    width=420,
    height=380,
    color_bar=True,
    color_bar_title="attention weight",
    toolbar=True,
):
    """A heatmap of attention weights, one rectangle per (query, key) cell.

    Args:
        weights: `(Tq, Tv)` array. May have zero rows (a heatmap that grows
            later with `source.stream`).
        x_tokens: `Tv` strings for the columns (key / source positions).
        y_tokens: `Tq` strings for the rows (query / output positions).
        title: figure title.
        source: an existing `ColumnDataSource` to draw (its data is replaced
            with the cells of `weights`).
        rows: number of rows to reserve on the y axis (defaults to `Tq`), so a
            growing heatmap does not rescale at every step.
        low, high: colour scale limits (weights are in [0, 1]).
        width, height: pixels.
        color_bar: draw the colour scale.
        color_bar_title: what the colours mean, written along the colour bar.
        toolbar: show Bokeh's toolbar (pan, zoom, save, hover).

    Returns:
        A Bokeh `figure`; `heatmap_source(fig)` returns its data source.

    Example:

    >>> import numpy as np
    >>> fig = heatmap(np.array([[0.9, 0.1], [0.3, 0.7]]), ["il", "a"], ["he", "has"])
    >>> heatmap_source(fig).data["weight"]
    [0.9, 0.1, 0.3, 0.7]
    >>> heatmap_source(fig).data["y_token"]
    ['he', 'he', 'has', 'has']
    """
    matrix = _as_matrix(weights, "heatmap")
    width, height = _options("heatmap", title, width=width, height=height)
    if rows is not None:
        rows = validation.validate_non_negative_int("heatmap", "rows", rows)
    num_rows, num_cols = matrix.shape
    data = heatmap_data(matrix, x_tokens, y_tokens, owner="heatmap")
    if source is None:
        source = ColumnDataSource(data, name="heatmap_source")
    else:
        source.data = data
    reserved_rows = max(num_rows if rows is None else rows, 1)
    fig = _matrix_figure(
        title,
        width,
        height,
        reserved_rows,
        max(num_cols, 1),
        toolbar,
        x_axis_label=x_axis_label,
        y_axis_label=y_axis_label,
    )
    mapper = LinearColorMapper(palette=Viridis256, low=low, high=high)
    fig.rect(
        x="col",
        y="row",
        width=1,
        height=1,
        source=source,
        fill_color={"field": "weight", "transform": mapper},
        line_color=None,
        name="cells",
    )
    fig.add_tools(
        HoverTool(
            tooltips=[("query", "@y_token"), ("key", "@x_token"), ("weight", "@weight{0.000}")]
        )
    )
    fig.grid.visible = False
    fig.xaxis.major_label_orientation = 0.9
    # As many labels as the plot holds (its frame: the figure less the axes, title and colour bar).
    _label_axis(
        fig.xaxis[0],
        _labels(x_tokens, num_cols, "heatmap", "x_tokens"),
        max_labels=labels_that_fit(width - 70 - (70 if color_bar else 0), slanted=True),
    )
    _label_axis(
        fig.yaxis[0],
        _labels(y_tokens, num_rows, "heatmap", "y_tokens"),
        max_labels=labels_that_fit(height - 90 - (30 if toolbar else 0)),
    )
    if color_bar:
        fig.add_layout(_color_bar(mapper, color_bar_title, name="color_bar"), "right")
    return fig


def heatmap_source(fig):
    """The `ColumnDataSource` behind a figure made by `heatmap`/`image_heatmap`
    (or the bar charts)."""
    return _first_source(fig, "heatmap_source")


def _first_source(fig, _owner):
    """`heatmap_source`, naming `_owner` (the function the user called) in errors."""
    if not hasattr(fig, "renderers") or not hasattr(fig, "xaxis"):
        raise TypeError(
            f"{_owner}: `fig` must be a Bokeh figure made by `heatmap` (or another "
            f"figure builder). Received: fig={reprlib.repr(fig)}"
        )
    if not fig.renderers or not hasattr(fig.renderers[0], "data_source"):
        raise ValueError(
            f"{_owner}: `fig` has no glyph, so no data source: it was not made by a "
            f"figure builder. Received: fig={fig!r} with no renderers"
        )
    # The figure's first glyph (callbacks may reference other sources).
    return fig.renderers[0].data_source


def set_tick_labels(fig, x_tokens=None, y_tokens=None, max_chars=None):
    """Relabel a heatmap's axes (used when a heatmap grows row by row); labels
    longer than `max_chars` are shortened."""
    cut = (lambda t: shorten(t, max_chars)) if max_chars else str
    if x_tokens is not None:
        _label_axis(fig.xaxis[0], [cut(t) for t in x_tokens])
    if y_tokens is not None:
        _label_axis(fig.yaxis[0], [cut(t) for t in y_tokens])


def downsample(weights, max_size, steps=None):
    """Block-mean `weights` so that neither axis exceeds `max_size`.

    Returns `(matrix, row_step, col_step)`; cell `(i, j)` of the result is
    the mean of rows `[i*row_step, (i+1)*row_step)` and the same for columns.
    `steps=(row_step, col_step)` gives the block size instead (so that row
    blocks of one matrix, computed apart, line up).

    >>> import numpy as np
    >>> small, row_step, col_step = downsample(np.arange(16.0).reshape(4, 4), 2)
    >>> small.tolist(), row_step, col_step
    ([[2.5, 4.5], [10.5, 12.5]], 2, 2)
    """
    matrix = _as_matrix(weights, "downsample")
    if not isinstance(max_size, int) or max_size < 1:
        raise ValueError(
            f"downsample: `max_size` must be a positive integer. Received: max_size={max_size!r}"
        )
    rows, cols = matrix.shape
    if steps is None:
        row_step = max(1, int(np.ceil(rows / max_size)))
        col_step = max(1, int(np.ceil(cols / max_size)))
    else:
        row_step, col_step = (max(1, int(step)) for step in steps)
    padded_rows = int(np.ceil(rows / row_step)) * row_step
    padded_cols = int(np.ceil(cols / col_step)) * col_step
    padded = np.full((padded_rows, padded_cols), np.nan)
    padded[:rows, :cols] = matrix
    blocks = padded.reshape(padded_rows // row_step, row_step, padded_cols // col_step, col_step)
    return np.nanmean(blocks, axis=(1, 3)), row_step, col_step


def image_heatmap(
    weights, *, title="Attention overview", max_size=128, width=420, height=380, full_shape=None
):
    """A heatmap for long sequences: one image, block-averaged to `max_size`.

    The axes stay in original positions (a `(4096, 4096)` matrix shown at
    `128 x 128` still reads 0..4096), so the overview can be used to pick a
    window to look at in full detail with `heatmap`.

    `full_shape=(rows, cols)` says that `weights` is already a block mean of
    a `(rows, cols)` matrix (computed blockwise, without ever holding it),
    drawn as is over the original positions.
    """
    matrix = _as_matrix(weights, "image_heatmap")
    max_size, width, height = _options(
        "image_heatmap", title, max_size=max_size, width=width, height=height
    )
    if full_shape is not None and (
        not isinstance(full_shape, (list, tuple))
        or len(full_shape) != 2
        or not all(validation.is_int(n) and n >= 1 for n in full_shape)
    ):
        raise ValueError(
            "image_heatmap: `full_shape` must be None or (rows, cols), two positive "
            f"integers. Received: full_shape={full_shape!r}"
        )
    if full_shape is None:
        rows, cols = matrix.shape
        small, row_step, col_step = downsample(matrix, max_size)
    else:
        rows, cols = (int(n) for n in full_shape)
        small = matrix
        row_step, col_step = (
            int(np.ceil(rows / matrix.shape[0])),
            int(np.ceil(cols / matrix.shape[1])),
        )
    # Image row 0 sits at y=-0.5; with the flipped y range it is drawn on top.
    source = ColumnDataSource(
        {"image": [small], "x": [-0.5], "y": [-0.5], "dw": [cols], "dh": [rows]},
        name="overview_source",
    )
    if row_step > 1 or col_step > 1:
        title = f"{title} ({row_step}x{col_step} block mean)"  # the axes give the full size
    fig = _matrix_figure(title, width, height, rows, cols)
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=float(max(np.nanmax(small), 1e-9)))
    fig.image(image="image", x="x", y="y", dw="dw", dh="dh", source=source, color_mapper=mapper)
    fig.add_layout(_color_bar(mapper, "mean weight"), "right")
    fig.grid.visible = False
    return fig


def distribution_bars(
    weights,
    tokens=None,
    *,
    title="Attention distribution",
    y_axis_label="weight",
    source=None,
    width=420,
    height=220,
    fixed_scale=True,
    color="#3b6ea5",
):
    """Bars over source positions: the attention distribution (or raw scores).

    Args:
        weights: `(Tv,)` array: the softmax distribution, or pre-softmax
            scores with `fixed_scale=False`.
        tokens: `Tv` strings.
        fixed_scale: y axis fixed to [0, 1] (probabilities); otherwise it
            spans the data and 0 (`value_range`; scores can be negative).
    """
    vector = _as_vector(weights, "distribution_bars")
    width, height = _options("distribution_bars", title, width=width, height=height)
    labels = _labels(tokens, len(vector), "distribution_bars", "tokens")
    data = bar_data(vector, labels, owner="distribution_bars")
    if source is None:
        source = ColumnDataSource(data, name="distribution_source")
    else:
        source.data = data
    # A fixed range, set from the data (a widget sets it with each new data).
    low, high = (0.0, 1.0) if fixed_scale else value_range(vector)
    fig = figure(
        title=title,
        width=width,
        height=height,
        x_range=Range1d(-0.5, max(len(vector), 1) - 0.5),
        y_range=Range1d(low, high),
        tools="save",
        toolbar_location=None,
        y_axis_label=y_axis_label,
    )
    fig.vbar(x="position", top="weight", width=0.8, source=source, color=color, name="bars")
    fig.add_tools(HoverTool(tooltips=[("token", "@token"), ("value", "@weight{0.000}")]))
    fig.xgrid.visible = False
    fig.xaxis.major_label_orientation = 0.9
    _label_axis(
        fig.xaxis[0], labels, max_labels=labels_that_fit(width - 80, slanted=True)
    )  # less the y axis
    return fig


CANDIDATE_COLOR = "#e8b090"
CHOSEN_COLOR = "#c03010"


def candidate_bars(
    candidates, *, chosen=None, title="Next-token candidates", source=None, width=300, height=220
):
    """Horizontal bars of the top-k `(token, probability)` candidates, best on top.

    The `chosen` token's bar is drawn in a strong colour, and its row tinted
    (a forced candidate's bar may be too short to see). A tap tool is
    active: selecting a bar sets `source.selected.indices` (the stepper
    forces the tapped candidate).
    """
    candidates = _candidates("candidate_bars", candidates)
    width, height = _options("candidate_bars", title, width=width, height=height)
    if chosen is not None and not isinstance(chosen, str):
        raise TypeError(
            f"candidate_bars: `chosen` must be a token string or None. Received: chosen={chosen!r}"
        )
    data = candidate_data(candidates, chosen)
    if source is None:
        source = ColumnDataSource(data, name="candidate_source")
    else:
        source.data = data
    fig = figure(
        title=title,
        width=width,
        height=height,
        x_range=Range1d(0.0, 1.0),
        y_range=Range1d(max(len(candidates), 1) - 0.5, -0.5),
        tools="tap",
        toolbar_location=None,
        x_axis_label="probability",
    )
    # Each row is a target across the whole panel (invisible, same source): a candidate of
    # p < 0.01 is a 1-3 px bar, too thin to tap or hover.
    rows = fig.hbar(
        y="rank",
        left=0.0,
        right=1.0,
        height=0.9,
        source=source,
        fill_color="color",
        fill_alpha="row_alpha",
        line_alpha=0.0,
        selection_fill_color="color",
        selection_fill_alpha="row_alpha",
        selection_line_alpha=0.0,
        nonselection_fill_color="color",
        nonselection_fill_alpha="row_alpha",
        nonselection_line_alpha=0.0,
        name="candidate_rows",
    )
    fig.hbar(
        y="rank",
        right="probability",
        height=0.7,
        source=source,
        fill_color="color",
        line_color="color",
        name="bars",
        nonselection_fill_alpha=1.0,
        nonselection_line_alpha=1.0,
    )
    fig.add_tools(
        HoverTool(
            tooltips=[("token", "@token"), ("probability", "@probability{0.000}")], renderers=[rows]
        )
    )
    fig.ygrid.visible = False
    _label_axis(fig.yaxis[0], [token for token, _ in candidates])
    return fig


def _candidates(name, candidates):
    """`candidates` as a list of `(token, probability)` pairs (str, float in
    [0, 1]), or our error naming `name`, `candidates` and the bad entry."""
    if isinstance(candidates, (str, bytes)) or not hasattr(candidates, "__iter__"):
        raise TypeError(
            f"{name}: `candidates` must be a list of (token, probability) pairs. "
            f"Received: candidates={candidates!r}"
        )
    pairs = []
    for index, pair in enumerate(candidates):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(
                f"{name}: `candidates` must be a list of (token, probability) pairs. "
                f"Received: candidates[{index}]={pair!r}"
            )
        token, probability = pair
        if not isinstance(token, str):
            raise TypeError(
                f"{name}: each token of `candidates` must be a string. "
                f"Received: candidates[{index}]={pair!r}"
            )
        if not validation.is_real(probability) or not 0.0 <= float(probability) <= 1.0:
            raise ValueError(
                f"{name}: each probability of `candidates` must be a number in [0, 1]. "
                f"Received: candidates[{index}]={pair!r}"
            )
        pairs.append((token, float(probability)))
    return pairs


def candidate_data(candidates, chosen=None):
    """The ColumnDataSource columns of `candidate_bars` (`color` marks `chosen`)."""
    tokens = [str(token) for token, _ in candidates]
    is_chosen = [chosen is not None and t == str(chosen) for t in tokens]
    return {
        "rank": list(range(len(candidates))),
        "token": tokens,
        "probability": [float(p) for _, p in candidates],
        "color": [CHOSEN_COLOR if c else CANDIDATE_COLOR for c in is_chosen],
        # The chosen token's whole row is tinted: a forced candidate of p ~ 0 has no bar to see.
        "row_alpha": [CHOSEN_ROW_ALPHA if c else 0.0 for c in is_chosen],
    }


CHOSEN_ROW_ALPHA = 0.18


def weighted_sum(
    weights, values, tokens=None, *, title="Weighted sum of values", width=520, height=300
):
    """The third stage: each value vector scaled by its weight, and their sum.

    Rows are the source positions (`weights[i] * values[i]`), the last row is
    the attention output `sum_i weights[i] * values[i]`.

    Args:
        weights: `(Tv,)` attention distribution.
        values: `(Tv, dv)` value (encoder hidden state) vectors.
    """
    rows, row_labels = weighted_sum_rows(weights, values, tokens)
    width, height = _options("weighted_sum", title, width=width, height=height)
    limit = float(max(np.abs(rows).max(), 1e-9))
    fig = heatmap(
        rows,
        [str(i) for i in range(rows.shape[1])],
        row_labels,
        title=title,
        x_axis_label="feature",
        y_axis_label="weight x value",
        low=-limit,
        high=limit,
        width=width,
        height=height,
        color_bar_title="weight x value",
        toolbar=False,
    )
    fig.select_one({"type": LinearColorMapper}).palette = DIVERGING
    return fig


def weighted_sum_rows(weights, values, tokens=None):
    """`(rows, row_labels)` of `weighted_sum`: `weights[i] * values[i]` per source position,
    then their sum (the context vector) as the last row."""
    vector = _as_vector(weights, "weighted_sum")
    values = _as_matrix(values, "weighted_sum", "values")
    if values.shape[0] != vector.shape[0]:
        raise ValueError(
            "weighted_sum: `values` must have one row per weight. "
            f"Received: weights shape {vector.shape}, values shape {values.shape}"
        )
    labels = _labels(tokens, len(vector), "weighted_sum", "tokens")
    scaled = vector[:, None] * values
    rows = np.concatenate([scaled, scaled.sum(axis=0, keepdims=True)], axis=0)
    row_labels = [f"{w:.2f} x {t}" for w, t in zip(vector, labels, strict=True)] + ["= context"]
    return rows, row_labels


def head_grid(weights, x_tokens=None, y_tokens=None, *, title="", ncols=4, size=170, max_size=64):
    """Small multiples: one heatmap per head of a `(H, Tq, Tv)` array.

    Heads of long sequences are block-averaged to `max_size` per axis so the
    grid stays light.
    """
    heads = _numbers(weights, "head_grid", "weights")
    ncols, size, max_size = _options("head_grid", title, ncols=ncols, size=size, max_size=max_size)
    if heads.ndim != 3:
        raise ValueError(
            "head_grid: `weights` must be a 3-D array (heads, Tq, Tv). "
            f"Received: shape {heads.shape}"
        )
    # One colour scale for every head (the colour bar closes the grid), so
    # the thumbnails compare; tick labels thinned to what fits a thumbnail.
    high = float(max(np.nanmax(heads), 1e-9)) if heads.size else 1.0
    figures = []
    for index, head in enumerate(heads):
        # A block-mean overview has no tokens to name its cells.
        overview = max(head.shape) > max_size
        fig = heatmap(
            downsample(head, max_size)[0] if overview else head,
            None if overview else x_tokens,
            None if overview else y_tokens,
            title=f"{title}head {index}" + (" (overview)" if overview else ""),
            width=size,
            height=size,
            high=high,
            color_bar=False,
            toolbar=False,
            x_axis_label="",
            y_axis_label="",
        )
        if not overview:
            fig.xaxis.major_label_text_font_size = "7pt"
            fig.yaxis.major_label_text_font_size = "7pt"
            # 7pt labels: a 12 px line box stacked, 15 px along the axis at the x axis' slant.
            _thin_ticks(
                fig.xaxis[0],
                _labels(x_tokens, head.shape[1], "head_grid", "x_tokens"),
                size,
                pixels_per_label=15,
            )
            _thin_ticks(
                fig.yaxis[0],
                _labels(y_tokens, head.shape[0], "head_grid", "y_tokens"),
                size,
                pixels_per_label=12,
            )
        figures.append(fig)
    scale = figure(
        width=90,
        height=size,
        toolbar_location=None,
        min_border_left=0,
        outline_line_color=None,
        title="",
        name="head_grid_scale",
    )
    scale.axis.visible = False
    scale.grid.visible = False
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=high)
    scale.add_layout(_color_bar(mapper, "attention weight", name="grid_color_bar"), "left")
    # An invisible glyph keeps Bokeh from warning about an empty figure.
    scale.scatter([0], [0], alpha=0.0)
    return gridplot(
        [*figures, scale],
        ncols=ncols + 1 if len(figures) <= ncols else ncols,
        toolbar_location=None,
    )


def _thin_ticks(axis, labels, size, pixels_per_label, max_chars=6):
    """Label every n-th position with its token, at most `max_chars` long, so that 7pt
    labels neither overlap nor squeeze a thumbnail's plot to nothing."""
    step = max(1, int(np.ceil(len(labels) * pixels_per_label / max(size - 60, 1))))
    ticks = list(range(0, len(labels), step))
    axis.ticker = FixedTicker(ticks=ticks)
    axis.major_label_overrides = {i: shorten(labels[i], max_chars) for i in ticks}


def shorten(label, max_chars):
    """`label` cut to `max_chars` characters with an ellipsis (hover shows it whole)."""
    label = str(label)
    return label if len(label) <= max_chars else label[: max_chars - 1] + "…"


def update_heatmap(fig, weights, x_tokens=None, y_tokens=None, title=None, fit_colors=False):
    """Show another matrix (any shape) in a figure made by `heatmap`.

    With `fit_colors`, the colour scale spans 0 (or the minimum, if negative)
    to the matrix's maximum, so that a window of small weights is not
    uniformly dark; the colour bar shows the range.
    """
    matrix = _as_matrix(weights, "update_heatmap")
    rows, cols = matrix.shape
    heatmap_source(fig).data = heatmap_data(matrix, x_tokens, y_tokens)
    fig.x_range.start, fig.x_range.end = -0.5, max(cols, 1) - 0.5
    fig.y_range.start, fig.y_range.end = max(rows, 1) - 0.5, -0.5
    set_tick_labels(
        fig,
        _labels(x_tokens, cols, "update_heatmap", "x_tokens"),
        _labels(y_tokens, rows, "update_heatmap", "y_tokens"),
    )
    if title is not None:
        fig.title.text = title
    if fit_colors and matrix.size:
        mapper = fig.select_one({"type": LinearColorMapper})
        mapper.low = min(0.0, float(np.nanmin(matrix)))
        mapper.high = max(float(np.nanmax(matrix)), mapper.low + 1e-9)


# Gap between model-view thumbnails, in thumbnail widths.
THUMBNAIL_GAP = 0.2
SELECTED_COLOR = "#ff3030"


def model_view(
    thumbnails,
    layer_names,
    *,
    size=64,
    max_size=32,
    title="Model view: layer x head (click one)",
    masked=None,
):
    """bertviz's model view: one thumbnail per layer (rows) and head (columns).

    Args:
        thumbnails: one `(H, Tq, Tv)` array per layer (heads may differ per
            layer; long ones are block-averaged to `max_size` per axis).
        layer_names: one name per layer (the row labels).
        size: pixels per thumbnail.
        masked: `None`, or one entry per layer: `None` or an `(H,)` array, 0
            where a head is masked. Masked heads are crossed out
            (`model_view_mask_source`, columns `x`, `y`; `model_view_mask_data`
            gives them).

    All thumbnails share one colour scale (0 to the largest weight), shown by
    the colour bar. A tap tool selects a thumbnail: `model_view_source`
    (found with `model_view_source(fig)`; columns `layer`, `head`, `x`, `y`)
    gets `selected.indices`, and its outline turns red. The images are in a
    second source, so a selection does not dim them.
    """
    size, max_size = _options("model_view", title, size=size, max_size=max_size)
    for argument, value in (("thumbnails", thumbnails), ("layer_names", layer_names)):
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"model_view: `{argument}` must be a list (one entry per layer). "
                f"Received: {argument}={reprlib.repr(value)}"
            )
    if len(thumbnails) != len(layer_names) or not thumbnails:
        raise ValueError(
            "model_view: `thumbnails` and `layer_names` must be non-empty and of the same length. "
            f"Received: {len(thumbnails)} thumbnails, {len(layer_names)} names"
        )
    images, cells, high = _thumbnail_data(thumbnails, layer_names, max_size)
    num_rows = len(thumbnails)
    num_cols = max(np.asarray(t).shape[0] for t in thumbnails)
    span_x, span_y = num_cols * (1 + THUMBNAIL_GAP), num_rows * (1 + THUMBNAIL_GAP)
    fig = figure(
        title=title,
        width=_grid_width(int(num_cols * size * (1 + THUMBNAIL_GAP)) + 110, layer_names, title),
        height=int(num_rows * size * (1 + THUMBNAIL_GAP)) + 70,
        x_range=Range1d(-THUMBNAIL_GAP, span_x),
        y_range=Range1d(span_y, -THUMBNAIL_GAP),
        tools="tap",
        toolbar_location=None,
        x_axis_location="above",
        name="model_view_figure",
    )
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=high)
    fig.image(
        image="image",
        x="x",
        y="y",
        dw="dw",
        dh="dh",
        source=ColumnDataSource(images, name="model_view_images"),
        color_mapper=mapper,
    )
    cells_source = ColumnDataSource(cells, name="model_view_source")
    outlines = fig.rect(
        x="x",
        y="y",
        width=1.0,
        height=1.0,
        source=cells_source,
        fill_alpha=0.0,
        line_alpha=0.0,
        selection_line_color=SELECTED_COLOR,
        selection_line_alpha=1.0,
        selection_line_width=3,
        nonselection_fill_alpha=0.0,
        nonselection_line_alpha=0.0,
        name="thumbnails",
    )
    # "replace": Bokeh's default "toggle" would unselect a thumbnail the mean
    # of heads already outlines.
    fig.select_one({"type": TapTool}).update(renderers=[outlines], mode="replace")
    # No hover tooltip: it would sit under the pointer and take the click (the
    # axes name layer and head).
    fig.grid.visible = False
    _label_layers_and_heads(fig, layer_names, num_cols, pitch=1 + THUMBNAIL_GAP, offset=0.5)
    fig.add_layout(_color_bar(mapper, "attention weight", name="model_view_color_bar"), "right")
    marks = ColumnDataSource(
        model_view_mask_data(thumbnails, masked), name="model_view_mask_source"
    )
    _cross_out_masked_heads(fig, marks, int(size * 0.6), name="model_view_masks")
    return fig


def _thumbnail_data(thumbnails, layer_names, max_size):
    """`(images, cells, high)` of `model_view`: the columns of its image source and of
    its thumbnails' source, and the largest weight shown (its colour scale's top)."""
    images = {"image": [], "x": [], "y": [], "dw": [], "dh": []}
    cells = {"layer": [], "head": [], "x": [], "y": []}
    high = 1e-9
    for row_index, (heads, name) in enumerate(zip(thumbnails, layer_names, strict=True)):
        heads = _numbers(heads, "model_view", f"thumbnails[{row_index}]")
        if heads.ndim != 3:
            raise ValueError(
                f"model_view: each of `thumbnails` must be (heads, Tq, Tv). Received: "
                f"shape {heads.shape} at thumbnails[{row_index}]"
            )
        for head_index, head in enumerate(heads):
            small = downsample(head, max_size)[0] if max(head.shape) > max_size else head
            high = max(high, float(np.nanmax(small)) if small.size else 0.0)
            left, top = head_index * (1 + THUMBNAIL_GAP), row_index * (1 + THUMBNAIL_GAP)
            images["image"].append(small)
            images["x"].append(left)
            images["y"].append(top)
            images["dw"].append(1.0)
            images["dh"].append(1.0)
            cells["layer"].append(str(name))
            cells["head"].append(head_index)
            cells["x"].append(left + 0.5)
            cells["y"].append(top + 0.5)
    return images, cells, high


def _grid_width(grid_pixels, layer_names, title):
    """The width of a layer x head figure: its grid beside the layer names (up to 28
    characters), and no less than its title needs (it starts after the names too)."""
    label_room = 8 * min(28, max(len(str(name)) for name in layer_names))
    return max(grid_pixels + label_room, label_room + 60 + int(7.5 * len(title)))


def _label_layers_and_heads(fig, layer_names, num_heads, pitch=1, offset=0):
    """Names a layer x head grid's columns `head h` and its rows by layer (up to 28
    characters); cell `(layer, head)` is centred at `offset + (head, layer) * pitch`."""
    head_ticks = [h * pitch + offset for h in range(num_heads)]
    layer_ticks = [r * pitch + offset for r in range(len(layer_names))]
    fig.xaxis.ticker = FixedTicker(ticks=head_ticks)
    fig.xaxis.major_label_overrides = {tick: f"head {h}" for h, tick in enumerate(head_ticks)}
    fig.yaxis.ticker = FixedTicker(ticks=layer_ticks)
    fig.yaxis.major_label_overrides = {
        tick: shorten(name, 28) for tick, name in zip(layer_ticks, layer_names, strict=True)
    }


def _cross_out_masked_heads(fig, marks, size, name=None):
    """Draws a red cross at each `(x, y)` of the `marks` source: a masked head's own
    map does not change (its weights are still computed; its output is what is
    dropped), so without a mark nothing shows it."""
    fig.scatter(
        x="x",
        y="y",
        marker="x",
        size=size,
        line_width=3,
        line_color=MASKED_HEAD_COLOR,
        source=marks,
        name=name,
    )


def model_view_mask_data(thumbnails, masked):
    """The columns (`x`, `y`) of `model_view`'s crosses over the masked heads' thumbnails."""
    marks = {"x": [], "y": []}
    if masked is None:
        return marks
    if not isinstance(masked, (list, tuple)) or len(masked) != len(thumbnails):
        raise ValueError(
            "model_view: `masked` must be None or a list with one entry per layer "
            f"({len(thumbnails)}). Received: masked={reprlib.repr(masked)}"
        )
    for row_index, (heads, mask) in enumerate(zip(thumbnails, masked, strict=True)):
        if mask is None:
            continue
        mask = _numbers(mask, "model_view", f"masked[{row_index}]").reshape(-1)
        if len(mask) != np.shape(heads)[0]:
            raise ValueError(
                f"model_view: `masked[{row_index}]` must have one entry per head "
                f"({np.shape(heads)[0]}). Received: {len(mask)} entries"
            )
        for head_index in np.flatnonzero(mask == 0):
            marks["x"].append(int(head_index) * (1 + THUMBNAIL_GAP) + 0.5)
            marks["y"].append(row_index * (1 + THUMBNAIL_GAP) + 0.5)
    return marks


def model_view_source(fig):
    """The `ColumnDataSource` of `model_view`'s thumbnails (`layer`, `head`;
    `selected` is the tap)."""
    return fig.select_one({"name": "model_view_source"})


# The head view's behaviour, in the browser (with or without a kernel): the
# focused token (hovered, else tapped) selects its row (query) or column (key)
# of the heatmap, which highlights those cells and lines, and its weights fill
# the bar chart. `hovered` is set by the code that includes this.
HEAD_VIEW_JS = """
const data = detail.data;
const get = (name) => Array.from(data instanceof Map ? data.get(name) : data[name]);
const rows = get("row"), cols = get("col"), weights = get("weight"),
  x_tokens = get("x_token"), y_tokens = get("y_token");
const num_rows = rows.length ? Math.max(...rows) + 1 : 0,
  num_cols = cols.length ? Math.max(...cols) + 1 : 0;
const chosen = hovered.length ? hovered : tokens.selected.indices;
const tdata = tokens.data;
const sides = Array.from(tdata instanceof Map ? tdata.get("side") : tdata["side"]);
const positions = Array.from(tdata instanceof Map ? tdata.get("position") : tdata["position"]);
// Nothing hovered or clicked: the bars preview the first query, nothing is dimmed.
const preview = !chosen.length;
const focus = preview ? sides.indexOf("query") : chosen[0];
const key = focus + "/" + weights.length + "/" + weights[0] + "/" + weights[weights.length - 1];
if (hovered.length && tokens._ka_last === key) return;  // the same token hovered again: nothing new
tokens._ka_last = key;
if (focus < 0 || focus >= sides.length) {
  detail.selected.indices = [];
  bars.data = {position: [], weight: [], token: []};
  bars_figure.title.text = "hover or click a token";
  return;
}
const is_query = sides[focus] === "query", at = positions[focus];
const picked = [];
for (let i = 0; i < weights.length; i++) {
  if ((is_query ? rows[i] : cols[i]) === at) picked.push(i);
}
detail.selected.indices = preview ? [] : picked;
const position = picked.map((i) => is_query ? cols[i] : rows[i]);
const labels = picked.map((i) => is_query ? x_tokens[i] : y_tokens[i]);
bars.data = {position, weight: picked.map((i) => weights[i]), token: labels};
bars_figure.x_range.start = -0.5; bars_figure.x_range.end = Math.max(position.length, 1) - 0.5;
bars_figure.y_range.start = 0;
bars_figure.y_range.end = Math.max(1e-9, ...picked.map((i) => weights[i])) * 1.05;
const step = position.length <= 30 ? 1 : Math.ceil(position.length / 10);
bars_axis.ticker.ticks = position.filter((_, i) => i % step === 0);
// Labels cut to 10 characters (hover shows the whole token), so they leave the bars room.
const cut = (t, n) => { t = String(t); return t.length <= n ? t : t.slice(0, n - 1) + "…"; };
bars_axis.major_label_overrides = new Map(
  position.filter((_, i) => i % step === 0).map((p, i) => [p, cut(labels[i * step], 10)])
);
const label = is_query ? y_tokens[picked[0]] : x_tokens[picked[0]];
bars_figure.title.text = (is_query ? "query " : "key ") + JSON.stringify(cut(label, 14)) +
  (is_query ? ": weights over keys" : ": weight from each query");
"""


def head_view(detail_figure, *, width=300, height=420):
    """bertviz's head view of the matrix a `heatmap` figure shows, and a bar chart.

    Queries are listed on the left, keys on the right, joined by one line
    per weight (opacity: the weight over the largest). Hovering or clicking a
    token highlights its lines and its row (query) or column (key) of the
    heatmap, and the bars show its weights. It all runs in BokehJS (no
    kernel), reading the heatmap's own data source, so it follows whatever
    the heatmap shows; the token labels are in `token_source` (columns
    `side`, `position`, `token`, `x`, `align`), which the owner keeps in step
    with the heatmap (`head_view_tokens`).

    Returns `(view_figure, bars_figure, token_source)`.
    """
    width, height = _options("head_view", width=width, height=height)
    detail = _heatmap_cells(detail_figure)
    rows = max(detail.data["row"], default=-1) + 1
    cols = max(detail.data["col"], default=-1) + 1
    layout = head_view_layout(rows, cols, height)
    view = figure(
        title="Head view: hover or click a token",
        width=width,
        height=layout["height"],
        x_range=Range1d(-2.1, 3.1),
        y_range=Range1d(*layout["y_range"]),
        tools="tap",
        toolbar_location=None,
        name="head_view_figure",
    )
    view.axis.visible = False
    view.grid.visible = False
    view.title.text_font_size = "9pt"
    _draw_head_view_lines(view, detail)
    token_source = ColumnDataSource(head_view_tokens([], []), name="head_view_tokens")
    boxes = _draw_head_view_tokens(view, token_source)
    view.select_one({"type": TapTool}).update(renderers=[boxes], mode="replace")
    bars = ColumnDataSource({"position": [], "weight": [], "token": []}, name="head_view_bars")
    bars_figure = _head_view_bars_figure(bars, width)
    # Non-selected heatmap cells are dimmed, so a focused token's row/column stands out.
    cells = detail_figure.select_one({"name": "cells"})
    cells.nonselection_glyph = cells.glyph.clone(fill_alpha=0.25)
    arguments = dict(
        detail=detail,
        tokens=token_source,
        bars=bars,
        bars_figure=bars_figure,
        bars_axis=bars_figure.xaxis[0],
    )
    # Named: a document shown before its first change runs it at document_ready
    # (`redraw_head_view_when_ready`), so the bars are there before any hover.
    on_change = CustomJS(
        args=arguments, code="const hovered = [];\n" + HEAD_VIEW_JS, name=HEAD_VIEW_REDRAW
    )
    on_hover = CustomJS(
        args=arguments, code="const hovered = cb_data.index.indices;\n" + HEAD_VIEW_JS
    )
    view.add_tools(HoverTool(renderers=[boxes], tooltips=None, callback=on_hover))
    token_source.selected.js_on_change("indices", on_change)
    # A new matrix arrives as new data, or (live widgets send only what changed) as a patch.
    for source in (token_source, detail):
        source.js_on_change("data", on_change)
        source.js_on_change("patching", on_change)
    return view, bars_figure, token_source


def _heatmap_cells(detail_figure):
    """The data source of a `heatmap` figure, or `head_view`'s error."""
    if hasattr(detail_figure, "renderers") and not detail_figure.renderers:
        raise ValueError(
            "head_view: `detail_figure` must be a figure made by `heatmap`. "
            f"Received: detail_figure={detail_figure!r} with no renderers"
        )
    if not hasattr(detail_figure, "renderers"):
        raise TypeError(
            "head_view: `detail_figure` must be a figure made by `heatmap`. "
            f"Received: detail_figure={reprlib.repr(detail_figure)}"
        )
    detail = _first_source(detail_figure, "head_view")
    missing = {"row", "col", "weight", "x_token", "y_token"} - set(detail.data)
    if missing:
        raise ValueError(
            "head_view: `detail_figure` must be a figure made by `heatmap` (its data "
            f"source has the columns row, col, weight, x_token, y_token). Received: "
            f"detail_figure whose source lacks {sorted(missing)}"
        )
    return detail


def _draw_head_view_lines(view, detail):
    """One line per cell of the heatmap's source `detail`: query `row` on the left, key
    `col` on the right, as opaque as the weight over the largest."""
    ends = dict(x0=0.0, y0="row", x1=1.0, y1="col")
    opacity = CustomJSTransform(
        v_func="const m = Math.max(1e-12, ...xs); return xs.map((x) => 0.9 * x / m);"
    )
    weight_alpha = {"field": "weight", "transform": opacity}
    lines = view.segment(
        **ends,
        source=detail,
        line_color="#3b6ea5",
        line_width=2,
        line_alpha=weight_alpha,
        name="head_view_lines",
    )
    lines.selection_glyph = Segment(
        **ends, line_color=SELECTED_COLOR, line_width=2.5, line_alpha=weight_alpha
    )
    lines.nonselection_glyph = Segment(**ends, line_color="#3b6ea5", line_alpha=0.04)


def _draw_head_view_tokens(view, token_source):
    """The tokens' labels and, behind them, the boxes that hover and taps light up
    (returned: the tap and hover tools act on them)."""
    boxes = view.rect(
        x="x",
        y="position",
        width=1.1,
        height=0.9,
        source=token_source,
        fill_color="#ffb060",
        fill_alpha=0.0,
        line_alpha=0.0,
        selection_fill_alpha=0.7,
        selection_line_alpha=0.0,
        nonselection_fill_alpha=0.0,
        nonselection_line_alpha=0.0,
        hover_fill_alpha=0.35,
        hover_fill_color="#ffb060",
        hover_line_alpha=0.0,
        name="head_view_boxes",
    )
    view.text(
        x="text_x",
        y="position",
        text="token",
        text_align="align",
        text_baseline="middle",
        source=token_source,
        text_font_size="9pt",
        # Bokeh's text grey, not the glyph's default black: the page theme swaps it in dark.
        text_color="#444444",
        nonselection_text_alpha=1.0,
    )
    return boxes


def _head_view_bars_figure(bars, width):
    """The head view's bar chart of `bars`: the weights of the focused token."""
    bars_figure = figure(
        title="hover or click a token",
        width=width,
        height=200,
        x_range=Range1d(-0.5, 0.5),
        y_range=Range1d(0, 1),
        tools="",
        toolbar_location=None,
        y_axis_label="weight",
        name="head_view_bars_figure",
    )
    bars_figure.title.text_font_size = "9pt"
    bars_figure.vbar(x="position", top="weight", width=0.8, source=bars, color=SELECTED_COLOR)
    bars_figure.add_tools(HoverTool(tooltips=[("token", "@token"), ("weight", "@weight{0.000}")]))
    bars_figure.xaxis.ticker = FixedTicker(ticks=[])
    bars_figure.xaxis.major_label_orientation = 0.9
    bars_figure.xgrid.visible = False
    return bars_figure


HEAD_VIEW_REDRAW = "head_view_redraw"


def redraw_head_view_when_ready(document):
    """Draw the head views of `document` (their bars) when the page has drawn it.

    The views redraw on every change of their data; a document whose data was
    set before it was shown (a live widget's first frame) has no change to
    react to, and its bar panel stayed empty until the first hover.
    """
    for root in document.roots:
        for callback in root.select({"type": CustomJS, "name": HEAD_VIEW_REDRAW}):
            document.js_on_event("document_ready", callback)


# Pixels per token row of the head view (bertviz grows the view the same way),
# so that 9pt labels never overlap.
HEAD_VIEW_ROW_PX = 15


def head_view_layout(num_queries, num_keys, min_height=420):
    """What the head view's figure needs to show `num_queries` x `num_keys` tokens:
    `{"y_range": (start, end), "height": pixels}`, one row per token.

    Set with the token data (`head_view_tokens`) each time the matrix changes,
    also before the view is first drawn: a range left at the initial 1x1 draws
    one label per side and lines running off the panel.
    """
    span = max(int(num_queries), int(num_keys), 1)
    return {
        "y_range": (span - 0.5, -0.5),
        "height": max(int(min_height), span * HEAD_VIEW_ROW_PX + 60),
    }


def head_view_tokens(query_tokens, key_tokens):
    """`head_view`'s token columns: queries on the left (x=0), keys on the right (x=1)."""
    query_tokens, key_tokens = [str(t) for t in query_tokens], [str(t) for t in key_tokens]
    return {
        "side": ["query"] * len(query_tokens) + ["key"] * len(key_tokens),
        "position": list(range(len(query_tokens))) + list(range(len(key_tokens))),
        "token": [shorten(t, 10) for t in query_tokens + key_tokens],
        "x": [-0.55] * len(query_tokens) + [1.55] * len(key_tokens),
        # A gap between labels and lines: 3-4 digit labels ran into the line block.
        "text_x": [-0.15] * len(query_tokens) + [1.15] * len(key_tokens),
        "align": ["right"] * len(query_tokens) + ["left"] * len(key_tokens),
    }


MASKED_HEAD_COLOR = "#ff3030"
# Cells of heads whose importance is unknown (no loss given).
UNKNOWN_IMPORTANCE_COLOR = "#9a9a9a"


def head_importance_grid(
    importance,
    layer_names,
    masked=None,
    *,
    title="Head importance: click a head to mask it",
    color_bar_title="importance",
):
    """A layer (rows) x head (columns) grid of head importance; masked heads crossed out.

    Args:
        importance: one `(H,)` array of scores per layer (heads may differ
            per layer; NaN: unknown, drawn grey).
        layer_names: one name per layer (the row labels).
        masked: one `(H,)` array per layer, 0 where a head is masked (its
            cell gets a cross); default: none masked.
        title: figure title.
        color_bar_title: what the colours mean, written along the colour bar.

    A tap selects a cell of `head_importance_source` (columns `layer`,
    `head`, `x`, `y`, `importance`); the crosses are `head_mask_source`'s
    (`x`, `y`). `head_importance_data` gives both sources' columns.

    Returns:
        A Bokeh `figure` named `head_importance_figure`.
    """
    for argument, value in (("title", title), ("color_bar_title", color_bar_title)):
        if not isinstance(value, str):
            raise TypeError(
                f"head_importance_grid: `{argument}` must be a string. "
                f"Received: {argument}={value!r}"
            )
    cells, marks = head_importance_data(importance, layer_names, masked)
    num_rows = len(layer_names)
    num_cols = max(len(np.atleast_1d(s)) for s in importance)
    size = 34
    fig = figure(
        title=title,
        width=_grid_width(num_cols * size + 130, layer_names, title),
        # Room for the colour bar's ticks beside a grid of one or two layers.
        height=max(num_rows * size + 80, 170),
        x_range=Range1d(-0.5, num_cols - 0.5),
        y_range=Range1d(num_rows - 0.5, -0.5),
        tools="tap",
        toolbar_location=None,
        x_axis_location="above",
        name="head_importance_figure",
    )
    known = [v for v in cells["importance"] if np.isfinite(v)]
    mapper = LinearColorMapper(
        palette=Viridis256,
        low=0.0,
        high=max(known, default=1.0) or 1.0,
        nan_color=UNKNOWN_IMPORTANCE_COLOR,
    )
    source = ColumnDataSource(cells, name="head_importance_source")
    rects = fig.rect(
        x="x",
        y="y",
        width=0.92,
        height=0.92,
        source=source,
        fill_color={"field": "importance", "transform": mapper},
        line_color=None,
        # A tap selects a cell only to tell the owner; nothing is dimmed.
        nonselection_fill_alpha=1.0,
        selection_fill_alpha=1.0,
        name="head_importance_cells",
    )
    fig.select_one({"type": TapTool}).update(renderers=[rects], mode="replace")
    _cross_out_masked_heads(fig, ColumnDataSource(marks, name="head_mask_source"), int(size * 0.7))
    fig.grid.visible = False
    _label_layers_and_heads(fig, layer_names, num_cols)
    fig.xaxis.major_label_orientation = 0.9 if num_cols > 4 else 0.0
    if known:
        fig.add_layout(
            _color_bar(mapper, color_bar_title, name="head_importance_color_bar"), "right"
        )
    return fig


def head_importance_data(importance, layer_names, masked=None):
    """`(cells, marks)`: the columns of `head_importance_grid`'s two sources."""
    if not isinstance(importance, (list, tuple)) or len(importance) != len(layer_names):
        raise ValueError(
            "head_importance_grid: `importance` must be a list with one array per layer "
            f"({len(layer_names)}). Received: importance={reprlib.repr(importance)}"
        )
    cells = {"layer": [], "head": [], "x": [], "y": [], "importance": []}
    marks = {"x": [], "y": []}
    for row, (scores, name) in enumerate(zip(importance, layer_names, strict=True)):
        scores = np.atleast_1d(_numbers(scores, "head_importance_grid", f"importance[{row}]"))
        mask = np.ones(len(scores)) if masked is None else np.asarray(masked[row], "float64")
        for head, score in enumerate(scores):
            cells["layer"].append(str(name))
            cells["head"].append(head)
            cells["x"].append(head)
            cells["y"].append(row)
            cells["importance"].append(float(score))
            if mask[head] == 0:
                marks["x"].append(head)
                marks["y"].append(row)
    return cells, marks
