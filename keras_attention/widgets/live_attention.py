"""A Keras callback that redraws the attention of a probe batch while training."""

import collections
import concurrent.futures
import os
import time
import warnings

import ipywidgets
import keras
import numpy as np
from bokeh.layouts import gridplot
from bokeh.models import LinearColorMapper

from keras_attention import validation
from keras_attention.layers.machinery.capture import attention_layers
from keras_attention.widgets import _captured
from keras_attention.widgets import _frames
from keras_attention.widgets import figures
from keras_attention.widgets._component import Component
from keras_attention.widgets._component import FreshBokehModel as BokehModel
from keras_attention.widgets._component import escape
from keras_attention.widgets._component import in_notebook
from keras_attention.widgets.export import export_html


class LiveAttention(keras.callbacks.Callback, Component):
    """Watch attention form during `fit`: probe attention patched in place.

    Every `every_n_batches` batches (and at most once per `min_interval_s`
    seconds; checked before a batch starts, so Keras keeps dispatching batch
    ends asynchronously) the callback calls the model eagerly on a fixed probe batch under
    `capture_attention` and patches the heatmap of every attention layer in
    place (`ColumnDataSource.patch`), with epoch, batch and loss in the title.
    Updates are also skipped while their cost would exceed `overhead_budget`
    of the training time (the next update waits `cost / overhead_budget`), so
    a large probe cannot slow training down by more than that.

    Every update is also kept as a frame (the newest `max_frames`; the oldest
    are dropped first): the widget's `frame` slider replays them after `fit`
    (and follows the newest one during it), and `export_html(callback)`
    writes them all to one offline HTML file with its own slider. A frame
    holds one float32 matrix per layer, so the history takes at most
    `max_frames * sum(Tq * Tv) * 4` bytes (200 frames of one 64 x 64 probe:
    3.3 MB).

    In a notebook, display `callback.widget` (or the callback itself). Outside
    a notebook, an HTML snapshot is written at the end of an epoch to
    `snapshot_dir` (default `./attention_snapshots`), by a worker thread so
    that training does not wait; all are on disk when `fit` returns. A
    snapshot costs ~0.1 s of CPU (Bokeh serialisation), which the worker
    takes from training on a busy machine, so snapshots share
    `overhead_budget` with the updates: a third of it goes to snapshots (the
    updates keep the rest). An epoch's snapshot is skipped when the writer's
    CPU time would exceed that share of the training time so far, or while
    the previous one is still being written; the first epoch's and the last
    epoch's are always written.

    `view="rollout"` follows attention rollout (Abnar & Zuidema, 2020;
    `keras_attention.analysis.attention_rollout`) instead of each layer: one
    heatmap, `"rollout"`, of how much each of the last layer's tokens draws on
    each input token through the whole stack, recomputed from the probe's
    captured weights at every update (the model's self-attention layers, two
    or more over the same tokens, taken as stacked in the order they are
    called; `head` picks the head every layer contributes).

    Colours: with `view="layers"` they span 0 to 1 (the weights' range, so
    heatmaps and frames compare); rollout peaks far below 1 (near 0.45 in a
    6-token probe), so with `view="rollout"` they span each update's own
    values (the colour bar shows the range; replay and export follow it).
    `color_range` chooses either for any view, or fixed limits.

    An exception inside the callback is reported once (a warning and a line
    in the widget); live updates then stop, and training goes on.

    Args:
        model_or_layer: the model being trained, or one attention layer of
            it (a layer is called as `layer(*probe_inputs)` when the probe is
            a tuple `(query, value[, key])`).
        probe_inputs: a small batch the model can be called on (checked at
            construction: a wrong shape raises a ValueError then).
        every_n_batches: update every this many batches (>= 1).
        min_interval_s: minimum seconds between updates (>= 0). The defaults
            (every batch, at most 4 per second, within `overhead_budget`) give
            about ten frames for a 2.5 s `fit`.
        example: which example of the probe batch to draw.
        head: head to draw for multi-head layers; `None` draws the mean.
        query_tokens, key_tokens: axis labels (used where lengths match).
        snapshot_dir: where per-epoch HTML snapshots go; `None` means
            `./attention_snapshots` outside a notebook and none inside one.
        overhead_budget: largest fraction of training time spent updating
            (and writing snapshots, when they are written).
        max_frames: how many updates the history keeps (>= 1).
        view: `"layers"` (a heatmap per attention layer) or `"rollout"`.
        color_range: `"auto"` (0 to 1 for `"layers"`, `"fit"` for
            `"rollout"`), `"fit"` (each update's own values, 0 included), or
            `(low, high)` (fixed limits).

    Attributes:
        widget: ipywidgets box with the heatmaps (built on first access).
        sources: `{layer_name: ColumnDataSource}` of the heatmaps.
        figures: `{layer_name: figure}`.
        updates: number of updates made; `error`: the reported exception.
        snapshots: paths of the HTML snapshots written.
        frames: the history, oldest first: `(title, {layer_name: (Tq, Tv)})`
            per update, starting with the attention before training.
        replay: the `frame` slider (`show_frame(index)` does the same).
        snapshot_time: CPU seconds the snapshot writer has used.
        time_spent: seconds spent in the callback's hooks (training waits
            for these).
    """

    def __init__(
        self,
        model_or_layer,
        probe_inputs,
        every_n_batches=1,
        min_interval_s=0.25,
        *,
        example=0,
        head=None,
        query_tokens=None,
        key_tokens=None,
        snapshot_dir=None,
        overhead_budget=0.03,
        max_frames=200,
        view="layers",
        color_range="auto",
    ):
        super().__init__()
        view, color_range, every_n_batches, min_interval_s, overhead_budget, max_frames = (
            _checked_options(
                view, color_range, every_n_batches, min_interval_s, overhead_budget, max_frames
            )
        )
        if not isinstance(model_or_layer, keras.layers.Layer) or not attention_layers(
            model_or_layer
        ):
            raise ValueError(
                "LiveAttention: `model_or_layer` has no keras_attention attention layers to watch. "
                f"Received: {type(model_or_layer).__name__} "
                f"'{getattr(model_or_layer, 'name', model_or_layer)}'"
            )
        example = validation.validate_non_negative_int("LiveAttention", "example", example)
        head = validation.validate_non_negative_int("LiveAttention", "head", head, allow_none=True)
        query_tokens = validation.validate_tokens("LiveAttention", "query_tokens", query_tokens)
        key_tokens = validation.validate_tokens("LiveAttention", "key_tokens", key_tokens)
        self.target = model_or_layer
        self.probe_inputs = probe_inputs
        self.every_n_batches = every_n_batches
        self.min_interval_s = min_interval_s
        self.overhead_budget = overhead_budget
        self.example = example
        self.head = head
        self.query_tokens = query_tokens
        self.key_tokens = key_tokens if key_tokens is not None else query_tokens
        self.snapshot_dir = snapshot_dir
        self.view = view
        self.color_range = color_range
        matrices = self._matrices(self._probe())
        self.figures = {name: self._heatmap(name, matrix) for name, matrix in matrices.items()}
        self.sources = {name: figures.heatmap_source(fig) for name, fig in self.figures.items()}
        self.layout = gridplot(list(self.figures.values()), ncols=2, toolbar_location=None)
        self.status = ipywidgets.HTML()
        self._widget = None
        self.updates = 0
        self.error = None
        self.snapshots = []
        self._batches_seen = 0
        self._epoch = 0
        self._next_allowed = 0.0
        self.time_spent = 0.0
        self._latest = {
            name: (matrix, self.figures[name].title.text) for name, matrix in matrices.items()
        }
        self.frames = collections.deque(maxlen=int(max_frames))
        self.replay = ipywidgets.IntSlider(
            value=0, min=0, max=0, description="frame", continuous_update=True
        )
        self._following = False
        self.replay.observe(self._on_replay, names="value")
        self._record("before training", matrices)
        self._writer = None
        self._pending = []
        self.snapshot_time = 0.0
        self._fit_start = None
        self._snapshot_directory = None
        self._skipped_snapshot = None
        self._update_budget = self.overhead_budget

    def _probe(self):
        """The probe call's captured weights, checked against `example`, `head` and `view`."""
        self._check_probe_shape()
        try:
            captured = _captured.call_and_capture(self.target, self.probe_inputs)
        except Exception as error:
            raise ValueError(
                f"LiveAttention: calling '{self.target.name}' on `probe_inputs` failed "
                f"({type(error).__name__}: {error}). Received: probe_inputs of shape "
                f"{_shapes(self.probe_inputs)}"
            ) from error
        self._check_example_and_head(captured)
        if self.view == "rollout" and not _captured.stacked_self_attention(
            {name: np.shape(w)[-2:] for name, w in captured.items()}
        ):
            raise ValueError(
                "LiveAttention: `view='rollout'` needs two or more self-attention layers "
                "over the same tokens; the probe call recorded "
                f"{ {name: tuple(np.shape(w)) for name, w in captured.items()} }. "
                f"Received: view={self.view!r}"
            )
        return captured

    def _heatmap(self, name, matrix):
        """The heatmap of one layer's (or the rollout's) `(Tq, Tv)` weights before training."""
        rows, cols = matrix.shape
        query_labels = _tokens(self.query_tokens, rows) or [str(rows - 1)]
        # Updates lengthen the title ("<name> · epoch 10 batch 500 · loss 0.1234"): room
        # for it after the query labels, where the title starts, or its end is cut.
        title_room = 30 + 7 * max(len(str(t)) for t in query_labels)
        title_room += int(7.5 * len(f"{name} · epoch 100 batch 1000 · loss 0.0000"))
        low, high = _colors(matrix, self.color_range)
        return figures.heatmap(
            matrix,
            _tokens(self.key_tokens, cols),
            _tokens(self.query_tokens, rows),
            title=f"{name}: before training",
            width=max(320, min(900, 22 * cols + 140), title_room),
            height=max(280, min(900, 22 * rows + 120)),
            low=low,
            high=high,
        )

    # ------------------------------------------------------------------ API

    @property
    def widget(self):
        if self._widget is None:
            self.bokeh_widget = BokehModel(self.layout)
            self._widget = ipywidgets.VBox([self.status, self.replay, self.bokeh_widget])
        return self._widget

    def show_frame(self, index):
        """Draw frame `index` of the history (negative counts from the newest)."""
        title, matrices = self.frames[index]
        _frames.apply_frame(
            self._frame_models(self.sources, self.figures),
            _frame(title, matrices, self.color_range),
        )

    def standalone_layout(self):
        """A Bokeh document replaying every recorded frame without a kernel (`export_html`)."""
        from bokeh.document import Document
        from bokeh.layouts import column

        panels = {}
        for name, fig in self.figures.items():
            rows, cols = self._latest[name][0].shape
            panels[name] = figures.heatmap(
                np.zeros((rows, cols)),
                _tokens(self.key_tokens, cols),
                _tokens(self.query_tokens, rows),
                title=name,
                width=fig.width,
                height=fig.height,
            )
            figures.heatmap_source(panels[name]).name = f"frame_source_{name}"
        frames = {
            _frames.frame_key(index): _frame(title, matrices, self.color_range)
            for index, (title, matrices) in enumerate(self.frames)
        }
        slider = _frames.frame_slider(0, len(frames) - 1, title="frame", name="frame_slider")
        sources = {name: figures.heatmap_source(fig) for name, fig in panels.items()}
        callback = _frames.swap_frame_callback(
            self._frame_models(sources, panels), frames, [slider]
        )
        slider.js_on_change("value", callback)
        document = Document()
        document.add_root(
            column(slider, gridplot(list(panels.values()), ncols=2, toolbar_location=None))
        )
        document.js_on_event("document_ready", callback)
        return document

    @staticmethod
    def _frame_models(sources, figures_by_name):
        return {
            **{f"source:{name}": source for name, source in sources.items()},
            **{f"title:{name}": fig.title for name, fig in figures_by_name.items()},
            **{
                f"colors:{name}": fig.select_one({"type": LinearColorMapper})
                for name, fig in figures_by_name.items()
            },
        }

    def compute(self):
        """`{layer_name: (Tq, Tv)}` attention of the probe example, now
        (`{"rollout": (L, L)}` with `view="rollout"`)."""
        return self._matrices(_captured.call_and_capture(self.target, self.probe_inputs))

    def _matrices(self, captured):
        per_head = {name: _captured.per_head(w, self.example) for name, w in captured.items()}
        if self.view == "rollout":
            stacked = _captured.stacked_self_attention({n: w.shape for n, w in per_head.items()})
            rollout = _captured.combined_attention(
                "rollout", [per_head[name] for name in stacked], self.head
            )
            return {"rollout": rollout.astype("float32")}
        return {
            name: heads.mean(axis=0) if self.head is None else heads[self.head]
            for name, heads in per_head.items()
        }

    def update(self, title_suffix=""):
        """Recompute the probe attention and patch every heatmap in place."""
        # On JAX, fit keeps the newest weights outside the model mid-epoch;
        # reading `Callback.model` syncs them back before the probe call.
        self._has_model()
        for name, matrix in self.compute().items():
            values = matrix.ravel().astype("float64").tolist()
            self.sources[name].patch({"weight": [(slice(0, len(values)), values)]})
            title = f"{name} · {title_suffix}" if title_suffix else name
            self.figures[name].title.text = title
            mapper = self.figures[name].select_one({"type": LinearColorMapper})
            mapper.low, mapper.high = _colors(matrix, self.color_range)
            self._latest[name] = (matrix, title)
        self.updates += 1
        self._record(
            title_suffix or f"update {self.updates}",
            {name: m for name, (m, _) in self._latest.items()},
        )

    def _record(self, title, matrices):
        self.frames.append(
            (title, {name: np.array(m, dtype="float32") for name, m in matrices.items()})
        )
        # The slider follows the newest frame (updates during fit arrive here).
        self._following = True
        try:
            self.replay.max = len(self.frames) - 1
            self.replay.value = len(self.frames) - 1
        finally:
            self._following = False

    def _on_replay(self, change):
        if not self._following:
            self.show_frame(change["new"])

    # ------------------------------------------------------------ callbacks

    def on_train_begin(self, logs=None):
        self._fit_start = time.perf_counter()
        directory = self.snapshot_dir
        if directory is None and not in_notebook():
            directory = "attention_snapshots"
        self._snapshot_directory = directory
        # Snapshots take a third of the budget; the updates keep the rest.
        self._update_budget = self.overhead_budget * (1.0 if directory is None else 2.0 / 3.0)
        self._skipped_snapshot = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        # Updates run before a batch, not after one: overriding
        # `on_train_batch_end` would make Keras wait for every step's logs
        # (no asynchronous dispatch). `batch` batches of this epoch are done.
        if self.error is not None or batch == 0:
            return
        self._batches_seen += 1
        if self._batches_seen % self.every_n_batches:
            return
        now = time.perf_counter()
        if now < self._next_allowed:
            return
        self._guarded_update(f"epoch {self._epoch + 1} batch {batch}{_loss(self._running_logs())}")
        cost = time.perf_counter() - now
        self.time_spent += cost
        self._next_allowed = now + max(self.min_interval_s, cost / self._update_budget)

    def on_epoch_end(self, epoch, logs=None):
        if self.error is not None:
            return
        start = time.perf_counter()
        self._guarded_update(f"epoch {epoch + 1} end{_loss(logs)}")
        # The epoch-end update always runs; it counts against the budget too,
        # so short epochs do not add its cost on top of the batch updates'.
        self._next_allowed = max(
            self._next_allowed, start + (time.perf_counter() - start) / self._update_budget
        )
        if self._fit_start is None:  # epoch hooks called without fit
            self.on_train_begin()
        directory = self._snapshot_directory
        if directory is not None and self.error is None:
            snapshot = (
                os.path.join(directory, f"epoch_{epoch + 1:03d}.html"),
                dict(self._latest),
                epoch + 1,
            )
            # A snapshot may cost what the last one did; written only while
            # the writer stays inside its share of the budget.
            share = self.overhead_budget - self._update_budget
            elapsed = time.perf_counter() - self._fit_start
            in_flight = self._pending and not self._pending[-1][1].done()
            if (
                self._snapshots_submitted == 0
                or not in_flight
                and (self.snapshot_time + self._last_snapshot_cost <= share * elapsed)
            ):
                self._submit_snapshot(*snapshot)
                self._skipped_snapshot = None
            else:
                self._skipped_snapshot = snapshot
        self.time_spent += time.perf_counter() - start

    def on_train_end(self, logs=None):
        if self._skipped_snapshot is not None and self.error is None:
            # The last epoch's snapshot is always written; training is over.
            self._submit_snapshot(*self._skipped_snapshot)
            self._skipped_snapshot = None
        self.wait_for_snapshots()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def wait_for_snapshots(self):
        """Block until every snapshot queued so far is written (called at the end of `fit`)."""
        pending, self._pending = self._pending, []
        for path, future in pending:
            try:
                future.result()
                self.snapshots.append(path)
            except Exception as error:
                if self.error is None:
                    self._report(error)

    _last_snapshot_cost = 0.0
    _snapshots_submitted = 0

    def _submit_snapshot(self, path, latest, epoch):
        # Serialising a Bokeh document takes ~0.1 s: a worker thread does it
        # from a copy of the latest matrices so training does not wait.
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, "live_attention_snapshot")
        self._snapshots_submitted += 1
        self._pending.append((path, self._writer.submit(self._write_snapshot, path, latest, epoch)))

    def _write_snapshot(self, path, latest, epoch):
        start = time.thread_time()
        try:
            self._render_snapshot(path, latest, epoch)
        finally:
            cost = time.thread_time() - start
            self._last_snapshot_cost = cost
            self.snapshot_time += cost

    def _render_snapshot(self, path, latest, epoch):
        panels = []
        for name, (matrix, title) in latest.items():
            rows, cols = matrix.shape
            low, high = _colors(matrix, self.color_range)
            panels.append(
                figures.heatmap(
                    matrix,
                    _tokens(self.key_tokens, cols),
                    _tokens(self.query_tokens, rows),
                    title=title,
                    width=self.figures[name].width,
                    height=self.figures[name].height,
                    low=low,
                    high=high,
                )
            )
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        export_html(
            gridplot(panels, ncols=2, toolbar_location=None),
            path,
            title=f"Attention after epoch {epoch}",
        )

    # -------------------------------------------------------------- helpers

    def _running_logs(self):
        """The running epoch metrics (what `logs` holds at a batch end)."""
        try:
            return self.model.get_metrics_result()
        except Exception:  # a model without compiled metrics: no loss in the title
            return None

    def _has_model(self):
        try:
            return self.model is not None
        except AttributeError:
            return False

    def _guarded_update(self, title_suffix):
        try:
            self.update(title_suffix)
            self.status.value = f"<small>{escape(title_suffix)} (update {self.updates})</small>"
        except Exception as error:  # never stop training because of a drawing problem
            self._report(error)

    def _report(self, error):
        self.error = error
        message = (
            f"LiveAttention stopped updating after an error ({type(error).__name__}: {error}); "
            "training continues."
        )
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.status.value = f"<b style='color:#a00'>{escape(message)}</b>"

    def _check_example_and_head(self, captured):
        """`example` and `head` against what the probe call captured."""
        for name, weights in captured.items():
            shape = np.shape(weights)
            if self.example >= shape[0]:
                raise ValueError(
                    f"LiveAttention: `example` must be in [0, {shape[0]}), the probe batch "
                    f"of '{name}'. Received: example={self.example}"
                )
            heads = shape[1] if len(shape) == 4 else 1
            if self.head is not None and self.head >= heads:
                raise ValueError(
                    f"LiveAttention: `head` must be None or in [0, {heads}): '{name}' has "
                    f"{heads} head{'s' if heads > 1 else ''}. Received: head={self.head}"
                )

    def _check_probe_shape(self):
        """Compare probe shapes with a built model's declared inputs, before any call."""
        inputs = (
            getattr(self.target, "inputs", None) if isinstance(self.target, keras.Model) else None
        )
        if not inputs:
            return
        probes = keras.tree.flatten(self.probe_inputs)
        expected = [tuple(x.shape) for x in inputs]
        received = [tuple(np.shape(p)) for p in probes]
        if len(expected) != len(received) or any(
            len(e) != len(r) or any(d is not None and d != s for d, s in zip(e, r, strict=True))
            for e, r in zip(expected, received, strict=True)
        ):
            raise ValueError(
                f"LiveAttention: `probe_inputs` must match the input shape of '{self.target.name}' "
                f"{expected if len(expected) > 1 else expected[0]}. "
                f"Received: probe_inputs of shape {received if len(received) > 1 else received[0]}"
            )


