"""Explore the attention of every layer and head of a model."""

import inspect
import types

import ipywidgets
import keras
import numpy as np
from bokeh.layouts import column
from bokeh.layouts import row
from bokeh.models import ColumnDataSource
from bokeh.models import LinearColorMapper

from keras_attention import analysis
from keras_attention import validation
from keras_attention.layers.machinery.capture import attention_layers
from keras_attention.widgets import _captured
from keras_attention.widgets import _frames
from keras_attention.widgets import figures
from keras_attention.widgets._component import Component
from keras_attention.widgets._component import FreshBokehModel as BokehModel
from keras_attention.widgets._component import escape

MEAN_OF_HEADS = "mean of heads"
# The layer menu's entries for attention rollout and flow across the layers.
ROLLOUT = "rollout (all layers)"
FLOW = "flow (all layers)"
# Flow solves L * L maximum-flow problems: offered up to this many tokens (~1 s at 24).
FLOW_MAX_TOKENS = 32
# Rollout multiplies (L, L) matrices, once per head option (an export computes them all).
ROLLOUT_MAX_TOKENS = 1024

# Key lengths from which `scores_on_demand="auto"` stops capturing full weights.
ON_DEMAND_FROM = 4096
# Block means per axis of the overview computed with scores on demand.
SUMMARY_SIZE = 128
# The detail heatmap's (width, height) in pixels (taller beside a tall head view).
DETAIL_SIZE = (460, 440)
# The head view's bar chart, under the detail heatmap.
BARS_HEIGHT = 200
# The head grid's title and colour bar: its scores estimate, they do not measure.
IMPORTANCE_TITLE = "Head importance (first-order estimate): click a head to mask it"
IMPORTANCE_LEGEND = "importance (estimate)"


