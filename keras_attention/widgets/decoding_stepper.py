"""Step through a translator's decoding one token at a time."""

import types

import ipywidgets
import numpy as np
from bokeh.layouts import column
from bokeh.layouts import row
from bokeh.models import LinearColorMapper

from keras_attention import validation
from keras_attention.widgets import figures
from keras_attention.widgets._component import FreshBokehModel as BokehModel
from keras_attention.widgets._component import Component
from keras_attention.widgets._component import escape

MEAN_OF_HEADS = "mean of heads"


class DecodingStepper(Component):
    """Step through decoding and watch each prediction's attention.

    Drives `translator.decoding_session(text, top_k)` (see API.md) and shows,
    for the current step, one panel per stage of attention, each titled with
    the step and the token being produced:

    1. the scores over the source tokens before softmax (shown when the
       attention layer exposes them; Transformer translators do not),
    2. the softmax distribution,
    3. the weighted sum: each source vector scaled by its weight, and their
       sum, the context vector (shown when the session exposes the vectors,
       `session.values`),
    4. the prediction: top-k candidates with probabilities, the chosen token
       marked.

    An alignment heatmap grows one row per step (`ColumnDataSource.stream`);
    its height follows the output, and wide sources scroll inside the page.

    Controls: Reset / Back / Next token / Play (with a speed slider), a step
    slider, and the candidates: clicking a candidate (its button or its bar)
    replaces the current step's token with it and decoding goes on from
    there. For Transformer translators (attention `(layers, heads, T_in)`),
    dropdowns choose the layer and the head (or their mean).

    Every control has a Python method (`next_token`, `back`, `reset`,
    `go_to`, `force`) so notebooks and tests can drive it without a browser.
    `export_html(stepper, path)` writes the decoded line as one offline page
    whose step slider (and layer/head selects) work without a kernel.

    Args:
        translator: an object with `supports_decoding_session` True and
            `decoding_session(text, top_k=...)`.
        text: the source sentence.
        top_k: number of candidates shown.
        reserved_rows: heatmap rows laid out up front (it grows past them).

    Attributes:
        widget: the ipywidgets box to display.
        session: the decoding session.
        heatmap_source: the alignment heatmap's `ColumnDataSource` (one
            entry per cell; columns `row`, `col`, `weight`, ...).
        distribution_source, scores_source, candidate_source: sources of the
            bar charts (`candidate_source.data["color"]` marks the chosen token).
        weighted_sum_source: the weighted-sum heatmap's source (rows: each
            source vector times its weight, then the context vector).
    """

    def __init__(self, translator, text, *, top_k=5, reserved_rows=None):
        if not getattr(translator, "supports_decoding_session", False) or not callable(
            getattr(translator, "decoding_session", None)
        ):
            raise TypeError(
                "DecodingStepper: `translator` must support decoding sessions "
                "(`supports_decoding_session` True and a `decoding_session(text, top_k)` "
                f"method, like keras_attention.models translators). Received: {type(translator).__name__}"
            )
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"DecodingStepper: `text` must be a non-empty string. Received: text={text!r}")
        if not validation.is_int(top_k) or top_k < 1:
            raise ValueError(f"DecodingStepper: `top_k` must be a positive integer. Received: top_k={top_k!r}")
        if reserved_rows is not None and (
            not validation.is_int(reserved_rows) or reserved_rows < 1
        ):
            raise ValueError(
                f"DecodingStepper: `reserved_rows` must be a positive integer. Received: reserved_rows={reserved_rows!r}"
            )
        top_k = int(top_k)
        reserved_rows = None if reserved_rows is None else int(reserved_rows)
        self.translator = translator
        self.text = text
        self.top_k = top_k
        self.session = translator.decoding_session(text, top_k=top_k)
        self.source_tokens = [str(token) for token in self.session.source_tokens]
        values = getattr(self.session, "values", None)
        self.values = None if values is None else np.asarray(values, dtype="float64")
        self.position = 0
        # Token ids of the furthest line decoded so far; Back and the slider
        # replay it, a forced candidate truncates it.
        self._path = []
        self._updating = False
        num_source = len(self.source_tokens)
        self._reserved_rows = reserved_rows or 4
        # Square cells sized so the heatmap fits a notebook column; long
        # sources get small cells and then scroll sideways.
        self._cell = int(np.clip(560 // max(num_source, 1), 14, 32))
        self._build_figures(num_source)
        self._build_controls()
        self._refresh_step_views()

    # ------------------------------------------------------------------ build

    def _build_figures(self, num_source):
        panels = _stage_figures(self.source_tokens, self.values, self.top_k, self._cell, self._reserved_rows)
        for name in ("heatmap_figure", "heatmap_source", "scores_figure", "scores_source",
                     "distribution_figure", "distribution_source", "weighted_sum_figure",
                     "weighted_sum_source", "candidate_figure", "candidate_source", "figures_layout"):
            setattr(self, name, getattr(panels, name))
        self.candidate_source.selected.on_change("indices", self._on_candidate_tap)
        self.bokeh_widget = BokehModel(self.figures_layout)
        # A source too wide for the page scrolls inside the output, not the page.
        self.bokeh_widget.layout = ipywidgets.Layout(max_width="100%", overflow="auto")

    def _heatmap_height(self, rows):
        return _heatmap_height(self._cell, rows)

    def _build_controls(self):
        button = ipywidgets.Button
        self.reset_button = button(description="Reset", icon="fast-backward", tooltip="Start over")
        self.back_button = button(description="Back", icon="step-backward", tooltip="Undo one token")
        self.next_button = button(description="Next token", icon="step-forward", button_style="primary")
        self.play = ipywidgets.Play(value=0, min=0, max=10**6, interval=500, show_repeat=False,
                                    description="Play")
        self.speed = ipywidgets.FloatSlider(value=2.0, min=0.5, max=10.0, step=0.5,
                                            description="tokens/s", readout_format=".1f")
        self.step_slider = ipywidgets.IntSlider(value=0, min=0, max=0, description="step")
        self.layer_choice = ipywidgets.Dropdown(options=[0], value=0, description="layer")
        self.head_choice = ipywidgets.Dropdown(options=[MEAN_OF_HEADS], value=MEAN_OF_HEADS,
                                               description="head")
        self.layer_choice.layout.display = "none"
        self.head_choice.layout.display = "none"
        self.output_html = ipywidgets.HTML()
        self.source_html = ipywidgets.HTML(
            "<b>source:</b> " + " ".join(f"<code>{escape(t)}</code>" for t in self.source_tokens)
        )
        self.status_html = ipywidgets.HTML()
        self.candidate_buttons = [
            ipywidgets.Button(layout=ipywidgets.Layout(width="auto"),
                              tooltip="Use this token instead and decode on from here")
            for _ in range(self.top_k)
        ]

        self.reset_button.on_click(lambda _: self.reset())
        self.back_button.on_click(lambda _: self.back())
        self.next_button.on_click(lambda _: self.next_token())
        for index, candidate_button in enumerate(self.candidate_buttons):
            candidate_button.on_click(lambda _, index=index: self._on_candidate(index))
        self.play.observe(self._on_play_tick, names="value")
        self.speed.observe(self._on_speed, names="value")
        self._on_speed({"new": self.speed.value})
        self.step_slider.observe(self._on_slider, names="value")
        self.layer_choice.observe(lambda _: self._redraw_all(), names="value")
        self.head_choice.observe(lambda _: self._redraw_all(), names="value")

        controls = ipywidgets.HBox([self.reset_button, self.back_button, self.next_button,
                                    self.play, self.speed])
        choices = ipywidgets.HBox([self.step_slider, self.layer_choice, self.head_choice])
        candidates = ipywidgets.HBox(
            [ipywidgets.HTML("<b>candidates (click to force):</b>"), *self.candidate_buttons]
        )
        self.widget = ipywidgets.VBox([
            controls, choices, self.source_html, self.output_html, candidates,
            self.status_html, self.bokeh_widget,
        ])

    # --------------------------------------------------------------- actions

    @property
    def history(self):
        return self.session.history

    def standalone_layout(self):
        """A Bokeh layout that replays this decoding without a kernel (`export_html`).

        Embeds every step of the decoded line (the one Back and the step
        slider reach; greedy decoding to the end when nothing is decoded
        yet): a step slider, and for Transformers layer and head selects,
        drive the same four stage panels and the alignment heatmap with
        BokehJS callbacks. The widget's own state is not touched.
        """
        session = self.translator.decoding_session(self.text, top_k=self.top_k)
        if self._path:
            steps = [session.step(force_token=token_id) for token_id in self._path]
        else:
            steps = []
            while not session.done:
                steps.append(session.step())
        return _standalone(self, steps)

    def next_token(self, force_token=None):
        """Decode one more token (or `force_token`); returns the step, or None when done."""
        if self.session.done:
            self._set_status("decoding is finished")
            return None
        if force_token is None and self.position < len(self._path):
            step = self.session.step(force_token=self._path[self.position])
        else:
            step = self.session.step(force_token=force_token)
            self._path = self._path[: self.position] + [int(step.token_id)]
        self.position += 1
        self._maybe_show_selectors(step)
        self._stream_row(step)
        self._refresh_step_views()
        return step

    def back(self):
        """Undo the last token (the decoded line is kept for Next / the slider)."""
        if self.position > 0:
            self.go_to(self.position - 1)

    def reset(self):
        """Start over: no output, empty heatmap, the decoded line forgotten."""
        self.session.reset()
        self.position = 0
        self._path = []
        self._redraw_all()

    def go_to(self, position):
        """Show the state after `position` tokens (replaying or extending the line)."""
        position = max(0, int(position))
        if position < self.position:
            path = self._path
            self.session.reset()
            for token_id in path[:position]:
                self.session.step(force_token=token_id)
            self.position = position
            self._redraw_all()
        while self.position < position and not self.session.done:
            self.next_token()

    def force(self, token):
        """Replace the current step's token with `token` and decode on from there.

        A token the session rejects raises its ValueError or TypeError and
        leaves the stepper as it was.
        """
        if self.position == 0:
            raise ValueError("DecodingStepper.force: there is no step yet; call next_token() first.")
        self.go_to(self.position - 1)
        try:
            return self.next_token(force_token=token)
        except (ValueError, TypeError) as error:
            self.next_token()  # replays the token that was there (the line is kept)
            raise type(error)(f"DecodingStepper.force: {error}") from error

    # ------------------------------------------------------------- reactions

    def _on_candidate(self, index):
        if self.position == 0:
            return
        candidates = self.history[-1].candidates
        if index < len(candidates):
            self.force(candidates[index][0])

    def _on_candidate_tap(self, _attr, _old, new):
        if not new:
            return
        self.candidate_source.selected.indices = []  # a later tap on the same bar counts again
        self._on_candidate(new[0])

    def _on_play_tick(self, change):
        if self._updating or not self.play.playing:
            return
        if self.session.done:
            self.play.playing = False
            return
        self.next_token()
        if self.session.done:
            self.play.playing = False

    def _on_speed(self, change):
        self.play.interval = int(1000 / change["new"])

    def _on_slider(self, change):
        if self._updating:
            return
        self.go_to(change["new"])

    # -------------------------------------------------------------- drawing

    def _maybe_show_selectors(self, step):
        attention = np.asarray(step.attention)
        if attention.ndim != 3 or self.layer_choice.layout.display != "none":
            return
        num_layers, num_heads, _ = attention.shape
        self._updating = True
        try:
            self.layer_choice.options = list(range(num_layers))
            self.layer_choice.value = num_layers - 1
            self.head_choice.options = [MEAN_OF_HEADS, *range(num_heads)]
            self.head_choice.value = MEAN_OF_HEADS
        finally:
            self._updating = False
        self.layer_choice.layout.display = None
        self.head_choice.layout.display = None

    def select(self, array):
        """One `(T_in,)` row from a step's attention or scores, per the layer/head choice."""
        array = np.asarray(array, dtype="float64")
        if array.ndim == 1:
            return array
        layer = self.layer_choice.value if self.layer_choice.value in range(array.shape[0]) else -1
        per_head = array[layer]
        if self.head_choice.value == MEAN_OF_HEADS:
            return per_head.mean(axis=0)
        return per_head[self.head_choice.value]

    def _output_tokens(self):
        return [str(step.token) for step in self.history]

    def _stream_row(self, step):
        row_index = self.position - 1
        self.heatmap_source.stream(
            figures.heatmap_data(self.select(step.attention)[None, :], self.source_tokens,
                                 [step.token], row_offset=row_index)
        )
        self._update_heatmap_axes()

    def _update_heatmap_axes(self):
        rows = max(self._reserved_rows, self.position)
        if self.heatmap_figure.y_range.start != rows - 0.5:
            self.heatmap_figure.y_range.start = rows - 0.5
            self.heatmap_figure.height = self._heatmap_height(rows)
        figures.set_tick_labels(self.heatmap_figure, y_tokens=self._output_tokens())
        self.heatmap_figure.title.text = "Alignment (one row per output token)" + (
            f": {self._choice_label()}" if self.layer_choice.layout.display != "none" else ""
        )

    def _choice_label(self):
        head = self.head_choice.value
        return f"layer {self.layer_choice.value}, " + (head if head == MEAN_OF_HEADS else f"head {head}")

    def _redraw_all(self):
        if self._updating:
            return
        history = self.history
        if history:
            matrix = np.stack([self.select(step.attention) for step in history])
        else:
            matrix = np.zeros((0, len(self.source_tokens)))
        self.heatmap_source.data = figures.heatmap_data(matrix, self.source_tokens, self._output_tokens())
        self._update_heatmap_axes()
        self._refresh_step_views()

    def _refresh_step_views(self):
        history = self.history
        num_source = len(self.source_tokens)
        self._updating = True
        try:
            self.step_slider.max = len(self._path)
            self.step_slider.value = self.position
        finally:
            self._updating = False
        self.back_button.disabled = self.position == 0
        self.next_button.disabled = self.session.done
        if not history:
            self._patch_bars(self.distribution_source, np.zeros(num_source))
            self._patch_bars(self.scores_source, np.zeros(num_source))
            self.scores_figure.title.text = "1. Scores (before softmax)"
            self.distribution_figure.title.text = "2. Softmax distribution"
            if self.weighted_sum_figure is not None:
                self._draw_weighted_sum(np.zeros(num_source), "3. Weighted sum")
            blank = [("", 0.0)] * self.top_k
            self.candidate_source.data = figures.candidate_data(blank)
            figures.set_tick_labels(self.candidate_figure, y_tokens=[""] * self.top_k)
            self.candidate_figure.title.text = "4. Prediction"
            for candidate_button in self.candidate_buttons:
                candidate_button.layout.display = "none"
            self.output_html.value = "<b>output:</b> <i>(press Next token)</i>"
            self._set_status("")
            return
        step = history[-1]
        titles = _stage_titles(step, self.position)
        distribution = self.select(step.attention)
        self._patch_bars(self.distribution_source, distribution)
        self.distribution_figure.title.text = titles["distribution"]
        # Translators that do not expose pre-softmax scores get no empty panel.
        self.scores_figure.visible = step.scores is not None
        if step.scores is not None:
            self._patch_bars(self.scores_source, self.select(step.scores))
            self.scores_figure.title.text = titles["scores"]
        if self.weighted_sum_figure is not None:
            self._draw_weighted_sum(distribution, titles["weighted"])
        candidates = list(step.candidates)[: self.top_k]
        padded = candidates + [("", 0.0)] * (self.top_k - len(candidates))
        self.candidate_source.data = figures.candidate_data(padded, chosen=step.token)
        # Short labels keep the bars (and the title above them) wide; hover shows the token.
        figures.set_tick_labels(self.candidate_figure, y_tokens=[t for t, _ in padded], max_chars=16)
        self.candidate_figure.title.text = titles["candidate"]
        for index, candidate_button in enumerate(self.candidate_buttons):
            if index < len(candidates):
                token, probability = candidates[index]
                candidate_button.description = f"{token}  {probability:.2f}"
                candidate_button.button_style = "info" if token == step.token else ""
                candidate_button.layout.display = None
            else:
                candidate_button.layout.display = "none"
        words = [escape(token) for token in self._output_tokens()]
        words[-1] = f"<mark>{words[-1]}</mark>"
        self.output_html.value = (
            f"<b>output:</b> {' '.join(words)} &nbsp; <small>(step {self.position}: "
            f"<code>{escape(step.token)}</code> p={step.probability:.3f}; "
            f"attention sums to {distribution.sum():.3f})</small>"
        )
        self._set_status("decoding is finished" if self.session.done else "")

    def _draw_weighted_sum(self, weights, title):
        rows, labels = figures.weighted_sum_rows(weights, self.values, self.source_tokens)
        figures.update_heatmap(self.weighted_sum_figure, rows, [str(i) for i in range(rows.shape[1])],
                               labels, title=title)
        # Colours fitted to the values (white at 0), so small contexts stay visible.
        limit = float(max(np.abs(rows).max(), 1e-9))
        mapper = self.weighted_sum_figure.select_one({"type": LinearColorMapper})
        mapper.low, mapper.high = -limit, limit

    @staticmethod
    def _patch_bars(source, values):
        values = [float(v) for v in values]
        source.patch({"weight": [(slice(0, len(values)), values)]})

    def _set_status(self, text):
        self.status_html.value = f"<i>{escape(text)}</i>" if text else ""


def _heatmap_height(cell, rows):
    return rows * cell + 150


def _stage_figures(source_tokens, values, top_k, cell, rows):
    """The stepper's Bokeh figures (blank): one panel per stage and the alignment heatmap."""
    num_source = len(source_tokens)
    zeros = np.zeros(num_source)
    label_room = 40 + 7 * min(24, max([len(t) for t in source_tokens] + [4]))
    panels = types.SimpleNamespace()
    panels.heatmap_figure = figures.heatmap(
        np.zeros((0, num_source)), source_tokens, [],
        title="Alignment (one row per output token)", x_axis_label="source", y_axis_label="output",
        rows=rows, width=num_source * cell + 130 + label_room, height=_heatmap_height(cell, rows),
    )
    panels.heatmap_source = figures.heatmap_source(panels.heatmap_figure)
    panels.heatmap_source.name = "alignment_source"  # found by name in the browser
    panels.scores_figure = figures.distribution_bars(
        zeros, source_tokens, title="1. Scores (before softmax)",
        y_axis_label="score", fixed_scale=False, color="#7a7a7a", width=400,
    )
    panels.scores_source = figures.heatmap_source(panels.scores_figure)
    panels.scores_source.name = "scores_source"
    panels.distribution_figure = figures.distribution_bars(
        zeros, source_tokens, title="2. Softmax distribution", width=400,
    )
    panels.distribution_source = figures.heatmap_source(panels.distribution_figure)
    panels.distribution_source.name = "distribution_source"
    if values is not None:
        panels.weighted_sum_figure = figures.weighted_sum(
            zeros, values, source_tokens, title="3. Weighted sum", width=400,
            height=max(220, 18 * (num_source + 1) + 110),
        )
        panels.weighted_sum_source = figures.heatmap_source(panels.weighted_sum_figure)
        panels.weighted_sum_source.name = "weighted_sum_source"
    else:
        panels.weighted_sum_figure = panels.weighted_sum_source = None
    panels.candidate_figure = figures.candidate_bars([("", 0.0)] * top_k, title="4. Prediction", width=400)
    panels.candidate_source = figures.heatmap_source(panels.candidate_figure)
    panels.candidate_source.name = "candidate_source"
    stages = [panels.scores_figure, panels.distribution_figure, panels.weighted_sum_figure,
              panels.candidate_figure]
    stages = [stage for stage in stages if stage is not None]
    for stage in stages:
        stage.title.text_font_size = "10pt"  # titles name the step and token: keep them on one line
    panels.figures_layout = column(row(*stages[:2]), row(*stages[2:]), panels.heatmap_figure)
    return panels


def _stage_titles(step, position):
    """Titles of the four stage panels for `step`, the `position`-th token."""
    token = _quoted(step.token)
    forced = not step.candidates or step.token != step.candidates[0][0]
    return {
        "scores": f"1. Scores before softmax · {token} (step {position})",
        "distribution": f"2. Attention while producing {token} (step {position})",
        "weighted": f"3. Context = Σ weight × value · {token} (step {position})",
        "candidate": (f"4. Prediction (step {position}): {token} "
                      f"p={step.probability:.2f}" + (" (forced)" if forced else "")),
    }


def _quoted(token):
    # Bokeh draws titles as text (never HTML): no escaping needed.
    return f"'{token}'"


# Copies step `step` (and the layer/head choice) from the embedded frames into
# the sources of an exported stepper. `frames.attention` / `.scores` hold one flat
# `(layers * heads * T)` array per step (`heads` 0: one `(T,)` distribution).
STANDALONE_JS = """
const i = step_slider.value - 1;
const T = frames.num_source;
const L = frames.layers, H = frames.heads;
const layer = L > 0 ? Number(layer_select.value) : 0;
const head = H > 0 && head_select.value !== "mean of heads" ? Number(head_select.value) : -1;
function pick(flat) {
  if (H === 0) return Array.from(flat);
  const out = new Array(T).fill(0);
  for (let t = 0; t < T; t++) {
    if (head >= 0) out[t] = flat[(layer * H + head) * T + t];
    else { for (let h = 0; h < H; h++) out[t] += flat[(layer * H + h) * T + t] / H; }
  }
  return out;
}
const weights = pick(frames.attention[i]);
distribution.data = {...distribution.data, weight: weights};
distribution_figure.title.text = frames.titles[i].distribution;
if (frames.scores[i] !== null) {
  scores.data = {...scores.data, weight: pick(frames.scores[i])};
  scores_figure.title.text = frames.titles[i].scores;
}
const c = frames.candidates[i];
candidates.data = {rank: c.token.map((_, r) => r), token: c.token, probability: c.probability, color: c.color};
candidate_figure.title.text = frames.titles[i].candidate;
candidate_axis.major_label_overrides = new Map(c.token.map((t, r) => [r, t.length > 16 ? t.slice(0, 15) + "…" : t]));
if (weighted !== null) {
  const values = frames.values, D = values[0].length;
  const row = [], col = [], weight = [], x_token = [], y_token = [], sum = new Array(D).fill(0);
  const labels = new Map();
  for (let s = 0; s <= T; s++) {
    for (let d = 0; d < D; d++) {
      const v = s < T ? weights[s] * values[s][d] : sum[d];
      if (s < T) sum[d] += v;
      row.push(s); col.push(d); weight.push(v); x_token.push(String(d));
      y_token.push(s < T ? frames.source_tokens[s] : "= context");
    }
    labels.set(s, s < T ? weights[s].toFixed(2) + " x " + frames.source_tokens[s] : "= context");
  }
  weighted.data = {row, col, weight, x_token, y_token};
  weighted_axis.major_label_overrides = labels;
  const limit = Math.max(1e-9, ...weight.map(Math.abs));
  weighted_mapper.low = -limit; weighted_mapper.high = limit;
  weighted_figure.title.text = frames.titles[i].weighted;
}
const row = [], col = [], weight = [], x_token = [], y_token = [];
for (let s = 0; s <= i; s++) {
  const r = pick(frames.attention[s]);
  for (let t = 0; t < T; t++) {
    row.push(s); col.push(t); weight.push(r[t]);
    x_token.push(frames.source_tokens[t]); y_token.push(frames.tokens[s]);
  }
}
alignment.data = {row, col, weight, x_token, y_token};
alignment_axis.major_label_overrides = new Map(frames.tokens.slice(0, i + 1).map((t, s) => [s, t]));
alignment_figure.title.text = "Alignment (one row per output token)" + (L > 0 ?
  ": layer " + layer + ", " + (head >= 0 ? "head " + head : "mean of heads") : "");
"""


def _standalone(stepper, steps):
    """The exported stepper: fresh figures, every step embedded, BokehJS callbacks."""
    from bokeh.document import Document
    from bokeh.models import CustomJS
    from bokeh.models import Div
    from bokeh.models import Select
    from bokeh.models import Slider

    if not steps:
        raise ValueError("DecodingStepper.standalone_layout: the decoded line is empty (nothing to export).")
    panels = _stage_figures(stepper.source_tokens, stepper.values, stepper.top_k, stepper._cell, len(steps))
    attention = np.asarray(steps[0].attention)
    layers, heads = attention.shape[:2] if attention.ndim == 3 else (0, 0)
    titles = [_stage_titles(step, position) for position, step in enumerate(steps, start=1)]
    frames = {
        "attention": [np.asarray(s.attention, "float64").ravel().tolist() for s in steps],
        "scores": [None if s.scores is None else np.asarray(s.scores, "float64").ravel().tolist() for s in steps],
        "tokens": [str(s.token) for s in steps],
        "candidates": [figures.candidate_data(list(s.candidates)[: stepper.top_k], chosen=s.token) for s in steps],
        "titles": titles,
        "num_source": len(stepper.source_tokens), "layers": int(layers), "heads": int(heads),
        "source_tokens": list(stepper.source_tokens),
        "values": None if stepper.values is None else stepper.values.tolist(),
    }
    panels.scores_figure.visible = steps[0].scores is not None
    slider = Slider(start=1, end=max(len(steps), 2), value=len(steps), step=1, title="step",
                    name="step_slider", width=400, disabled=len(steps) == 1)
    layer_select = Select(title="layer", value=str(layers - 1 if layers else 0),
                          options=[str(layer) for layer in range(max(layers, 1))], name="layer_select",
                          visible=layers > 0)
    head_select = Select(title="head", value=MEAN_OF_HEADS,
                         options=[MEAN_OF_HEADS, *(str(head) for head in range(heads))], name="head_select",
                         visible=heads > 0)
    weighted = panels.weighted_sum_figure
    callback = CustomJS(
        args=dict(
            frames=frames, step_slider=slider, layer_select=layer_select, head_select=head_select,
            distribution=panels.distribution_source, distribution_figure=panels.distribution_figure,
            scores=panels.scores_source, scores_figure=panels.scores_figure,
            candidates=panels.candidate_source, candidate_figure=panels.candidate_figure,
            candidate_axis=panels.candidate_figure.yaxis[0],
            weighted=panels.weighted_sum_source, weighted_figure=weighted,
            weighted_axis=None if weighted is None else weighted.yaxis[0],
            weighted_mapper=None if weighted is None else weighted.select_one({"type": LinearColorMapper}),
            alignment=panels.heatmap_source, alignment_figure=panels.heatmap_figure,
            alignment_axis=panels.heatmap_figure.yaxis[0],
        ),
        code=STANDALONE_JS,
    )
    slider.js_on_change("value", callback)
    layer_select.js_on_change("value", callback)
    head_select.js_on_change("value", callback)
    header = Div(text="<b>source:</b> " + " ".join(f"<code>{escape(t)}</code>" for t in stepper.source_tokens)
                 + "<br><b>output:</b> " + " ".join(f"<code>{escape(s.token)}</code>" for s in steps))
    document = Document()
    document.add_root(column(header, row(slider, layer_select, head_select), panels.figures_layout))
    document.js_on_event("document_ready", callback)  # draws the last step on opening
    return document