def _frame(title, matrices, color_range):
    """A recorded frame's heatmaps, titles and colour scales (`_frames`): what the
    replay slider shows live and in the export."""
    props = {}
    for name, matrix in matrices.items():
        low, high = _colors(matrix, color_range)
        props[f"title:{name}"] = {"text": f"{name} · {title}"}
        props[f"colors:{name}"] = {"low": low, "high": high}
    return {
        "data": {
            f"source:{name}": {"weight": np.asarray(m, "float64").ravel().tolist()}
            for name, m in matrices.items()
        },
        "props": props,
    }


def _checked_options(
    view, color_range, every_n_batches, min_interval_s, overhead_budget, max_frames
):
    """LiveAttention's scalar options, checked and normalised."""
    if view not in ("layers", "rollout"):
        raise ValueError(
            f"LiveAttention: `view` must be 'layers' or 'rollout'. Received: view={view!r}"
        )
    color_range = _check_color_range(color_range)
    if color_range == "auto":
        color_range = "fit" if view == "rollout" else (0.0, 1.0)
    if not validation.is_int(every_n_batches) or every_n_batches < 1:
        raise ValueError(
            "LiveAttention: `every_n_batches` must be an integer >= 1. "
            f"Received: every_n_batches={every_n_batches!r}"
        )
    if not validation.is_real(min_interval_s) or not min_interval_s >= 0:
        raise ValueError(
            "LiveAttention: `min_interval_s` must be a number >= 0. "
            f"Received: min_interval_s={min_interval_s!r}"
        )
    if not validation.is_real(overhead_budget) or not 0 < overhead_budget <= 1:
        raise ValueError(
            "LiveAttention: `overhead_budget` must be in (0, 1]. "
            f"Received: overhead_budget={overhead_budget!r}"
        )
    if not validation.is_int(max_frames) or max_frames < 1:
        raise ValueError(
            "LiveAttention: `max_frames` must be an integer >= 1. "
            f"Received: max_frames={max_frames!r}"
        )
    return (
        view,
        color_range,
        int(every_n_batches),
        float(min_interval_s),
        float(overhead_budget),
        int(max_frames),
    )