class AttentionExplorer(Component):
    """Every layer and head of a model: model view, detail heatmap, head view.

    Calls `model(inputs)` once, eagerly, under
    `keras_attention.layers.capture_attention`, and shows one example of the
    batch. What bertviz offers, Keras-native, offline and for long inputs:

    - a **model view**: every layer (rows) x head (columns) as a thumbnail,
      one colour scale with its colour bar; clicking a thumbnail selects it
      as the detail (so do the layer and head dropdowns);
    - the **detail heatmap** of the selected layer and head (or the mean of
      the heads), titled with both, colours fitted to the weights shown;
    - a **head view** next to it: queries on the left, keys on the right,
      one line per weight; hovering or clicking a token highlights its row
      (query) or column (key) of the heatmap and its lines, and bars show its
      weights. It runs in BokehJS, so it works without a kernel too.

    Long sequences: when a side exceeds `max_tokens`, the detail shows a
    `max_tokens` window chosen with two sliders (query start, key start) at
    full resolution, next to a block-averaged overview of the whole matrix
    on which the window is outlined; the window's axes read its absolute
    positions and its colours span its own weights (the colour bar shows the
    range). A one-head layer has no "mean of heads" (it would be the same
    matrix), and a model with a single head has no model view.

    **Scores on demand** (a `keras_attention.MultiHeadAttention` layer, or
    any layer whose call takes `attention_scores_heads`, given as `model`
    with `inputs` = query or `(query, value[, key])`): the full `(Tq, Tv)`
    weights are never formed. Each window asks the layer for the rows it
    shows (`return_attention_scores=True, attention_scores_heads=...` on the
    window's query rows: `O(heads x rows x Tv)` memory, exact softmax over
    all keys), and the overview and thumbnails are block means computed
    blockwise, `rows_per_call` query rows at a time. `"auto"` does this from
    key length `ON_DEMAND_FROM` (4096). The layer is called as given, without
    masks (a model's masks apply in the captured mode). A 16384-token input then needs
    ~`heads x rows_per_call x 16384 x 4` bytes at a time instead of
    `heads x 16384^2 x 4` (8 GiB for 8 heads).

    **Rollout and flow** (Abnar & Zuidema, 2020; `keras_attention.analysis`):
    when the model has two or more self-attention layers over the same tokens,
    the layer menu also offers `"rollout (all layers)"` and `"flow (all
    layers)"` (rollout up to `ROLLOUT_MAX_TOKENS` = 1024 tokens, flow up to
    `FLOW_MAX_TOKENS` = 32), drawn like a layer:
    which input token each output token draws on through the whole stack,
    computed from the captured weights of those layers, taken as stacked in
    the order they were called. The head menu then picks the heads every layer
    contributes (their mean, or head `h` of each layer; flow: the mean).
    Each is computed when first shown (seconds for long inputs and deep
    stacks); the line above the detail says so meanwhile.

    **Head importance and masking** (Michel et al., 2019): when the model has
    `keras_attention.MultiHeadAttention` layers, a layer x head grid is shown
    under the model view. Clicking a head (or `toggle_head(layer, head)`)
    masks it (crossed out in the grid and in the model view; click again to
    unmask): the model is called again with those heads masked
    (`analysis.masking_heads`) and every map, rollout and flow included,
    shows the masked model's attention. A mask drops a head's output, not its
    weights: its own layer's map does not change, the maps of the layers after
    it, the output and the loss do (a head of the last layer changes no map at
    all). The widget says which maps changed and shows the model's output for
    the shown example unmasked beside masked (class scores: the top class per
    position and its score). Given `targets` (and a `loss`, or a model
    compiled with one), the cells are coloured by `analysis.head_importance`
    on `(inputs, targets)`, a first-order estimate at the unmasked model, and
    the loss of the masked model is shown next to the unmasked one with the
    measured change (which can differ from the estimate, even in sign).
    Without `targets` the cells are grey (importance unknown) and no loss is
    shown; masking still redraws the maps and the output.

    `export_html(explorer, path)` writes every layer and head (the window
    the sliders show now, for long inputs), rollout and flow included, to one
    offline page whose model view, selects and head view work without a
    kernel. The importance grid is exported as a static picture of the
    values at export (the masks then in force, the loss in its title, the
    output unmasked and masked under it): masking needs the kernel. The page
    fits a 1280 px window (panels wrap) and follows the browser's light or
    dark setting.

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
        scores_on_demand: `"auto"`, `True` or `False` (see above).
        rows_per_call: query rows per layer call when scores are computed on
            demand.
        targets: what the model should output for `inputs` (as `y` in
            `fit`); with it the head grid shows importance and the loss.
        loss: a Keras loss (name, `keras.losses.Loss` or function
            `(y_true, y_pred)`); default: the loss the model was compiled
            with.

    Attributes:
        widget: the ipywidgets box to display.
        weights: `{layer_name: (H, Tq, Tv)}` of the shown example (`None`
            with scores on demand).
        shapes: `{layer_name: (H, Tq, Tv)}`.
        detail_source: the detail heatmap's `ColumnDataSource`.
        model_view_source: the thumbnails' source (`layer`, `head`;
            `selected.indices` is the selected thumbnail).
        token_source: the head view's tokens (`selected.indices` is the
            clicked token).
        head_masks: `{layer path: (H,) 0/1 array}` of the
            `MultiHeadAttention` layers (`{}` when there are none).
        importance: `{layer path: (H,) scores}`, or `None` without `targets`.
        loss, baseline_loss: the loss with the current masks and without
            any (`None` without `targets`).
        output, baseline_output: the model's (first) output for the shown
            example with the current masks and without any (`None` until a
            head is first masked).
        importance_source: the head grid's cells (`layer`, `head`,
            `importance`; a click selects one), or `None` without a grid.
    """

    def __init__(
        self,
        model,
        inputs,
        *,
        query_tokens=None,
        key_tokens=None,
        example=0,
        max_tokens=64,
        scores_on_demand="auto",
        rows_per_call=256,
        targets=None,
        loss=None,
    ):
        if not isinstance(model, keras.layers.Layer) or not attention_layers(model):
            raise ValueError(
                "AttentionExplorer: `model` has no keras_attention attention layers to show. "
                f"Received: {type(model).__name__} '{getattr(model, 'name', model)}'"
            )
        if not validation.is_int(max_tokens) or max_tokens < 2:
            raise ValueError(
                "AttentionExplorer: `max_tokens` must be an integer >= 2. "
                f"Received: max_tokens={max_tokens!r}"
            )
        if scores_on_demand not in ("auto", True, False):
            raise ValueError(
                "AttentionExplorer: `scores_on_demand` must be 'auto', True or False. "
                f"Received: scores_on_demand={scores_on_demand!r}"
            )
        if not validation.is_int(rows_per_call) or rows_per_call < 1:
            raise ValueError(
                "AttentionExplorer: `rows_per_call` must be a positive integer. "
                f"Received: rows_per_call={rows_per_call!r}"
            )
        query_tokens = validation.validate_tokens("AttentionExplorer", "query_tokens", query_tokens)
        key_tokens = validation.validate_tokens("AttentionExplorer", "key_tokens", key_tokens)
        example = validation.validate_non_negative_int("AttentionExplorer", "example", example)
        max_tokens, rows_per_call = int(max_tokens), int(rows_per_call)
        loss_function = _loss_function(model, targets, loss)
        self.model = model
        self.inputs = inputs
        self.targets = targets
        self.example = example
        self.max_tokens = max_tokens
        self.query_tokens = query_tokens
        self.key_tokens = key_tokens if key_tokens is not None else query_tokens
        on_demand = _use_scores_on_demand(model, inputs, scores_on_demand)
        if on_demand:
            self._source = _OnDemandWeights(model, inputs, example, rows_per_call)
            self.weights = None
        else:
            self._source = _CapturedWeights(model, inputs, example)
            self.weights = self._source.weights
        self.shapes = self._source.shapes
        # The self-attention layers rollout and flow combine ([] without views).
        self._stacked = [] if on_demand else _captured.stacked_self_attention(self.shapes)
        self._views = {}  # (view, head) -> (L, L), computed when first shown
        self.head_masks = {} if on_demand else _maskable_heads(model)
        if loss_function is not None and not self.head_masks:
            raise ValueError(
                "AttentionExplorer: `targets` and `loss` score the heads of "
                "keras_attention.MultiHeadAttention layers, and `model` has none"
                + (" (or its scores are computed on demand)" if on_demand else "")
                + f". Received: {type(model).__name__} '{model.name}'"
            )
        self._loss_function = loss_function
        self.importance = self.loss = self.baseline_loss = None
        # The model's output for the shown example, unmasked (computed when first needed)
        # and with the current masks.
        self.baseline_output = self.output = None
        if loss_function is not None:
            self.importance = analysis.head_importance(model, [(inputs, targets)], loss_function)
            self.loss = self.baseline_loss = self._masked_loss()
        self._build()
        self._show()

    # ----------------------------------------------------------------- build

    def _build(self):
        names = self._menu()
        self.layer_choice = ipywidgets.Dropdown(options=names, value=names[0], description="layer")
        self.head_choice = ipywidgets.Dropdown(description="head")
        self.query_start = ipywidgets.IntSlider(min=0, max=0, description="query from")
        self.key_start = ipywidgets.IntSlider(min=0, max=0, description="key from")
        self.info_html = ipywidgets.HTML()
        panels = _detail_panels()
        self.detail_figure, self.detail_source = panels.detail_figure, panels.detail_source
        self.head_view_figure, self.token_source = panels.head_view_figure, panels.token_source
        self.bars_figure = panels.bars_figure
        self.detail_widget = BokehModel(panels.layout)
        # Wider than a narrow column: it scrolls inside the output instead of being cut.
        self.detail_widget.layout = ipywidgets.Layout(max_width="100%", overflow="auto")
        figures.redraw_head_view_when_ready(panels.layout.document)
        self.overview_box = ipywidgets.Box(layout=ipywidgets.Layout(flex="0 0 auto"))
        self.overview_figure = None
        self.window_source = None
        self.model_view_figure = self._model_view()
        self.model_view_source = figures.model_view_source(self.model_view_figure)
        self.model_view_source.selected.on_change("indices", self._on_thumbnail_tap)
        self._frame_models = _detail_models(panels, self.model_view_source)
        many = len(self.model_view_source.data["layer"]) > 1
        self.model_view_widget = BokehModel(self.model_view_figure)
        self.model_view_widget.layout = ipywidgets.Layout(max_width="100%", overflow="auto")
        self.model_view_widget.layout.display = (
            None if many else "none"
        )  # one head: it is the detail
        self.layer_choice.observe(self._on_layer, names="value")
        for control in (self.head_choice, self.query_start, self.key_start):
            control.observe(lambda _: self._show_detail(), names="value")
        self.importance_figure = self.importance_source = None
        self.loss_html = ipywidgets.HTML()
        parts = [self.model_view_widget]
        if self.head_masks:
            self.importance_figure = self._importance_grid()
            self.importance_source = self.importance_figure.select_one(
                {"name": "head_importance_source"}
            )
            self._mask_marks = self.importance_figure.select_one({"name": "head_mask_source"})
            self.importance_source.selected.on_change("indices", self._on_head_tap)
            grid_widget = BokehModel(self.importance_figure)
            grid_widget.layout = ipywidgets.Layout(max_width="100%", overflow="auto")
            # A Box, not a VBox: the page finds each explorer as its one `.widget-vbox`.
            parts.append(
                ipywidgets.Box(
                    [grid_widget, self.loss_html], layout=ipywidgets.Layout(flex_flow="column")
                )
            )
            self._show_loss()
        self.widget = ipywidgets.VBox(
            [
                ipywidgets.HBox([self.layer_choice, self.head_choice]),
                ipywidgets.HBox([self.query_start, self.key_start]),
                self.info_html,
                # Wraps: beside a narrow notebook column (a side panel open) the overview
                # goes below the detail instead of being squeezed to a sliver.
                ipywidgets.HBox(
                    [self.detail_widget, self.overview_box],
                    layout=ipywidgets.Layout(flex_flow="row wrap", max_width="100%"),
                ),
                ipywidgets.HBox(
                    parts, layout=ipywidgets.Layout(flex_flow="row wrap", max_width="100%")
                ),
            ]
        )

    def _menu(self):
        """The layer menu: every layer, then rollout and flow where they apply."""
        length = self.shapes[self._stacked[0]][-1] if self._stacked else 0
        views = [
            view
            for view, longest in ((ROLLOUT, ROLLOUT_MAX_TOKENS), (FLOW, FLOW_MAX_TOKENS))
            if 0 < length <= longest
        ]
        return [*self.shapes, *views]

    def _head_options(self, name):
        """The head menu of a layer or a view (the mean of heads first)."""
        if name == FLOW:
            return [MEAN_OF_HEADS]
        if name == ROLLOUT:
            fewest = min(self.shapes[layer][0] for layer in self._stacked)
            return [MEAN_OF_HEADS, *range(fewest)] if fewest > 1 else [MEAN_OF_HEADS]
        num_heads = self.shapes[name][0]
        return [MEAN_OF_HEADS, *range(num_heads)] if num_heads > 1 else [0]

    def _lengths(self, name):
        """`(Tq, Tv)` of a layer or a view."""
        return self.shapes[self._stacked[0] if name in (ROLLOUT, FLOW) else name][1:]

    def _view_matrix(self, name, head):
        """`(L, L)` rollout or flow of the current weights, computed once."""
        key = (name, head)
        if key not in self._views:
            # The first pick computes it (seconds for long inputs): the page says so meanwhile.
            shown = self.info_html.value
            self.info_html.value = (
                f"<b>{escape(name)}</b>: <i>computing it from {len(self._stacked)} layers "
                f"of {self._lengths(name)[0]} tokens &hellip;</i>"
            )
            try:
                self._views[key] = _captured.combined_attention(
                    "rollout" if name == ROLLOUT else "flow",
                    [self.weights[layer] for layer in self._stacked],
                    None if head == MEAN_OF_HEADS else head,
                )
            finally:
                self.info_html.value = shown
        return self._views[key]

    def _window(self, name, head, q0, q1, k0, k1):
        if name in (ROLLOUT, FLOW):
            return self._view_matrix(name, head)[q0:q1, k0:k1]
        return self._source.window(name, head, q0, q1, k0, k1)

    def _summary(self, name, max_size):
        """`(H, r, c)` block means (a view: its mean-of-heads map, H = 1)."""
        if name in (ROLLOUT, FLOW):
            return figures.downsample(self._view_matrix(name, MEAN_OF_HEADS), max_size)[0][None]
        return self._source.summary(name, max_size)

    # --------------------------------------------------------- head masking

    def _grid_rows(self):
        """`(paths, names)` of the grid's rows: names are paths cut to the layer's name
        where that is unambiguous."""
        paths = list(self.head_masks)
        short = [path.rsplit("/", 1)[-1] for path in paths]
        return paths, [n if short.count(n) == 1 else p for p, n in zip(paths, short, strict=True)]

    def _grid_values(self):
        paths, names = self._grid_rows()
        scores = [
            np.full(len(self.head_masks[p]), np.nan)
            if self.importance is None
            else self.importance[p]
            for p in paths
        ]
        return scores, names, [self.head_masks[p] for p in paths]

    def _importance_grid(self, title=None):
        scores, names, masks = self._grid_values()
        if title is None:
            title = IMPORTANCE_TITLE
        return figures.head_importance_grid(
            scores, names, masks, title=title, color_bar_title=IMPORTANCE_LEGEND
        )

    def toggle_head(self, layer, head):
        """Mask head `head` of `layer` (a `MultiHeadAttention` path or name), or unmask
        it if masked (what a click on its grid cell does); every map is recomputed."""
        paths, names = self._grid_rows()
        if layer in names:
            layer = paths[names.index(layer)]
        if layer not in self.head_masks:
            raise ValueError(
                "AttentionExplorer.toggle_head: `layer` must be one of the model's "
                f"MultiHeadAttention layers ({names}). Received: layer={layer!r}"
            )
        mask = self.head_masks[layer]
        if not validation.is_int(head) or not 0 <= head < len(mask):
            raise ValueError(
                f"AttentionExplorer.toggle_head: `head` must be in [0, {len(mask)}) for "
                f"{layer!r}. Received: head={head!r}"
            )
        mask[int(head)] = 1.0 - mask[int(head)]
        self.loss_html.value = "<i>masking: calling the model again &hellip;</i>"
        masks = self._active_masks()
        self._source = _CapturedWeights(self.model, self.inputs, self.example, masks)
        self.weights = self._source.weights
        self._views.clear()
        if self.baseline_output is None:
            self.baseline_output = self._example_output({})
        self.output = self._example_output(masks)
        if self._loss_function is not None:
            self.loss = self._masked_loss()
        fresh = self._model_view()
        images = self.model_view_figure.select_one({"name": "model_view_images"})
        images.data = dict(fresh.select_one({"name": "model_view_images"}).data)
        mapper = self.model_view_figure.select_one({"type": LinearColorMapper})
        mapper.high = fresh.select_one({"type": LinearColorMapper}).high
        model_view_marks = self.model_view_figure.select_one({"name": "model_view_mask_source"})
        model_view_marks.data = dict(fresh.select_one({"name": "model_view_mask_source"}).data)
        _, marks = figures.head_importance_data(*self._grid_values())
        self._mask_marks.data = marks
        self._show_loss()
        self._show(self.head_choice.value, keep_window=True)

    def _active_masks(self):
        return {path: mask for path, mask in self.head_masks.items() if not np.all(mask == 1)}

    def _example_output(self, masks):
        """The model's (first) output for the shown example with these head masks."""
        with analysis.masking_heads(self.model, masks):
            outputs = self._call_model()
        first = keras.tree.flatten(outputs)[0]
        return np.asarray(keras.ops.convert_to_numpy(first), "float64")[self.example]

    def _call_model(self):
        """`model(inputs)`; a layer given a tuple is called as `layer(query, value[, key])`
        (as the weights are captured)."""
        if isinstance(self.model, keras.Model) or not isinstance(self.inputs, (tuple, list)):
            return self.model(self.inputs, training=False)
        return self.model(*self.inputs, training=False)

    def _masked_loss(self):
        """The mean loss on `(inputs, targets)` with the current head masks."""
        with analysis.masking_heads(self.model, self._active_masks()):
            predictions = self._call_model()
            value = keras.ops.mean(self._loss_function(self.targets, predictions))
        return float(keras.ops.convert_to_numpy(value))

    def masked_heads(self):
        """`[(layer path, head)]` of the heads masked now."""
        return [
            (path, int(head))
            for path, mask in self.head_masks.items()
            for head in np.flatnonzero(mask == 0)
        ]

    def _loss_text(self):
        masked = self.masked_heads()
        heads = f"{len(masked)} head{'s' if len(masked) != 1 else ''} masked"
        if self.loss is None:
            return heads
        return (
            f"loss {self.loss:.4f} ({heads}; unmasked {self.baseline_loss:.4f}; "
            f"measured change {self.loss - self.baseline_loss:+.4f})"
        )

    def mask_effect_html(self):
        """What the current masks change, as HTML: the maps after the masked layers (or
        none), and the model's output for the shown example, unmasked beside masked."""
        masked = self.masked_heads()
        if not masked:
            return (
                "<small>Masking a head multiplies its output by 0: the maps of the layers "
                "after it, the model's output and the loss change; its own layer's map "
                "does not (its weights are still computed).</small>"
            )
        order = list(self.shapes)
        first = min(self._capture_index(path) for path, _ in masked)
        after = order[first + 1 :]
        if after:
            maps = (
                f"the maps of the {len(after)} layer{'s' if len(after) > 1 else ''} after "
                f"{escape(order[first])} ({escape(', '.join(after))}) change"
            )
        else:
            maps = (
                f"no attention map lies after {escape(order[first])}, so no map changes; "
                "the output does"
            )
        return (
            f"<small>Masked heads (crossed out) drop their output: {maps}. "
            "Their own layer's map is unchanged.</small><br>"
            + _prediction_table(self.baseline_output, self.output)
            + (
                "<small>Importance is a first-order estimate (|d loss / d head mask| at "
                "the unmasked model); the measured change above is what masking did.</small>"
                if self.importance is not None
                else ""
            )
        )

    def _capture_index(self, path):
        """Where the layer at `path` comes in the capture order (the model view's rows)."""
        names = list(self.shapes)
        for index, name in enumerate(names):
            if self._mask_path(name) == path:
                return index
        return len(names) - 1

    def _mask_path(self, name):
        """The `head_masks` path of a captured layer name (`None`: not maskable)."""
        name = name.split("#", 1)[0]
        if name in self.head_masks:
            return name
        matches = [path for path in self.head_masks if path.rsplit("/", 1)[-1] == name]
        return matches[0] if len(matches) == 1 else None

    def _show_loss(self):
        self.loss_html.value = (
            f"<b>{escape(self._loss_text())}</b>"
            + (
                ""
                if self.importance is not None
                else "<br><small>importance needs `targets` (and a loss)</small>"
            )
            + "<br>"
            + self.mask_effect_html()
        )

    def _on_head_tap(self, _attr, _old, new):
        if self._updating or len(new) != 1:
            return
        data = self.importance_source.data
        layer, head = data["layer"][new[0]], int(data["head"][new[0]])
        with self._updating_controls():  # a click on the same cell again must change it again
            self.importance_source.selected.indices = []
        paths, names = self._grid_rows()
        self.toggle_head(paths[names.index(layer)], head)

    def _model_view(self):
        names = list(self.shapes)  # layers only: rollout and flow have no heads
        masked = [self.head_masks.get(self._mask_path(name)) for name in names]
        return figures.model_view(
            [self._source.summary(name, 32) for name in names], names, masked=masked
        )

    # ------------------------------------------------------------- updating

    def select(self, layer, head=MEAN_OF_HEADS):
        """Full `(Tq, Tv)` matrix of a layer and head (or the mean of heads).

        With scores on demand this computes every row (as much memory as the
        full weights of one head); the explorer itself only asks for windows.
        """
        num_queries, num_keys = self._lengths(layer)
        return self._window(layer, head, 0, num_queries, 0, num_keys)

    def _tokens(self, tokens, length):
        return tokens if tokens is not None and len(tokens) == length else None

    def _on_layer(self, _change):
        self._show()

    def _on_thumbnail_tap(self, _attr, _old, new):
        if self._updating or len(new) != 1:
            return
        data = self.model_view_source.data
        layer, head = data["layer"][new[0]], int(data["head"][new[0]])
        with self._updating_controls():
            self.layer_choice.value = layer
        self._show(head)

    def _show(self, head=None, keep_window=False):
        """Draws the chosen layer with `head` (default: its first head option), from the
        window's start (or, `keep_window`, the window the sliders show)."""
        if self._updating:
            return
        layer = self.layer_choice.value
        num_queries, num_keys = self._lengths(layer)
        with self._updating_controls():
            self.head_choice.options = self._head_options(layer)
            self.head_choice.value = (
                head if head in self.head_choice.options else self.head_choice.options[0]
            )
            long_queries = num_queries > self.max_tokens
            long_keys = num_keys > self.max_tokens
            self.query_start.max = max(0, num_queries - self.max_tokens)
            self.key_start.max = max(0, num_keys - self.max_tokens)
            if not keep_window:
                self.query_start.value = 0
                self.key_start.value = 0
            self.query_start.layout.display = None if long_queries else "none"
            self.key_start.layout.display = None if long_keys else "none"
        for old in self.overview_box.children:
            old.close()  # frees the comm and the Bokeh document of the previous layer
        if long_queries or long_keys:
            self.overview_figure, self.window_source = self._overview(layer)
            self.overview_box.children = [BokehModel(self.overview_figure)]
        else:
            self.overview_figure = self.window_source = None
            self.overview_box.children = []
        if layer in (ROLLOUT, FLOW):
            what = (
                f"{len(self._stacked)} self-attention layers "
                f"({escape(', '.join(self._stacked))}) with the residual mixed in "
                "(Abnar &amp; Zuidema), "
            )
        else:
            what = f"{self.shapes[layer][0]} head(s), "
        self.info_html.value = (
            f"<b>{escape(layer)}</b>: {what}"
            f"{num_queries} queries x {num_keys} keys"
            + (
                f"; detail shows a {self.max_tokens}-token window"
                if long_queries or long_keys
                else ""
            )
            + ("; weights computed on demand" if self.weights is None else "")
        )
        self._show_detail()

    def _show_detail(self):
        if self._updating:
            return
        layer, head = self.layer_choice.value, self.head_choice.value
        num_queries, num_keys = self._lengths(layer)
        q0, k0 = self.query_start.value, self.key_start.value
        q1, k1 = min(num_queries, q0 + self.max_tokens), min(num_keys, k0 + self.max_tokens)
        x_labels, y_labels = self._window_labels(layer, q0, q1, k0, k1)
        window = self._window(layer, head, q0, q1, k0, k1)
        frame = _detail_frame(window, x_labels, y_labels, layer, head, self.model_view_source.data)
        if self.window_source is not None:
            self.window_source.data = self._window_data(num_queries, num_keys)
        with self._updating_controls():  # the frame outlines on the model view what detail shows
            _frames.apply_frame(self._frame_models, frame)

    def _overview(self, layer):
        """The block-mean overview of a long layer (mean of heads) with the detail's window
        outlined: `(figure, window_source)`, in the live widget and the export alike."""
        num_queries, num_keys = self._lengths(layer)
        size = self.max_tokens * 2
        overview = self._summary(layer, size).mean(axis=0)
        fig = figures.image_heatmap(
            overview, title=f"{layer}: overview", max_size=size, full_shape=(num_queries, num_keys)
        )
        fig.name = "overview"  # found by name in the browser (the export numbers them)
        window_source = ColumnDataSource(
            self._window_data(num_queries, num_keys), name="window_source"
        )
        fig.quad(
            left="left",
            right="right",
            top="top",
            bottom="bottom",
            source=window_source,
            fill_alpha=0.0,
            line_color=figures.SELECTED_COLOR,
            line_width=2,
        )
        return fig, window_source

    def _window_data(self, num_queries, num_keys):
        q0, k0 = self.query_start.value, self.key_start.value
        q1, k1 = min(num_queries, q0 + self.max_tokens), min(num_keys, k0 + self.max_tokens)
        return {"left": [k0 - 0.5], "right": [k1 - 0.5], "top": [q0 - 0.5], "bottom": [q1 - 0.5]}

    def focus_token(self, index, side="query"):
        """Select a token of the head view (what a click does in the page).

        The highlighting and the bars are drawn by BokehJS in the page.
        """
        if side not in ("query", "key"):
            raise ValueError(
                "AttentionExplorer.focus_token: `side` must be 'query' or 'key'. "
                f"Received: side={side!r}"
            )
        data = self.token_source.data
        matches = [
            i
            for i, (s, p) in enumerate(zip(data["side"], data["position"], strict=True))
            if s == side and p == index
        ]
        if not matches:
            raise ValueError(
                f"AttentionExplorer.focus_token: no {side} token at window position {index}. "
                f"Received: index={index!r} "
                f"(the window has {data['side'].count(side)} {side} tokens)"
            )
        self.token_source.selected.indices = matches

    def standalone_layout(self):
        """A Bokeh document showing every layer and head without a kernel (`export_html`).

        Layer and head selects, and clicks on the model view's thumbnails,
        switch the detail heatmap (and the head view) between the embedded
        matrices (each head and their mean, rollout and flow; for long inputs,
        the window the sliders show now), with BokehJS callbacks. The head
        importance grid is a static picture of the masks and values at export.
        """
        from bokeh.document import Document
        from bokeh.models import CustomJS
        from bokeh.models import Div
        from bokeh.models import Select

        q0, k0 = self.query_start.value, self.key_start.value
        panels = _detail_panels()
        model_view = self._model_view()
        thumbnails = figures.model_view_source(model_view)
        menu = self._menu()
        layer_options = {layer: [str(h) for h in self._head_options(layer)] for layer in menu}
        every_head = {option for options in layer_options.values() for option in options}
        # Long layers: their overview beside the detail, the one of the chosen layer shown.
        overviews = {
            layer: self._overview(layer)[0]
            for layer in menu
            if max(self._lengths(layer)) > self.max_tokens
        }
        first = menu[0]
        for index, (layer, overview) in enumerate(overviews.items()):
            overview.name = f"overview_{index}"
            overview.visible = layer == first
        frames = {}
        for layer in menu:
            num_queries, num_keys = self._lengths(layer)
            q1, k1 = min(num_queries, q0 + self.max_tokens), min(num_keys, k0 + self.max_tokens)
            x_labels, y_labels = self._window_labels(layer, q0, q1, k0, k1)
            options = layer_options[layer]
            for option in options:
                head = option if option == MEAN_OF_HEADS else int(option)
                frame = _detail_frame(
                    self._window(layer, head, q0, q1, k0, k1),
                    x_labels,
                    y_labels,
                    layer,
                    head,
                    thumbnails.data,
                )
                frame["props"]["head_select"] = {"options": options}
                for other, overview in overviews.items():
                    frame["props"][overview.name] = {"visible": other == layer}
                frames[_frames.frame_key(layer, option)] = frame
            # A head this layer does not have (chosen on another layer): its first head option.
            for option in every_head - set(options):
                frames[_frames.frame_key(layer, option)] = {
                    "data": {},
                    "props": {"head_select": {"options": options, "value": options[0]}},
                }
        layer_select = Select(title="layer", value=first, options=menu, name="layer_select")
        head_select = Select(
            title="head",
            value=layer_options[first][0],
            options=layer_options[first],
            name="head_select",
        )
        models = {
            **_detail_models(panels, thumbnails),
            "head_select": head_select,
            **{overview.name: overview for overview in overviews.values()},
        }
        callback = _frames.swap_frame_callback(models, frames, [layer_select, head_select])
        layer_select.js_on_change("value", callback)
        head_select.js_on_change("value", callback)
        thumbnails.selected.js_on_change(
            "indices",
            CustomJS(
                args=dict(
                    thumbnails=thumbnails, layer_select=layer_select, head_select=head_select
                ),
                code=THUMBNAIL_TAP_JS,
            ),
        )
        document = Document()
        parts = [
            row(layer_select, head_select),
            _wrapping_row(panels.layout, *overviews.values()) if overviews else panels.layout,
        ]
        below = [model_view] if len(thumbnails.data["layer"]) > 1 else []
        if self.head_masks:
            grid = self._importance_grid(
                title=f"Head importance (first-order estimate) · {self._loss_text()}"
            )
            effect = Div(text=self.mask_effect_html(), name="mask_effect", width=grid.width)
            below.append(column(grid, effect))
        if below:
            parts.append(_wrapping_row(*below))
        document.add_root(column(*parts))
        document.js_on_event("document_ready", callback)
        return document

    def _window_labels(self, layer, q0, q1, k0, k1):
        """Axis labels of a window: tokens where they match the layer, else absolute positions."""
        num_queries, num_keys = self._lengths(layer)
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


