"""Explore the attention of every layer and head of a model."""

import ipywidgets
import numpy as np
from bokeh.layouts import row
from bokeh.models import ColumnDataSource
from bokeh.models import LinearColorMapper
from keras_attention.widgets._component import FreshBokehModel as BokehModel

from keras_attention.layers.capture import attention_layers
from keras_attention.widgets import _captured
from keras_attention.widgets import figures
from keras_attention.widgets._component import Component
from keras_attention.widgets._component import escape

MEAN_OF_HEADS = "mean of heads"


class AttentionExplorer(Component):
    """Dropdowns for layer and head, a detail heatmap and all heads side by side.

    Calls `model(inputs)` once, eagerly, under
    `keras_attention.layers.capture_attention`, and shows one example of the
    batch. Like bertviz's model view, but Keras-native and offline.

    Long sequences stay usable: when a side exceeds `max_tokens`, the detail
    heatmap shows a `max_tokens` window chosen with two sliders (query start,
    key start) at full resolution, next to a block-averaged overview of the
    whole matrix, on which the window is outlined; the window's axes read its
    absolute positions and its colours span its own weights (the colour bar
    shows the range). The small multiples are block-averaged too; a one-head
    layer has none (its head is the detail). `export_html(explorer, path)`
    writes every layer and head to one offline page with working selects.

    Args:
        model: a Keras model (or attention layer) containing keras_attention
            attention layers.
        inputs: what `model` is called with (a layer takes a tuple
            `(query, value[, key])`).
        query_tokens, key_tokens: token strings for the axes, used for every
            layer whose lengths match (positions otherwise). `key_tokens`
            defaults to `query_tokens` (self-attention).
        example: which example of the batch to show.
        max_tokens: largest side drawn cell by cell.

    Attributes:
        widget: the ipywidgets box to display.
        weights: `{layer_name: (H, Tq, Tv)}` of the shown example.
        detail_source: the detail heatmap's `ColumnDataSource`.
    """

    def __init__(self, model, inputs, *, query_tokens=None, key_tokens=None, example=0, max_tokens=64):
        if not hasattr(model, "_flatten_layers") or not attention_layers(model):
            raise ValueError(
                "AttentionExplorer: `model` has no keras_attention attention layers to show. "
                f"Received: {type(model).__name__} '{getattr(model, 'name', model)}'"
            )
        if not isinstance(max_tokens, int) or max_tokens < 2:
            raise ValueError(
                f"AttentionExplorer: `max_tokens` must be an integer >= 2. Received: max_tokens={max_tokens!r}"
            )
        try:
            captured = _captured.call_and_capture(model, inputs)
        except Exception as error:
            raise ValueError(
                f"AttentionExplorer: calling {type(model).__name__} '{model.name}' on `inputs` failed "
                f"({type(error).__name__}: {error}). Received: inputs of shape {_shapes(inputs)}"
            ) from error
        if not captured:
            raise ValueError(
                f"AttentionExplorer: no attention was recorded while calling '{model.name}' "
                "(are the attention layers used in the call?)"
            )
        size = _captured.batch_size(next(iter(captured.values())))
        if not isinstance(example, int) or not 0 <= example < size:
            raise ValueError(
                f"AttentionExplorer: `example` must be in [0, {size}). Received: example={example!r}"
            )
        self.model = model
        self.example = example
        self.max_tokens = max_tokens
        self.query_tokens = query_tokens
        self.key_tokens = key_tokens if key_tokens is not None else query_tokens
        self.weights = {name: _captured.per_head(w, example) for name, w in captured.items()}
        self._build()
        self._show()

    # ----------------------------------------------------------------- build

    def _build(self):
        names = list(self.weights)
        self.layer_choice = ipywidgets.Dropdown(options=names, value=names[0], description="layer")
        self.head_choice = ipywidgets.Dropdown(description="head")
        self.query_start = ipywidgets.IntSlider(min=0, max=0, description="query from")
        self.key_start = ipywidgets.IntSlider(min=0, max=0, description="key from")
        self.info_html = ipywidgets.HTML()
        self.detail_figure = figures.heatmap(np.zeros((1, 1)), title="", width=460, height=420)
        self.detail_source = figures.heatmap_source(self.detail_figure)
        self.detail_source.name = "detail_source"  # found by name in the browser
        self.detail_widget = BokehModel(self.detail_figure)
        self.overview_box = ipywidgets.Box()
        self.overview_figure = None
        self.window_source = None
        self.grid_heading = ipywidgets.HTML("<b>all heads of the layer</b>")
        self.grid_box = ipywidgets.Box(layout=ipywidgets.Layout(overflow="auto", max_height="720px"))
        self._updating = False
        self.layer_choice.observe(self._on_layer, names="value")
        for control in (self.head_choice, self.query_start, self.key_start):
            control.observe(lambda _: self._show_detail(), names="value")
        self.widget = ipywidgets.VBox([
            ipywidgets.HBox([self.layer_choice, self.head_choice]),
            ipywidgets.HBox([self.query_start, self.key_start]),
            self.info_html,
            ipywidgets.HBox([self.detail_widget, self.overview_box]),
            self.grid_heading,
            self.grid_box,
        ])

    # ------------------------------------------------------------- updating

    def select(self, layer, head=MEAN_OF_HEADS):
        """Full `(Tq, Tv)` matrix of a layer and head (or the mean of heads)."""
        heads = self.weights[layer]
        return heads.mean(axis=0) if head == MEAN_OF_HEADS else heads[head]

    def _tokens(self, tokens, length):
        return tokens if tokens is not None and len(tokens) == length else None

    def _on_layer(self, _change):
        self._show()

    def _show(self):
        layer = self.layer_choice.value
        heads = self.weights[layer]
        num_heads, num_queries, num_keys = heads.shape
        self._updating = True
        try:
            self.head_choice.options = [MEAN_OF_HEADS, *range(num_heads)] if num_heads > 1 else [0]
            self.head_choice.value = self.head_choice.options[0]
            long_queries = num_queries > self.max_tokens
            long_keys = num_keys > self.max_tokens
            self.query_start.max = max(0, num_queries - self.max_tokens)
            self.key_start.max = max(0, num_keys - self.max_tokens)
            self.query_start.value = 0
            self.key_start.value = 0
            self.query_start.layout.display = None if long_queries else "none"
            self.key_start.layout.display = None if long_keys else "none"
        finally:
            self._updating = False
        query_tokens = self._tokens(self.query_tokens, num_queries)
        key_tokens = self._tokens(self.key_tokens, num_keys)
        for old in (*self.overview_box.children, *self.grid_box.children):
            old.close()  # frees the comm and the Bokeh document of the previous layer
        if long_queries or long_keys:
            self.overview_figure = figures.image_heatmap(heads.mean(axis=0), title=f"{layer}: overview",
                                                         max_size=self.max_tokens * 2)
            # The window the detail shows, outlined on the overview.
            self.window_source = ColumnDataSource(self._window_data(num_queries, num_keys), name="window_source")
            self.overview_figure.quad(left="left", right="right", top="top", bottom="bottom",
                                      source=self.window_source, fill_alpha=0.0, line_color="#ff3030",
                                      line_width=2)
            self.overview_box.children = [BokehModel(self.overview_figure)]
        else:
            self.overview_figure = self.window_source = None
            self.overview_box.children = []
        # A one-head layer's only head is the detail heatmap already.
        self.grid_box.children = [
            BokehModel(figures.head_grid(heads, key_tokens, query_tokens, ncols=4, max_size=self.max_tokens))
        ] if num_heads > 1 else []
        self.grid_heading.layout.display = None if num_heads > 1 else "none"
        self.info_html.value = (
            f"<b>{escape(layer)}</b>: {num_heads} head(s), {num_queries} queries x {num_keys} keys"
            + (f"; detail shows a {self.max_tokens}-token window" if long_queries or long_keys else "")
        )
        self._show_detail()

    def _show_detail(self):
        if self._updating:
            return
        layer = self.layer_choice.value
        matrix = self.select(layer, self.head_choice.value)
        num_queries, num_keys = matrix.shape
        q0, k0 = self.query_start.value, self.key_start.value
        q1, k1 = min(num_queries, q0 + self.max_tokens), min(num_keys, k0 + self.max_tokens)
        x_labels, y_labels = self._window_labels(layer, q0, q1, k0, k1)
        head = self.head_choice.value
        window = matrix[q0:q1, k0:k1]
        figures.update_heatmap(
            self.detail_figure, window, x_labels, y_labels,
            title=f"{layer}, {head if head == MEAN_OF_HEADS else f'head {head}'}", fit_colors=True,
        )
        if self.window_source is not None:
            self.window_source.data = self._window_data(num_queries, num_keys)

    def _window_data(self, num_queries, num_keys):
        q0, k0 = self.query_start.value, self.key_start.value
        q1, k1 = min(num_queries, q0 + self.max_tokens), min(num_keys, k0 + self.max_tokens)
        return {"left": [k0 - 0.5], "right": [k1 - 0.5], "top": [q0 - 0.5], "bottom": [q1 - 0.5]}

    def standalone_layout(self):
        """A Bokeh document showing every layer and head without a kernel (`export_html`).

        Layer and head selects switch the detail heatmap between the embedded
        matrices (each head and their mean; for long inputs, the window the
        sliders show now), with BokehJS callbacks.
        """
        from bokeh.document import Document
        from bokeh.layouts import column
        from bokeh.models import CustomJS
        from bokeh.models import Select

        frames = {}
        q0, k0 = self.query_start.value, self.key_start.value
        for layer, heads in self.weights.items():
            num_heads, num_queries, num_keys = heads.shape
            q1, k1 = min(num_queries, q0 + self.max_tokens), min(num_keys, k0 + self.max_tokens)
            x_labels, y_labels = self._window_labels(layer, q0, q1, k0, k1)
            window = heads[:, q0:q1, k0:k1].astype("float64")
            frames[layer] = {
                "heads": [head.ravel().tolist() for head in window],
                "mean": window.mean(axis=0).ravel().tolist(),
                "rows": q1 - q0, "cols": k1 - k0, "x_labels": x_labels, "y_labels": y_labels,
            }
        first = next(iter(frames))
        detail = figures.heatmap(np.zeros((1, 1)), title="", width=460, height=420)
        source = figures.heatmap_source(detail)
        source.name = "detail_source"
        layer_select = Select(title="layer", value=first, options=list(frames), name="layer_select")
        head_select = Select(title="head", value=MEAN_OF_HEADS, options=[MEAN_OF_HEADS], name="head_select")
        callback = CustomJS(
            args=dict(frames=frames, layer_select=layer_select, head_select=head_select, source=source,
                      figure=detail, x_axis=detail.xaxis[0], y_axis=detail.yaxis[0],
                      mapper=detail.select_one({"type": LinearColorMapper})),
            code=STANDALONE_JS,
        )
        layer_select.js_on_change("value", callback)
        head_select.js_on_change("value", callback)
        document = Document()
        document.add_root(column(row(layer_select, head_select), detail))
        document.js_on_event("document_ready", callback)
        return document

    def _window_labels(self, layer, q0, q1, k0, k1):
        """Axis labels of a window: tokens where they match the layer, else absolute positions."""
        _, num_queries, num_keys = self.weights[layer].shape
        query_tokens = self._tokens(self.query_tokens, num_queries)
        key_tokens = self._tokens(self.key_tokens, num_keys)
        y_labels = list(query_tokens[q0:q1]) if query_tokens else [str(i) for i in range(q0, q1)]
        x_labels = list(key_tokens[k0:k1]) if key_tokens else [str(i) for i in range(k0, k1)]
        return [str(t) for t in x_labels], [str(t) for t in y_labels]

    @property
    def detail_matrix(self):
        """The matrix the detail heatmap shows now, rebuilt from its data source."""
        data = self.detail_source.data
        rows, cols = max(data["row"]) + 1, max(data["col"]) + 1
        return np.asarray(data["weight"]).reshape(rows, cols)