def _check_color_range(color_range):
    if isinstance(color_range, str) and color_range in ("auto", "fit"):
        return color_range
    if (
        isinstance(color_range, (tuple, list))
        and len(color_range) == 2
        and all(validation.is_real(v) and np.isfinite(v) for v in color_range)
        and color_range[0] < color_range[1]
    ):
        return float(color_range[0]), float(color_range[1])
    raise ValueError(
        "LiveAttention: `color_range` must be 'auto', 'fit' or (low, high) with low < high. "
        f"Received: color_range={color_range!r}"
    )


def _colors(matrix, color_range):
    """`(low, high)` of a heatmap's colours: fixed, or fitted to `matrix` (0 included)."""
    if color_range != "fit":
        return color_range
    finite = np.asarray(matrix, "float64")
    finite = finite[np.isfinite(finite)]
    if not finite.size:
        return 0.0, 1.0
    low = min(0.0, float(finite.min()))
    return low, max(float(finite.max()), low + 1e-9)


def _loss(logs):
    if logs and "loss" in logs:
        try:
            return f" · loss {float(logs['loss']):.4f}"
        except (TypeError, ValueError):
            return ""
    return ""


def _tokens(tokens, length):
    return list(tokens) if tokens is not None and len(tokens) == length else None


def _shapes(inputs):
    if isinstance(inputs, (list, tuple)):
        return [_shapes(x) for x in inputs]
    return tuple(np.shape(inputs))