# Output entries the prediction table shows (a longer output: its first ones).
PREDICTION_ENTRIES = 16


def _prediction_table(unmasked, masked):
    """HTML: the shown example's output unmasked beside masked (class scores: the top class
    per position; values otherwise), entries that differ in bold, and the largest change."""
    if unmasked is None or masked is None:
        return ""
    unmasked, masked = np.atleast_1d(unmasked), np.atleast_1d(masked)
    classes = unmasked.ndim >= 1 and unmasked.shape[-1] > 1
    if classes:  # scores over classes (last axis): the top class of each position
        top = [np.argmax(x, axis=-1) for x in (unmasked, masked)]
        what = "top class (its score)" + (" per position" if unmasked.ndim > 1 else "")
        cells = [
            [
                f"{int(c)} ({v:.3g})"
                for c, v in zip(
                    t.reshape(-1),
                    np.take_along_axis(x, t[..., None], axis=-1).reshape(-1),
                    strict=True,
                )
            ]
            for t, x in zip(top, (unmasked, masked), strict=True)
        ]
    else:
        shown = [x.reshape(-1) for x in (unmasked, masked)]
        what = "output"
        cells = [[f"{v:.3g}" for v in x] for x in shown]
    differs = [a != b for a, b in zip(*cells, strict=True)]
    rows = []
    for label, values in (("unmasked", cells[0]), ("masked", cells[1])):
        entries = "".join(
            f"<td>{'<b>' + v + '</b>' if d else v}</td>"
            for v, d in zip(values[:PREDICTION_ENTRIES], differs, strict=False)
        )
        rows.append(f"<tr><th style='text-align:left'>{label}</th>{entries}</tr>")
    change = float(np.max(np.abs(masked - unmasked))) if unmasked.size else 0.0
    more = len(cells[0]) - PREDICTION_ENTRIES
    return (
        f"<small>Prediction ({what}), unmasked beside masked; largest output change "
        f"{change:.4g}{f'; first {PREDICTION_ENTRIES} of {len(cells[0])}' if more > 0 else ''}"
        f":</small><table class='prediction' style='border-spacing: 10px 0'>{''.join(rows)}</table>"
    )


