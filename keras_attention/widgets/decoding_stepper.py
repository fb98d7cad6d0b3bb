"""Step through a translator's or a causal LM's decoding one token at a time."""

import functools
import types

import ipywidgets
import numpy as np
from bokeh.layouts import column
from bokeh.layouts import row
from bokeh.models import TapTool

from keras_attention import validation
from keras_attention.widgets import _frames
from keras_attention.widgets import figures
from keras_attention.widgets._component import Component
from keras_attention.widgets._component import FreshBokehModel as BokehModel
from keras_attention.widgets._component import escape

MEAN_OF_HEADS = "mean of heads"
# The layer choice that shows attention rollout over every layer (causal LMs).
ROLLOUT = "rollout (all layers)"


class DecodingStepper(Component):
    """Step through decoding and watch each prediction's attention.

    Drives `translator.decoding_session(text, top_k)` (see API.md) and shows,
    for the current step, one panel per stage of attention, each titled with
    the step and the token being produced:

    1. the scores over the source tokens before softmax (shown when the
       session exposes them; for Transformer translators those of the chosen
       layer and head, or their mean, labelled),
    2. the softmax distribution,
    3. the weighted sum: each source vector scaled by its weight, and their
       sum, the context vector (shown when the session exposes the vectors,
       `session.values`; for a Transformer head its value vectors, for the
       mean of heads every head's side by side),
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

    **Causal language models.** `DecodingStepper(causal_lm, prompt,
    max_length=...)` steps a KerasHub causal LM with our attention swapped in
    (`replace_keras_hub_attention`), or a Keras model of our layers from
    token ids to logits (`vocabulary=` its tokens), through a
    `CausalDecodingSession`: greedy by default, or `sampler=` (a KerasHub
    sampler, e.g. `TopKSampler(k=5, seed=1, temperature=0.8)`, or
    `keras_attention.models.Sampling(temperature, top_k, top_p, seed)`).
    Decoding to the end leaves `stepper.output_text` equal to
    `causal_lm.generate(prompt, max_length=...)` with the same sampler. The
    columns are then the context's positions: each row is the new token's
    attention over the tokens before it, computed for that row only (a
    cached step). Below the alignment, the model view draws every layer and
    head's row for the current token (click a row to show it above; the
    layer choice also offers the rollout over every layer), and the cache
    panel shows which position each slot of every layer's cache holds: a
    full cache, or a sliding window's ring (its slots wrap, so a local layer
    forgets what left its window) with its sink slots pinned, the slot just
    written in orange.

    Args:
        translator: an object with `supports_decoding_session` True and
            `decoding_session(text, top_k=...)`; or a causal LM (above).
        text: the source sentence; or the prompt (a string; tokens of
            `vocabulary` for a plain Keras model).
        top_k: number of candidates shown.
        reserved_rows: heatmap rows laid out up front (it grows past them).
        max_length: (causal LMs) prompt plus output, as in `generate`.
        sampler: (causal LMs) None or "greedy", a KerasHub sampler, or
            `keras_attention.models.Sampling`.
        vocabulary: (a plain Keras causal model) its token strings.

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

    def __init__(
        self,
        translator,
        text,
        *,
        top_k=5,
        reserved_rows=None,
        max_length=None,
        sampler=None,
        vocabulary=None,
    ):
        self.causal = not getattr(translator, "supports_decoding_session", False)
        if self.causal and not _is_causal_model(translator):
            raise TypeError(
                "DecodingStepper: the model must be a translator that supports "
                "decoding sessions (`supports_decoding_session` True and a "
                "`decoding_session(text, top_k)` method, like keras_attention.models "
                "translators), a KerasHub causal LM with our attention, or a Keras "
                f"model of our layers. Received: {type(translator).__name__}"
            )
        top_k = validation.validate_positive_int("DecodingStepper", "top_k", top_k)
        reserved_rows = validation.validate_positive_int(
            "DecodingStepper", "reserved_rows", reserved_rows, allow_none=True
        )
        if self.causal:
            self._start_causal(
                translator, text, top_k, reserved_rows, max_length, sampler, vocabulary
            )
            return
        for argument, value in (
            ("max_length", max_length),
            ("sampler", sampler),
            ("vocabulary", vocabulary),
        ):
            if value is not None:
                raise ValueError(
                    f"DecodingStepper: `{argument}` is for causal language models; a "
                    "translator decodes to its own max length, greedily. Received: "
                    f"{argument}={value!r}"
                )
        if not isinstance(text, str) or not text.strip():
            raise ValueError(
                f"DecodingStepper: `text` must be a non-empty string. Received: text={text!r}"
            )
        try:
            text.encode("utf-8")
        except UnicodeError as error:
            # Checked here, so that the error names what the user called, not
            # the translator's `decoding_session` that would refuse it next.
            raise ValueError(
                "DecodingStepper: `text` must be valid Unicode text (encodable as "
                f"UTF-8); {error.reason} at position {error.start}. Received: text={text!r}"
            ) from None
        self.translator = translator
        self.text = text
        self.top_k = top_k
        self.session = translator.decoding_session(text, top_k=top_k)
        self.source_tokens = [str(token) for token in self.session.source_tokens]
        values = getattr(self.session, "values", None)
        self.values = None if values is None else np.asarray(values, dtype="float64")
        self._finish_init(reserved_rows)

    def _start_causal(self, model, prompt, top_k, reserved_rows, max_length, sampler, vocabulary):
        """A causal LM's stepper: the session is a `CausalDecodingSession`;
        the columns are the context's positions (prompt and output), each
        step's row the new token's attention over them."""
        if max_length is None:
            raise ValueError(
                "DecodingStepper: a causal LM needs `max_length` (the length of "
                "prompt plus output, as in `generate`). Received: max_length=None"
            )
        self.translator = self.model = model
        self.text = prompt
        self.top_k = top_k
        self._session_arguments = dict(
            max_length=max_length, top_k=self.top_k, sampler=sampler, vocabulary=vocabulary
        )
        self.session = _CausalSession(model, prompt, **self._session_arguments)
        self.prompt_tokens = list(self.session.source_tokens)
        # One column per context position a step can attend (the last step's
        # query sits at max_length - 2); labels come with each frame.
        self.source_tokens = [""] * (self.session.max_length - 1)
        self.values = None
        self._finish_init(reserved_rows, causal_layers=self.session.num_attention_layers)

    def _new_session(self):
        if self.causal:
            return _CausalSession(self.model, self.text, **self._session_arguments)
        return self.translator.decoding_session(self.text, top_k=self.top_k)

    def _finish_init(self, reserved_rows, causal_layers=None):
        self.position = 0
        # Token ids of the furthest line decoded so far; Back and the slider
        # replay it, a forced candidate truncates it.
        self._path = []
        self._causal_layers = causal_layers
        num_source = len(self.source_tokens)
        self._reserved_rows = reserved_rows or 4
        # Square cells sized so the heatmap fits a notebook column; long
        # sources get small cells and then scroll sideways.
        self._cell = int(np.clip(560 // max(num_source, 1), 14, 32))
        self._build_figures(num_source)
        self._build_controls()
        self._refresh_step_views()

    # ------------------------------------------------------------------ build

    def _stage_arguments(self):
        """What the stage panels and their frames are drawn from (`_stage_figures`,
        `_StepperView`, the export's `_standalone`)."""
        return (
            self.source_tokens,
            self.values,
            self.top_k,
            self._cell,
            self._reserved_rows,
            self._causal_layers,
        )

    def _build_figures(self, num_source):
        panels = _stage_figures(*self._stage_arguments())
        for name in (
            "heatmap_figure",
            "heatmap_source",
            "scores_figure",
            "scores_source",
            "distribution_figure",
            "distribution_source",
            "weighted_sum_figure",
            "weighted_sum_source",
            "candidate_figure",
            "candidate_source",
            "cache_figure",
            "cache_source",
            "heads_figure",
            "heads_source",
            "figures_layout",
        ):
            setattr(self, name, getattr(panels, name))
        self._view = _StepperView(*self._stage_arguments())
        self._models = _frame_models(panels)
        self.candidate_source.selected.on_change("indices", self._on_candidate_tap)
        if self.heads_source is not None:
            self.heads_source.selected.on_change("indices", self._on_head_tap)
        self.bokeh_widget = BokehModel(self.figures_layout)
        # A source too wide for the page scrolls inside the output, not the page.
        self.bokeh_widget.layout = ipywidgets.Layout(width="100%", overflow="auto")

    def _build_controls(self):
        button = ipywidgets.Button
        self.reset_button = button(description="Reset", icon="fast-backward", tooltip="Start over")
        self.back_button = button(
            description="Back", icon="step-backward", tooltip="Undo one token"
        )
        self.next_button = button(
            description="Next token", icon="step-forward", button_style="primary"
        )
        self.play = ipywidgets.Play(
            value=0, min=0, max=10**6, interval=500, show_repeat=False, description="Play"
        )
        self.speed = ipywidgets.FloatSlider(
            value=2.0, min=0.5, max=10.0, step=0.5, description="tokens/s", readout_format=".1f"
        )
        self.step_slider = ipywidgets.IntSlider(value=0, min=0, max=0, description="step")
        self.layer_choice = ipywidgets.Dropdown(options=[0], value=0, description="layer")
        self.head_choice = ipywidgets.Dropdown(
            options=[MEAN_OF_HEADS], value=MEAN_OF_HEADS, description="head"
        )
        self.layer_choice.layout.display = "none"
        self.head_choice.layout.display = "none"
        self.output_html = ipywidgets.HTML()
        self.source_html = ipywidgets.HTML(
            "<b>prompt:</b> " + " ".join(f"<code>{escape(t)}</code>" for t in self.prompt_tokens)
            if self.causal
            else "<b>source:</b> "
            + " ".join(f"<code>{escape(t)}</code>" for t in self.source_tokens)
        )
        self.status_html = ipywidgets.HTML()
        self.candidate_buttons = [
            ipywidgets.Button(
                layout=ipywidgets.Layout(width="auto"),
                tooltip="Use this token instead and decode on from here",
            )
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

        controls = ipywidgets.HBox(
            [self.reset_button, self.back_button, self.next_button, self.play, self.speed]
        )
        choices = ipywidgets.HBox([self.step_slider, self.layer_choice, self.head_choice])
        candidates = ipywidgets.HBox(
            [ipywidgets.HTML("<b>candidates (click to force):</b>"), *self.candidate_buttons]
        )
        sampling = [self._sampling_controls()] if self.causal else []
        self.widget = ipywidgets.VBox(
            [
                controls,
                *sampling,
                choices,
                self.source_html,
                self.output_html,
                candidates,
                self.status_html,
                self.bokeh_widget,
            ]
        )

    def _sampling_controls(self):
        """Greedy or sampled decoding, and the sampler's temperature, top-k,
        top-p and seed (`keras_attention.models.Sampling`); any change starts
        the decoding again with that sampler (`set_sampler`)."""
        given = self.session.sampler
        self.decoding_choice = ipywidgets.ToggleButtons(
            options=["greedy", "sample"],
            value="greedy" if given is None else "sample",
            description="decoding",
            style={"button_width": "70px"},
        )
        self.temperature = ipywidgets.FloatSlider(
            value=1.0, min=0.1, max=2.0, step=0.1, description="temperature"
        )
        self.sampling_top_k = ipywidgets.BoundedIntText(
            value=0,
            min=0,
            max=10**6,
            description="top-k (0: all)",
            style={"description_width": "auto"},
            layout=ipywidgets.Layout(width="150px"),
        )
        self.top_p = ipywidgets.FloatSlider(
            value=1.0, min=0.05, max=1.0, step=0.05, description="top-p"
        )
        self.seed = ipywidgets.IntText(
            value=0, description="seed", layout=ipywidgets.Layout(width="150px")
        )
        for control in (
            self.decoding_choice,
            self.temperature,
            self.sampling_top_k,
            self.top_p,
            self.seed,
        ):
            control.observe(lambda _: self._on_sampling(), names="value")
        return ipywidgets.HBox(
            [self.decoding_choice, self.temperature, self.sampling_top_k, self.top_p, self.seed]
        )

    def _on_sampling(self):
        if self._updating:
            return
        if self.decoding_choice.value == "greedy":
            self.set_sampler(None)
            return
        from keras_attention.models.causal_decoding import Sampling

        self.set_sampler(
            Sampling(
                temperature=self.temperature.value,
                top_k=self.sampling_top_k.value or None,
                top_p=None if self.top_p.value >= 1.0 else self.top_p.value,
                seed=self.seed.value,
            )
        )

    def set_sampler(self, sampler):
        """Decode again from the prompt with `sampler` (None or "greedy", a
        KerasHub sampler, or `keras_attention.models.Sampling`); causal LMs only."""
        if not self.causal:
            raise ValueError(
                "DecodingStepper.set_sampler: a translator decodes greedily; samplers "
                f"are for causal LMs. Received: sampler={sampler!r}"
            )
        self._session_arguments["sampler"] = sampler
        self.session = self._new_session()
        self.position = 0
        self._path = []
        self._refresh_step_views()

    # --------------------------------------------------------------- actions

    @property
    def history(self):
        return self.session.history

    @property
    def output_text(self):
        """The text so far: the translation, or for a causal LM what its
        `generate` returns (prompt included)."""
        return self.session.output_text

    def standalone_layout(self):
        """A Bokeh layout that replays this decoding without a kernel (`export_html`).

        Embeds every step of the decoded line (the one Back and the step
        slider reach; greedy decoding to the end when nothing is decoded
        yet): a step slider, and for Transformers layer and head selects,
        drive the same four stage panels and the alignment heatmap with
        BokehJS callbacks. The widget's own state is not touched.
        """
        if self.causal:
            # The live session replays the line (its sampler is not shared with
            # a second session, whose draws would move it), then comes back.
            session = self.session
            session.reset()
        else:
            session = self._new_session()
        try:
            if self._path:
                steps = [session.step(force_token=token_id) for token_id in self._path]
            else:
                steps = []
                while not session.done:
                    steps.append(session.step())
        finally:
            if self.causal:  # the live session back where it was
                self.session.reset()
                for token_id in self._path[: self.position]:
                    self.session.step(force_token=token_id)
        return _standalone(
            steps, self._stage_arguments(), self.prompt_tokens if self.causal else None
        )

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
            raise ValueError(
                "DecodingStepper.force: there is no step yet; call next_token() first."
            )
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

    def _on_head_tap(self, _attr, _old, new):
        """A click on a row of the model view shows that layer and head."""
        if not new:
            return
        self.heads_source.selected.indices = []
        heads = np.asarray(self.history[-1].attention).shape[1] if self.history else 0
        if heads:
            self.show(*divmod(int(self.heads_source.data["row"][new[0]]), heads))

    def show(self, layer, head=MEAN_OF_HEADS):
        """Show `layer` (an index, or `ROLLOUT`) and `head` (an index or the mean of heads)."""
        if layer not in self.layer_choice.options or head not in self.head_choice.options:
            raise ValueError(
                "DecodingStepper.show: `layer` and `head` must be among the choices "
                f"{list(self.layer_choice.options)} and {list(self.head_choice.options)}. "
                f"Received: layer={layer!r}, head={head!r}"
            )
        with self._updating_controls():
            self.layer_choice.value, self.head_choice.value = layer, head
        self._refresh_step_views()

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
        with self._updating_controls():
            rollout = [ROLLOUT] if getattr(step, "rollout", None) is not None else []
            self.layer_choice.options = [*range(num_layers), *rollout]
            self.layer_choice.value = num_layers - 1
            self.head_choice.options = [MEAN_OF_HEADS, *range(num_heads)]
            self.head_choice.value = MEAN_OF_HEADS
        self.layer_choice.layout.display = None
        self.head_choice.layout.display = None

    def select(self, array):
        """One `(T_in,)` row from a step's attention or scores, per the layer/head choice."""
        return select(array, *self._choice())

    def _output_tokens(self):
        return [str(step.token) for step in self.history]

    def _choice(self):
        """`(layer, head)` the dropdowns choose (`head` an int or MEAN_OF_HEADS)."""
        return self.layer_choice.value, self.head_choice.value

    def _redraw_all(self):
        if not self._updating:
            self._refresh_step_views()

    def _refresh_step_views(self):
        history = self.history
        with self._updating_controls():
            self.step_slider.max = len(self._path)
            self.step_slider.value = self.position
        self.back_button.disabled = self.position == 0
        self.next_button.disabled = self.session.done
        # Every panel, its range, title and tick labels: the frame the export embeds too.
        frame = self._view.frame(
            history, *self._choice(), show_choice=self.layer_choice.layout.display != "none"
        )
        _frames.apply_frame(self._models, frame)
        if not history:
            for candidate_button in self.candidate_buttons:
                candidate_button.layout.display = "none"
            self.output_html.value = "<b>output:</b> <i>(press Next token)</i>"
            self._set_status("")
            return
        step = history[-1]
        distribution = self._view._row(step, *self._choice())
        candidates = list(step.candidates)[: self.top_k]
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
        if self.causal:
            words = [f"<code>{escape(t)}</code>" for t in self.prompt_tokens] + words
        self.output_html.value = (
            f"<b>{'text' if self.causal else 'output'}:</b> {' '.join(words)} "
            f"&nbsp; <small>(step {self.position}: "
            f"<code>{escape(step.token)}</code> p={step.probability:.3f}; "
            f"attention sums to {distribution.sum():.3f})</small>"
        )
        self._set_status("decoding is finished" if self.session.done else "")

    def _set_status(self, text):
        self.status_html.value = f"<i>{escape(text)}</i>" if text else ""


def _is_causal_model(model):
    """A KerasHub causal LM (`call_with_cache` and a preprocessor) or a
    Keras model (token ids to logits) the causal session can step."""
    import keras

    return isinstance(model, keras.Model)


@functools.cache
def _causal_session_class():
    from keras_attention.models import causal_decoding

    class StepperSession(causal_decoding.CausalDecodingSession):
        owner = "DecodingStepper"  # errors name what the user called

    return StepperSession


def _CausalSession(*args, **kwargs):  # noqa: N802 (a class made on first use)
    return _causal_session_class()(*args, **kwargs)


def select(array, layer, head):
    """One `(T_in,)` row of a step's attention or scores: `(T_in,)` as is, or
    `(layers, heads, T_in)` at `layer` (the last when out of range) and `head`
    (or the mean of heads)."""
    array = np.asarray(array, dtype="float64")
    if array.ndim == 1:
        return array
    per_head = array[layer if layer in range(array.shape[0]) else -1]
    if head == MEAN_OF_HEADS:
        return per_head.mean(axis=0)
    return per_head[head]


def choice_label(layer, head):
    if layer == ROLLOUT:
        return ROLLOUT
    return f"layer {layer}, " + (head if head == MEAN_OF_HEADS else f"head {head}")


class _StepperView:
    """The stepper's panels as data: `frame(history, layer, head)` for any state.

    The live widget applies the frame of its current state; the export embeds
    the frame of every step, layer and head. Nothing else draws the panels.
    """

    BLANK_TITLES = {
        "scores": "1. Scores (before softmax)",
        "distribution": "2. Softmax distribution",
        "weighted": "3. Weighted sum",
        "candidate": "4. Prediction",
    }

    def __init__(self, source_tokens, values, top_k, cell, reserved_rows, causal_layers=None):
        self.source_tokens = list(source_tokens)
        self.values = values
        self.top_k = top_k
        self.cell = cell
        self.reserved_rows = reserved_rows
        # A causal LM's stepper: its columns are context positions, labelled per frame.
        self.causal_layers = causal_layers

    def _row(self, step, layer, head):
        """One step's row at the layer and head (or its rollout), over every
        column (a causal step attends the positions before it; the later
        columns are 0)."""
        row_ = step.rollout if layer == ROLLOUT else select(step.attention, layer, head)
        return np.pad(row_, (0, len(self.source_tokens) - len(row_)))

    def _every_head(self, history, tokens):
        """The model view of a causal step: one row per (layer, head) over the context."""
        if not history:
            matrix, labels = np.zeros((0, len(tokens))), []
        else:
            attention = np.asarray(history[-1].attention, "float64")
            layers, heads = attention.shape[:2]
            matrix = np.stack(
                [
                    self._row(history[-1], layer, head)
                    for layer in range(layers)
                    for head in range(heads)
                ]
            )
            labels = [f"L{layer} H{head}" for layer in range(layers) for head in range(heads)]
        ticks, overrides = figures.tick_labels(labels)
        rows = max(len(labels), 1)
        return figures.heatmap_data(matrix, tokens, labels), {
            "heads_y_range": {"start": rows - 0.5, "end": -0.5},
            "heads_figure": {"height": max(180, 16 * rows + 150)},
            "heads_y_ticker": {"ticks": ticks},
            "heads_y_axis": {"major_label_overrides": overrides},
            "heads_x_ticker": {"ticks": figures.tick_labels(tokens)[0]},
            "heads_x_axis": {"major_label_overrides": figures.tick_labels(tokens)[1]},
        }

    def frame(self, history, layer, head, show_choice=False):
        tokens, num_source = self.source_tokens, len(self.source_tokens)
        if self.causal_layers is not None and history:
            context = [str(token) for token in history[-1].context_tokens]
            tokens = context + tokens[len(context) :]
        position = len(history)
        output_tokens = [str(step.token) for step in history]
        matrix = (
            np.stack([self._row(step, layer, head) for step in history])
            if history
            else np.zeros((0, num_source))
        )
        rows = max(position, 1)  # the rows decoded, no blank rows below them
        ticks, labels = figures.tick_labels(output_tokens)
        data = {"alignment_source": figures.heatmap_data(matrix, tokens, output_tokens)}
        props = {
            "alignment_y_range": {"start": rows - 0.5, "end": -0.5},
            "alignment_figure": {
                "height": _heatmap_height(self.cell, max(rows, self.reserved_rows))
            },
            "alignment_y_ticker": {"ticks": ticks},
            "alignment_y_axis": {"major_label_overrides": labels},
            # With a layer and head to name, the short title keeps them on the figure.
            "alignment_title": {
                "text": f"Alignment: {choice_label(layer, head)}"
                if show_choice
                else "Alignment (one row per output token)"
            },
        }
        if history:
            step = history[-1]
            titles = _stage_titles(step, position)
            distribution = self._row(step, layer, head)
            scores = (
                None
                if step.scores is None or layer == ROLLOUT
                else select(step.scores, layer, head)
            )
            candidates = list(step.candidates)[: self.top_k]
            chosen = step.token
        else:
            titles, distribution, scores = (
                self.BLANK_TITLES,
                np.zeros(num_source),
                np.zeros(num_source),
            )
            candidates, chosen = [], None
        data["distribution_source"] = figures.bar_data(distribution, tokens)
        props["distribution_title"] = {"text": titles["distribution"]}
        # Translators that do not expose pre-softmax scores get no empty panel.
        props["scores_figure"] = {"visible": scores is not None}
        if scores is not None:
            data["scores_source"] = figures.bar_data(scores, tokens)
            start, end = figures.value_range(scores)
            props["scores_y_range"] = {"start": start, "end": end}
            props["scores_title"] = {"text": titles["scores"]}
            props["scores_y_axis"] = {
                "axis_label": "score"
                + (" (mean of heads)" if show_choice and head == MEAN_OF_HEADS else "")
            }
        if self.values is not None:
            attention = history[-1].attention if history else None
            weighted, row_labels, features = self._weighted_sum(
                attention, distribution, layer, head
            )
            data["weighted_source"] = figures.heatmap_data(weighted, features, row_labels)
            ticks, labels = figures.tick_labels(row_labels)
            x_ticks, x_labels = figures.tick_labels(features, max_labels=12)  # ~30 px per label
            # Colours fitted to the values (white at 0), so small contexts stay visible.
            limit = float(max(np.abs(weighted).max(), 1e-9))
            side_by_side = self.values.ndim == 4 and head == MEAN_OF_HEADS
            props.update(
                {
                    "weighted_y_ticker": {"ticks": ticks},
                    "weighted_y_axis": {"major_label_overrides": labels},
                    "weighted_x_range": {"start": -0.5, "end": len(features) - 0.5},
                    "weighted_x_ticker": {"ticks": x_ticks},
                    "weighted_x_axis": {
                        "major_label_overrides": x_labels,
                        "axis_label": "feature (heads side by side)" if side_by_side else "feature",
                    },
                    "weighted_mapper": {"low": -limit, "high": limit},
                    "weighted_title": {"text": titles["weighted"]},
                }
            )
        if self.causal_layers is not None:
            props.update(_context_axes(tokens))
            data["heads_source"], heads_props = self._every_head(history, tokens)
            props.update(heads_props)
            caches = history[-1].caches if history else None
            if caches is not None:
                data["cache_source"] = cache_data(caches, history[-1].context_tokens)
                props.update(_cache_props(caches, position))
        padded = candidates + [("", 0.0)] * (self.top_k - len(candidates))
        data["candidate_source"] = figures.candidate_data(padded, chosen=chosen)
        # Short labels keep the bars (and the title above them) wide; hover shows the token.
        ticks, labels = figures.tick_labels([figures.shorten(t, 16) for t, _ in padded])
        props.update(
            {
                "candidate_y_ticker": {"ticks": ticks},
                "candidate_y_axis": {"major_label_overrides": labels},
                "candidate_title": {"text": titles["candidate"]},
            }
        )
        return {"data": data, "props": props}

    def _features(self, head):
        """Feature labels of the weighted sum: one value vector, or every head's side by side."""
        if self.values.ndim == 2 or head != MEAN_OF_HEADS:
            return [str(i) for i in range(self.values.shape[-1])]
        heads, size = self.values.shape[1], self.values.shape[-1]
        return [f"h{h}:{i}" for h in range(heads) for i in range(size)]

    def _weighted_sum(self, attention, distribution, layer, head):
        """`(rows, row_labels, feature_labels)` of stage 3.

        Seq2Seq: each source vector times its weight, then the context. A
        Transformer head: its value vectors times its weights. The mean of
        heads: every head's rows side by side (the concatenation the output
        projection reads), the context of each head in the last row.
        """
        tokens, features = self.source_tokens, self._features(head)
        if self.values.ndim == 2:
            rows, labels = figures.weighted_sum_rows(distribution, self.values, tokens)
            return rows, labels, features
        values = self.values[
            layer if layer in range(self.values.shape[0]) else -1
        ]  # (H, T_in, head_dim)
        if attention is None:
            attention = np.zeros(values.shape[:2])
        else:
            attention = np.asarray(attention, "float64")[
                layer if layer in range(self.values.shape[0]) else -1
            ]
        if head != MEAN_OF_HEADS:
            rows, labels = figures.weighted_sum_rows(attention[head], values[head], tokens)
            return rows, labels, features
        rows = np.concatenate(
            [
                figures.weighted_sum_rows(w, v, tokens)[0]
                for w, v in zip(attention, values, strict=False)
            ],
            axis=1,
        )
        return rows, [*(f"w x {t}" for t in tokens), "= context"], features


def _context_axes(tokens):
    """Frame properties labelling the context axes with this step's tokens."""
    ticks, labels = figures.tick_labels(tokens)
    bar_ticks, bar_labels = figures.tick_labels(
        tokens, max_labels=figures.labels_that_fit(STAGE_WIDTH - 80, slanted=True)
    )
    return {
        "alignment_x_ticker": {"ticks": ticks},
        "alignment_x_axis": {"major_label_overrides": labels},
        "distribution_x_ticker": {"ticks": bar_ticks},
        "distribution_x_axis": {"major_label_overrides": bar_labels},
    }


# Cache cells: a slot not written yet, one holding a position, a sink slot
# (pinned to the first positions), and the slot this step wrote.
CACHE_COLORS = {"empty": "#e6e6e6", "held": "#8fb3d9", "sink": "#9b7fc2", "written": "#e07b39"}


def cache_data(caches, context_tokens):
    """The cache panel's columns: one cell per (layer, slot), with the
    position the slot holds (-1: empty), its token and its state."""
    data = {key: [] for key in ("row", "col", "position", "label", "token", "state", "color")}
    for layer, view in enumerate(caches):
        for slot, position in enumerate(np.asarray(view.positions).tolist()):
            if position < 0:
                state = "empty"
            elif slot == view.written_slot:
                state = "written"
            elif slot < view.sink_tokens:
                state = "sink"
            else:
                state = "held"
            data["row"].append(layer)
            data["col"].append(slot)
            data["position"].append(int(position))
            data["label"].append("" if position < 0 else str(position))
            data["token"].append("" if position < 0 else str(context_tokens[position]))
            data["state"].append(state)
            data["color"].append(CACHE_COLORS[state])
    return data


def _cache_props(caches, position):
    labels = {
        layer: f"layer {layer}: "
        + (
            "every position"
            if view.window is None
            else f"window {view.window}"
            + (f" + {view.sink_tokens} sinks" if view.sink_tokens else "")
        )
        for layer, view in enumerate(caches)
    }
    return {
        "cache_figure": {"visible": True},
        "cache_y_axis": {"major_label_overrides": labels},
        "cache_title": {"text": f"5. Each cache after step {position} (orange: just written)"},
    }


def _frame_models(panels):
    """The models a stepper frame sets, by the keys `_StepperView.frame` uses."""
    figure_models = _frames.figure_models
    models = {
        "alignment_source": panels.heatmap_source,
        **figure_models(
            "alignment", panels.heatmap_figure, ("figure", "y_range", "title", "y_axis", "y_ticker")
        ),
        "scores_source": panels.scores_source,
        **figure_models("scores", panels.scores_figure, ("figure", "y_range", "title", "y_axis")),
        "distribution_source": panels.distribution_source,
        **figure_models("distribution", panels.distribution_figure, ("title",)),
        "candidate_source": panels.candidate_source,
        **figure_models("candidate", panels.candidate_figure, ("title", "y_axis", "y_ticker")),
    }
    if panels.cache_figure is not None:
        models.update(
            {
                **figure_models("alignment", panels.heatmap_figure, ("x_axis", "x_ticker")),
                **figure_models("distribution", panels.distribution_figure, ("x_axis", "x_ticker")),
                "heads_source": panels.heads_source,
                **figure_models(
                    "heads",
                    panels.heads_figure,
                    ("figure", "y_range", "y_axis", "y_ticker", "x_axis", "x_ticker"),
                ),
                "cache_source": panels.cache_source,
                **figure_models("cache", panels.cache_figure, ("figure", "title", "y_axis")),
            }
        )
    weighted = panels.weighted_sum_figure
    if weighted is not None:
        models.update(
            {
                "weighted_source": panels.weighted_sum_source,
                **figure_models(
                    "weighted",
                    weighted,
                    ("title", "y_axis", "y_ticker", "x_axis", "x_ticker", "x_range", "mapper"),
                ),
            }
        )
    return models


def _heatmap_height(cell, rows):
    return rows * cell + 150


def _stage_figures(source_tokens, values, top_k, cell, rows, causal_layers=None):
    """The stepper's Bokeh figures (blank): one panel per stage and the alignment
    heatmap; for a causal LM also the cache panel (hidden until a step has caches)."""
    num_source = len(source_tokens)
    zeros = np.zeros(num_source)
    label_room = 40 + 7 * min(24, max([len(t) for t in source_tokens] + [4]))
    panels = types.SimpleNamespace()
    panels.heatmap_figure = figures.heatmap(
        np.zeros((0, num_source)),
        source_tokens,
        [],
        title="Alignment (one row per output token)",
        x_axis_label="context position" if causal_layers is not None else "source",
        y_axis_label="output",
        # At least room for its title with the layer and head on one line.
        rows=rows,
        width=max(440, num_source * cell + 130 + label_room),
        height=_heatmap_height(cell, rows),
    )
    panels.heatmap_source = figures.heatmap_source(panels.heatmap_figure)
    panels.heatmap_source.name = "alignment_source"  # found by name in the browser
    panels.scores_figure = figures.distribution_bars(
        zeros,
        source_tokens,
        title="1. Scores (before softmax)",
        y_axis_label="score",
        fixed_scale=False,
        color="#7a7a7a",
        width=STAGE_WIDTH,
    )
    panels.scores_source = figures.heatmap_source(panels.scores_figure)
    panels.scores_source.name = "scores_source"
    panels.distribution_figure = figures.distribution_bars(
        zeros,
        source_tokens,
        title="2. Softmax distribution",
        width=STAGE_WIDTH,
    )
    panels.distribution_source = figures.heatmap_source(panels.distribution_figure)
    panels.distribution_source.name = "distribution_source"
    if values is not None:
        # The first frame sets its rows (a Transformer's values are per layer and head).
        panels.weighted_sum_figure = figures.weighted_sum(
            zeros,
            np.zeros((num_source, values.shape[-1])),
            source_tokens,
            title="3. Weighted sum",
            width=400,
            height=max(220, 18 * (num_source + 1) + 110),
        )
        panels.weighted_sum_source = figures.heatmap_source(panels.weighted_sum_figure)
        panels.weighted_sum_source.name = "weighted_sum_source"
    else:
        panels.weighted_sum_figure = panels.weighted_sum_source = None
    panels.candidate_figure = figures.candidate_bars(
        [("", 0.0)] * top_k, title="4. Prediction", width=STAGE_WIDTH
    )
    panels.candidate_source = figures.heatmap_source(panels.candidate_figure)
    panels.candidate_source.name = "candidate_source"
    stages = [
        panels.scores_figure,
        panels.distribution_figure,
        panels.weighted_sum_figure,
        panels.candidate_figure,
    ]
    stages = [stage for stage in stages if stage is not None]
    for stage in stages:
        stage.title.text_font_size = "10pt"  # titles name the step and token: keep them on one line
    # Found by name in the browser (tests read their ranges there).
    for name in (
        "heatmap_figure",
        "scores_figure",
        "distribution_figure",
        "weighted_sum_figure",
        "candidate_figure",
    ):
        if getattr(panels, name) is not None:
            getattr(panels, name).name = "alignment_figure" if name == "heatmap_figure" else name
    # Bar panels fill the cell (down to their designed widths, which the labels were counted
    # for); heatmaps keep theirs, so that their cells stay about square.
    for stage in stages:
        if stage is not panels.weighted_sum_figure:
            figures.stretch(stage, max_width=STAGE_MAX_WIDTH)
    rows_ = [
        figures.stretch(row(*pair), min_width=sum(f.min_width or f.width for f in pair))
        for pair in (stages[:2], stages[2:])
        if pair
    ]
    panels.cache_figure = panels.cache_source = None
    panels.heads_figure = panels.heads_source = None
    below = [panels.heatmap_figure]
    if causal_layers is not None:
        panels.heads_figure = figures.heatmap(
            np.zeros((0, num_source)),
            source_tokens,
            [],
            title="Every layer and head (click a row)",
            x_axis_label="context position",
            y_axis_label="layer, head",
            rows=1,
            width=panels.heatmap_figure.width,
            height=180,
            toolbar=False,
        )
        panels.heads_figure.name = "heads_figure"
        panels.heads_source = figures.heatmap_source(panels.heads_figure)
        panels.heads_source.name = "heads_source"
        panels.heads_figure.add_tools(TapTool())
        below.insert(0, panels.heads_figure)
        panels.cache_figure = _cache_figure(causal_layers, len(source_tokens) + 1, cell)
        panels.cache_source = panels.cache_figure.select_one({"name": "cache_source"})
        below.append(panels.cache_figure)
    panels.figures_layout = figures.stretch(
        column(*rows_, *below),
        min_width=max([r.min_width for r in rows_] + [f.width for f in below]),
    )
    return panels


# A stage panel's designed width, and the widest it grows in a wide cell (two
# side by side fill ~1500 px).
STAGE_WIDTH = 400
STAGE_MAX_WIDTH = 760


def _cache_figure(num_layers, num_slots, cell):
    """The cache panel: a row per attention layer, a cell per slot, labelled
    with the position the slot holds (hover: its token), coloured by state
    (`CACHE_COLORS`)."""
    from bokeh.models import ColumnDataSource
    from bokeh.models import HoverTool
    from bokeh.models import Range1d
    from bokeh.plotting import figure

    source = ColumnDataSource(cache_data([], []), name="cache_source")
    fig = figure(
        title="5. The cache",
        width=max(440, num_slots * cell + 260),
        height=num_layers * 30 + 90,
        x_range=Range1d(-0.5, num_slots - 0.5),
        y_range=Range1d(num_layers - 0.5, -0.5),
        tools="",
        toolbar_location=None,
        x_axis_location="above",
        x_axis_label="slot",
        name="cache_figure",
        visible=False,
    )
    # Outlined cells with a light tint of their state's colour, and the
    # position in the theme's text colour on top: the text sits on the
    # figure's own background, so it reads in light and in dark.
    fig.rect(
        x="col",
        y="row",
        width=0.9,
        height=0.8,
        source=source,
        fill_color="color",
        fill_alpha=0.25,
        line_color="color",
        line_width=2,
        name="slots",
    )
    fig.text(
        x="col",
        y="row",
        text="label",
        source=source,
        text_align="center",
        text_baseline="middle",
        text_font_size="8pt",
        text_color="#444444",  # Bokeh's default: the page theme recolours it
        name="positions",
    )
    fig.add_tools(
        HoverTool(
            tooltips=[("slot", "@col"), ("position", "@label"), ("token", "@token"), ("", "@state")]
        )
    )
    fig.grid.visible = False
    fig.yaxis.ticker = list(range(num_layers))
    fig.yaxis.major_label_overrides = {layer: f"layer {layer}" for layer in range(num_layers)}
    fig.xaxis.ticker = list(range(num_slots)) if num_slots <= 64 else list(range(0, num_slots, 8))
    return fig


def _stage_titles(step, position):
    """Titles of the four stage panels for `step`, the `position`-th token."""
    token = _quoted(step.token)
    # A causal step says how its token came (a sampled token may not be the best).
    forced = getattr(step, "forced", not step.candidates or step.token != step.candidates[0][0])
    sampled = getattr(step, "sampled", False)
    return {
        "scores": f"1. Scores before softmax · {token} (step {position})",
        "distribution": f"2. Attention while producing {token} (step {position})",
        "weighted": f"3. Σ weight × value · {token} (step {position})",
        "candidate": (
            f"4. Prediction (step {position}): {token} "
            f"p={step.probability:.2f}"
            + (" (forced)" if forced else " (sampled)" if sampled else "")
        ),
    }


def _quoted(token):
    # Bokeh draws titles as text (never HTML): no escaping needed.
    return f"'{token}'"


def _standalone(steps, stage_arguments, prompt_tokens=None):
    """The exported stepper: fresh figures, the frame of every step, layer and head, and
    one callback that swaps them in (`_frames.swap_frame_callback`)."""
    from bokeh.document import Document
    from bokeh.models import Div
    from bokeh.models import Select

    if not steps:
        raise ValueError(
            "DecodingStepper.standalone_layout: the decoded line is empty (nothing to export)."
        )
    source_tokens = stage_arguments[0]
    panels = _stage_figures(*stage_arguments)
    attention = np.asarray(steps[0].attention)
    layers, heads = attention.shape[:2] if attention.ndim == 3 else (0, 0)
    view = _StepperView(*stage_arguments)
    layer_choices = list(range(max(layers, 1)))
    if getattr(steps[0], "rollout", None) is not None:
        layer_choices.append(ROLLOUT)
    layer_options = [str(layer) for layer in layer_choices]
    head_options = [MEAN_OF_HEADS, *(str(head) for head in range(heads))]
    frames = {}
    for position in range(1, len(steps) + 1):
        for layer in layer_choices:
            for head in [MEAN_OF_HEADS, *range(heads)]:
                frames[_frames.frame_key(position, layer, head)] = view.frame(
                    steps[:position], layer, head, show_choice=layers > 0
                )
    slider = _frames.frame_slider(1, len(steps), title="step", name="step_slider")
    layer_select = Select(
        title="layer",
        value=str(max(layers - 1, 0)),  # the last layer, as the live widget starts
        options=layer_options,
        name="layer_select",
        visible=layers > 0,
    )
    head_select = Select(
        title="head",
        value=MEAN_OF_HEADS,
        options=head_options,
        name="head_select",
        visible=heads > 0,
    )
    callback = _frames.swap_frame_callback(
        _frame_models(panels), frames, [slider, layer_select, head_select]
    )
    for control in (slider, layer_select, head_select):
        control.js_on_change("value", callback)
    header = Div(
        text=(
            "<b>prompt:</b> " + " ".join(f"<code>{escape(t)}</code>" for t in prompt_tokens)
            if prompt_tokens is not None
            else "<b>source:</b> " + " ".join(f"<code>{escape(t)}</code>" for t in source_tokens)
        )
        + "<br><b>output:</b> "
        + " ".join(f"<code>{escape(s.token)}</code>" for s in steps)
    )
    document = Document()
    document.add_root(
        figures.stretch(
            column(header, row(slider, layer_select, head_select), panels.figures_layout),
            min_width=panels.figures_layout.min_width,
        )
    )
    document.js_on_event("document_ready", callback)  # draws the last step on opening
    return document