# Shows the chosen layer and head of an exported explorer. One-head layers
# offer only head 0 (the mean of one head is the same matrix).
STANDALONE_JS = """
const frame = frames[layer_select.value];
const count = frame.heads.length;
const options = count > 1 ? ["mean of heads", ...frame.heads.map((_, h) => String(h))] : ["0"];
if (JSON.stringify(head_select.options) !== JSON.stringify(options)) {
  head_select.options = options;
  if (!options.includes(head_select.value)) { head_select.value = options[0]; return; }  // runs again
}
const mean = head_select.value === "mean of heads";
const flat = mean ? frame.mean : frame.heads[Number(head_select.value)];
const row = [], col = [], x_token = [], y_token = [];
for (let r = 0; r < frame.rows; r++) {
  for (let c = 0; c < frame.cols; c++) {
    row.push(r); col.push(c); x_token.push(frame.x_labels[c]); y_token.push(frame.y_labels[r]);
  }
}
source.data = {row, col, weight: Array.from(flat), x_token, y_token};
// Colours fitted to the shown weights (the colour bar shows the range).
mapper.low = Math.min(0, ...flat); mapper.high = Math.max(mapper.low + 1e-9, ...flat);
figure.x_range.start = -0.5; figure.x_range.end = frame.cols - 0.5;
figure.y_range.start = frame.rows - 0.5; figure.y_range.end = -0.5;
// Every position labelled up to 60, then every n-th (like figures._label_axis).
const ticks = (n) => { const step = n <= 60 ? 1 : Math.ceil(n / 10);
                       return Array.from({length: Math.ceil(n / step)}, (_, i) => i * step); };
x_axis.ticker.ticks = ticks(frame.cols);
y_axis.ticker.ticks = ticks(frame.rows);
x_axis.major_label_overrides = new Map(x_axis.ticker.ticks.map((i) => [i, frame.x_labels[i]]));
y_axis.major_label_overrides = new Map(y_axis.ticker.ticks.map((i) => [i, frame.y_labels[i]]));
figure.title.text = layer_select.value + ", " + (mean ? "mean of heads" : "head " + head_select.value);
"""


def _shapes(inputs):
    if isinstance(inputs, (list, tuple)):
        return [_shapes(x) for x in inputs]
    if isinstance(inputs, dict):
        return {key: _shapes(x) for key, x in inputs.items()}
    return tuple(getattr(inputs, "shape", ())) if hasattr(inputs, "shape") else type(inputs).__name__