def _wrapping_row(*children):
    """A row that wraps in a narrow page (a second line instead of a sideways scroll)."""
    return row(*children, styles={"flex-wrap": "wrap"})


def _detail_panels():
    """The detail heatmap with its head view and bars: one Bokeh document, so that the
    head view's callbacks read the heatmap's source in the page."""
    panels = types.SimpleNamespace()
    panels.detail_figure = figures.heatmap(
        np.zeros((1, 1)), title="", width=DETAIL_SIZE[0], height=DETAIL_SIZE[1]
    )
    panels.detail_figure.name = "detail_figure"  # found by name in the browser
    panels.detail_source = figures.heatmap_source(panels.detail_figure)
    panels.detail_source.name = "detail_source"
    panels.head_view_figure, panels.bars_figure, panels.token_source = figures.head_view(
        panels.detail_figure
    )
    # The bars under the heatmap, the head view beside both: a long window's tall head
    # view is matched by a taller heatmap, not by an empty area under it (#42).
    panels.bars_figure.width = DETAIL_SIZE[0]
    panels.bars_figure.height = BARS_HEIGHT
    panels.layout = row(column(panels.detail_figure, panels.bars_figure), panels.head_view_figure)
    return panels


def detail_height(head_view_height):
    """The detail heatmap's height beside a head view this tall: the heatmap and
    the bars under it end where the head view ends."""
    return max(DETAIL_SIZE[1], int(head_view_height) - BARS_HEIGHT)


def _detail_frame(window, x_labels, y_labels, layer, head, thumbnails):
    """The detail heatmap, its head view and the model view's outline, as a frame
    (`_frames`): what the live explorer applies and the export embeds per layer and head."""
    window = np.asarray(window, dtype="float64")
    rows, cols = window.shape
    # No more labels than the 460 x 440 detail holds (a 64-token window:
    # every 4th; hover names each cell).
    x_ticks, x_overrides = figures.tick_labels(
        x_labels, figures.labels_that_fit(DETAIL_SIZE[0] - 150, slanted=True)
    )
    head_view = figures.head_view_layout(rows, cols)
    height = detail_height(head_view["height"])
    y_ticks, y_overrides = figures.tick_labels(y_labels, figures.labels_that_fit(height - 110))
    # Colours fitted to the shown weights (the colour bar shows the range).
    low = min(0.0, float(np.nanmin(window))) if window.size else 0.0
    high = max(float(np.nanmax(window)), low + 1e-9) if window.size else 1.0
    return {
        "data": {
            "detail_source": figures.heatmap_data(window, x_labels, y_labels),
            "head_view_tokens": figures.head_view_tokens(y_labels, x_labels),
        },
        "props": {
            "detail_x_range": {"start": -0.5, "end": max(cols, 1) - 0.5},
            "detail_y_range": {"start": max(rows, 1) - 0.5, "end": -0.5},
            "detail_x_ticker": {"ticks": x_ticks},
            "detail_x_axis": {"major_label_overrides": x_overrides},
            "detail_y_ticker": {"ticks": y_ticks},
            "detail_y_axis": {"major_label_overrides": y_overrides},
            "detail_mapper": {"low": low, "high": high},
            "detail_title": {
                "text": f"{layer}, {head if head == MEAN_OF_HEADS else f'head {head}'}"
            },
            "head_view_y_range": {"start": head_view["y_range"][0], "end": head_view["y_range"][1]},
            "head_view_figure": {"height": head_view["height"]},
            "detail_figure": {"height": height},
            "thumbnail_selection": {"indices": _thumbnail_indices(thumbnails, layer, head)},
        },
    }


def _detail_models(panels, thumbnails):
    """The models a detail frame sets, by the keys `_detail_frame` uses."""
    detail, view = panels.detail_figure, panels.head_view_figure
    return {
        "detail_source": panels.detail_source,
        "head_view_tokens": panels.token_source,
        **_frames.figure_models(
            "detail",
            detail,
            ("x_range", "y_range", "x_ticker", "x_axis", "y_ticker", "y_axis", "mapper", "title"),
        ),
        **_frames.figure_models("head_view", view, ("y_range", "figure")),
        "detail_figure": detail,
        "thumbnail_selection": thumbnails.selected,
    }


def _thumbnail_indices(data, layer, head):
    """The model-view thumbnails of what the detail shows (all heads of a layer for the mean)."""
    return [
        i
        for i, (name, index) in enumerate(zip(data["layer"], data["head"], strict=True))
        if name == layer and (head == MEAN_OF_HEADS or index == head)
    ]


# A tap on one thumbnail of an exported explorer sets the selects (the frame
# they name outlines it); the outline a frame itself sets (the mean: several) is ignored.
THUMBNAIL_TAP_JS = """
const picked = thumbnails.selected.indices;
if (picked.length !== 1) return;
const data = thumbnails.data;
const column = (name) => Array.from(data instanceof Map ? data.get(name) : data[name]);
const layer = column("layer")[picked[0]], head = String(column("head")[picked[0]]);
if (layer_select.value !== layer) layer_select.value = layer;
if (head_select.value !== head) head_select.value = head;
"""


def _use_scores_on_demand(model, inputs, setting):
    """Whether the explorer asks `model` (a layer) for windows instead of capturing all weights."""
    capable = (
        not isinstance(model, keras.Model)
        and "attention_scores_heads" in inspect.signature(model.call).parameters
    )
    if setting is True and not capable:
        raise ValueError(
            "AttentionExplorer: `scores_on_demand=True` needs an attention layer whose call takes "
            "`attention_scores_heads` (e.g. keras_attention.MultiHeadAttention), given as `model`. "
            f"Received: {type(model).__name__} '{model.name}'"
        )
    if setting == "auto" and capable:
        query, value, _ = _layer_inputs(inputs)
        length = value.shape[1] if value is not None else query.shape[1]
        return length is not None and length >= ON_DEMAND_FROM
    return bool(setting) and capable


def _layer_inputs(inputs):
    """`(query, value, key)` of what a layer is called with (a tensor or a tuple)."""
    parts = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    if not 1 <= len(parts) <= 3:
        raise ValueError(
            "AttentionExplorer: a layer takes `inputs` = query or (query, value[, key]). "
            f"Received: {len(parts)} inputs"
        )
    parts += [None] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def _maskable_heads(model):
    """`{layer path: (H,) ones}` of every `MultiHeadAttention` under `model`."""
    return {
        path: np.ones(layer.num_heads, "float32")
        for path, layer in analysis.head_layers(model).items()
    }


def _loss_function(model, targets, loss):
    """The loss the head grid reports, or None without `targets`; checked."""
    if targets is None:
        if loss is not None:
            raise ValueError(
                "AttentionExplorer: `loss` needs `targets` (what the model should output "
                f"for `inputs`). Received: loss={loss!r}, targets=None"
            )
        return None
    if loss is None:
        loss = getattr(model, "loss", None)  # as compiled
        if loss is None:
            raise ValueError(
                "AttentionExplorer: `targets` needs a `loss` (or a model compiled with one). "
                f"Received: loss=None and {type(model).__name__} '{model.name}' not compiled"
            )
    if isinstance(loss, str):
        try:
            return keras.losses.get(loss)
        except ValueError as error:
            raise ValueError(
                f"AttentionExplorer: `loss` must name a Keras loss. Received: loss={loss!r}"
            ) from error
    if not callable(loss):
        raise TypeError(
            "AttentionExplorer: `loss` must be a Keras loss name, a keras.losses.Loss or a "
            f"function (y_true, y_pred). Received: loss={loss!r}"
        )
    return loss


class _CapturedWeights:
    """Every layer's weights, captured from one call of the model (with `head_masks`,
    `{layer path: (H,)}`, in force)."""

    def __init__(self, model, inputs, example, head_masks=None):
        try:
            with analysis.masking_heads(model, head_masks or {}):
                captured = _captured.call_and_capture(model, inputs)
        except Exception as error:
            raise ValueError(
                f"AttentionExplorer: calling {type(model).__name__} '{model.name}' "
                "on `inputs` failed "
                f"({type(error).__name__}: {error}). Received: inputs of shape {_shapes(inputs)}"
            ) from error
        if not captured:
            raise ValueError(
                f"AttentionExplorer: no attention was recorded while calling '{model.name}' "
                "(are the attention layers used in the call?)"
            )
        _check_example(example, _captured.batch_size(next(iter(captured.values()))))
        self.weights = {name: _captured.per_head(w, example) for name, w in captured.items()}
        self.shapes = {name: w.shape for name, w in self.weights.items()}

    def window(self, layer, head, q0, q1, k0, k1):
        heads = self.weights[layer][:, q0:q1, k0:k1]
        return heads.mean(axis=0) if head == MEAN_OF_HEADS else heads[head]

    def summary(self, layer, max_size):
        """`(H, r, c)` block means of every head, at most `max_size` per axis."""
        return np.stack([figures.downsample(head, max_size)[0] for head in self.weights[layer]])


class _OnDemandWeights:
    """One attention layer's weights, computed for the rows asked for only.

    Query rows `[q0, q1)` are the layer called on those rows of the query
    (over every key) with `attention_scores_heads`: attention is row-wise, so
    these are exactly those rows of the full weights, and the layer forms
    only `(1, heads, rows, Tv)` of them (its output comes from the kernel it
    would use without weights, the blockwise one for long keys).
    """

    def __init__(self, layer, inputs, example, rows_per_call):
        query, value, key = _layer_inputs(inputs)
        _check_example(example, int(query.shape[0]))

        def as_tensor(x):
            return None if x is None else keras.ops.convert_to_tensor(x)[example : example + 1]

        self.layer = layer
        self.query, self.value, self.key = as_tensor(query), as_tensor(value), as_tensor(key)
        if self.value is None:
            # Self-attention: every query row attends over the whole sequence.
            self.value = self.query
        self.rows_per_call = rows_per_call
        name = layer.name
        try:
            _, probe = self._call(0, 1, [0])
        except Exception as error:
            raise ValueError(
                f"AttentionExplorer: calling {type(layer).__name__} '{name}' on `inputs` with "
                f"attention_scores_heads failed ({type(error).__name__}: {error}). "
                f"Received: inputs of shape {_shapes(inputs)}"
            ) from error
        self.shapes = {name: (int(layer.num_heads), int(self.query.shape[1]), int(probe.shape[-1]))}
        self._summaries = {}

    def _call(self, q0, q1, heads):
        output, weights = self.layer(
            self.query[:, q0:q1],
            self.value,
            self.key,
            return_attention_scores=True,
            attention_scores_heads=heads,
            training=False,
        )
        return output, weights

    def rows(self, heads, q0, q1):
        """`(len(heads), q1 - q0, Tv)`: exact weights of these heads and query rows."""
        _, weights = self._call(q0, q1, list(heads))
        return np.asarray(keras.ops.convert_to_numpy(weights), dtype="float32")[0]

    def window(self, layer, head, q0, q1, k0, k1):
        num_heads = self.shapes[layer][0]
        heads = range(num_heads) if head == MEAN_OF_HEADS else [head]
        block = self.rows(heads, q0, q1)[:, :, k0:k1]
        return block.mean(axis=0)

    def summary(self, layer, max_size):
        """`(H, r, c)` block means of every head, at most `max_size` per axis.

        One pass, `rows_per_call` query rows at a time, computes block means
        at `SUMMARY_SIZE` per axis; coarser summaries (the thumbnails) are
        block means of those.
        """
        if layer not in self._summaries:
            self._summaries[layer] = self._fine_summary(layer, max(max_size, SUMMARY_SIZE))
        fine = self._summaries[layer]
        if max(fine.shape[1:]) <= max_size:
            return fine
        return np.stack([figures.downsample(head, max_size)[0] for head in fine])

    def _fine_summary(self, layer, max_size):
        num_heads, num_queries, num_keys = self.shapes[layer]
        row_step, col_step = (max(1, int(np.ceil(n / max_size))) for n in (num_queries, num_keys))
        # Whole row blocks per call, so each block's mean is taken in one piece.
        chunk = max(row_step, self.rows_per_call // row_step * row_step)
        blocks = []
        for start in range(0, num_queries, chunk):
            stop = min(num_queries, start + chunk)
            weights = self.rows(range(num_heads), start, stop)
            blocks.append(
                np.stack(
                    [
                        figures.downsample(head, max_size=10**9, steps=(row_step, col_step))[0]
                        for head in weights
                    ]
                )
            )
        return np.concatenate(blocks, axis=1)


def _check_example(example, size):
    if not validation.is_int(example) or not 0 <= example < size:
        raise ValueError(
            f"AttentionExplorer: `example` must be in [0, {size}). Received: example={example!r}"
        )


def _shapes(inputs):
    if isinstance(inputs, (list, tuple)):
        return [_shapes(x) for x in inputs]
    if isinstance(inputs, dict):
        return {key: _shapes(x) for key, x in inputs.items()}
    return (
        tuple(getattr(inputs, "shape", ())) if hasattr(inputs, "shape") else type(inputs).__name__
    )
