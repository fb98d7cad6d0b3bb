import concurrent.futures
import os
import pathlib
import time
import types

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention.widgets import LiveAttention
from keras_attention.widgets import live_attention as live_attention_module


def make_model(length=6, features=4):
    model = keras.Sequential(
        [
            keras.Input((length, features)),
            keras_attention.LuongAttention(score="general", name="att"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    return model


def data(samples=32, length=6, features=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, length, features)).astype("float32")
    return x, x[:, :, :1].sum(axis=1)


def reference(model, probe):
    """Attention straight from the layer (not through capture_attention)."""
    layer = model.get_layer("att")
    _, weights = layer(probe, return_attention_scores=True)
    return keras.ops.convert_to_numpy(weights)[0]


class RecordingLiveAttention(LiveAttention):
    """Keeps what each update drew next to the layer's own weights at that moment."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drawn = []

    def update(self, title_suffix=""):
        super().update(title_suffix)
        cells = np.asarray(self.sources["att"].data["weight"]).reshape(6, 6)
        self.drawn.append(
            (cells, reference(self.model, self.probe_inputs), self.figures["att"].title.text)
        )


@pytest.fixture
def no_snapshots(monkeypatch):
    """As in a notebook: no snapshots, so the updates keep the whole budget."""
    monkeypatch.setattr(live_attention_module, "in_notebook", lambda: True)


def test_updates_patch_every_cell_with_the_current_attention(fake_comm, no_snapshots):
    model = make_model()
    x, y = data()
    callback = RecordingLiveAttention(
        model, x[:2], every_n_batches=3, min_interval_s=0, overhead_budget=1.0, snapshot_dir=None
    )
    comm = callback.widget.children[2].comm
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
    # 8 batches per epoch, checked before batches 2..8 of each epoch: after 3 and 6
    # done in epoch 1, after 2 and 5 done in epoch 2 (counting goes on), plus each epoch's end.
    assert callback.updates == 6
    for cells, expected, _ in callback.drawn:
        np.testing.assert_allclose(cells, expected, rtol=1e-5, atol=1e-6)
    # Training moved the weights, so the drawn attention changed within the
    # epoch too (on JAX, that needs the callback to sync the trainer's state).
    assert not np.allclose(callback.drawn[0][0], callback.drawn[1][0])
    titles = [title for *_, title in callback.drawn]
    assert titles[0].startswith("att · epoch 1 batch 3 · loss ")
    assert titles[2].startswith("att · epoch 1 end · loss ")
    assert titles[3].startswith("att · epoch 2 batch 2 · loss ")
    assert titles[-1].startswith("att · epoch 2 end · loss ")
    patches = [str(m) for m in comm.messages if "ColumnsPatched" in str(m)]
    assert len(patches) == 6 and '"start":0,"stop":36' in patches[0]


def test_every_update_is_kept_and_the_slider_replays_it(fake_comm, no_snapshots):
    model = make_model()
    x, y = data()
    callback = RecordingLiveAttention(
        model, x[:2], every_n_batches=3, min_interval_s=0, overhead_budget=1.0, snapshot_dir=None
    )
    callback.widget  # noqa: B018 - the slider lives in the widget
    assert callback.figures["att"].title.text == "att: before training"  # the first draw
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
    assert len(callback.frames) == 1 + callback.updates
    assert callback.frames[0][0] == "before training"
    # During fit the slider followed the newest frame.
    assert callback.replay.max == callback.updates and callback.replay.value == callback.updates
    for index, (cells, _, _) in enumerate(callback.drawn, start=1):
        np.testing.assert_allclose(callback.frames[index][1]["att"], cells, rtol=1e-6)
    callback.replay.value = 2
    np.testing.assert_allclose(
        np.reshape(callback.sources["att"].data["weight"], (6, 6)), callback.drawn[1][0], rtol=1e-6
    )
    assert callback.figures["att"].title.text == callback.drawn[1][2]


def test_the_history_is_bounded_by_max_frames(fake_comm, no_snapshots):
    model = make_model()
    x, y = data()
    callback = LiveAttention(
        model,
        x[:2],
        every_n_batches=1,
        min_interval_s=0,
        overhead_budget=1.0,
        snapshot_dir=None,
        max_frames=5,
    )
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
    assert callback.updates == 16 and len(callback.frames) == 5
    assert callback.frames[-1][0].startswith("epoch 2 end")


def test_defaults_give_a_short_fit_a_watchable_number_of_frames(fake_comm, monkeypatch):
    # A 2.5 s fit (50 batches of 50 ms) used to get 4 updates. The callback's
    # clock is simulated (updates cost nothing), so only the defaults throttle.
    clock = [0.0]
    monkeypatch.setattr(
        live_attention_module,
        "time",
        types.SimpleNamespace(perf_counter=lambda: clock[0], thread_time=time.thread_time),
    )
    model = make_model()
    x, y = data(samples=200)
    callback = LiveAttention(model, x[:2], snapshot_dir=None)
    tick = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: clock.__setitem__(0, clock[0] + 0.05)
    )
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[callback, tick], verbose=0)
    assert 8 <= callback.updates <= 12, callback.updates


def test_export_replays_every_frame(fake_comm, tmp_path):
    from keras_attention.widgets import export_html

    model = make_model()
    x, y = data(samples=8)
    callback = LiveAttention(
        model, x[:2], every_n_batches=1, min_interval_s=0, overhead_budget=1.0, snapshot_dir=None
    )
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
    html = pathlib.Path(export_html(callback, tmp_path / "live.html")).read_text(encoding="utf-8")
    assert html.count("epoch 2 end") >= 1 and "before training" in html
    for _, matrices in callback.frames:
        assert repr(float(matrices["att"][0, 0]))[:9] in html


def test_min_interval_throttles_batch_updates(fake_comm):
    model = make_model()
    x, y = data()
    callback = LiveAttention(
        model, x[:1], every_n_batches=1, min_interval_s=1000, snapshot_dir=None
    )
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
    assert callback.updates == 1 + 2  # after the first batch, then only the epoch ends


def test_an_error_is_reported_once_and_training_goes_on(fake_comm, monkeypatch):
    model = make_model()
    x, y = data()
    callback = LiveAttention(model, x[:2], every_n_batches=1, min_interval_s=0, overhead_budget=1.0)
    calls = []

    def broken_compute():
        calls.append(1)
        raise RuntimeError("drawing exploded")

    monkeypatch.setattr(callback, "compute", broken_compute)
    with pytest.warns(RuntimeWarning, match="drawing exploded.*training continues") as record:
        history = model.fit(x, y, batch_size=4, epochs=3, callbacks=[callback], verbose=0)
    assert len(history.history["loss"]) == 3
    assert len(calls) == 1 and len(record) == 1
    assert "drawing exploded" in callback.status.value


def test_outside_a_notebook_an_html_snapshot_is_written_per_epoch(fake_comm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = make_model()
    x, y = data(samples=8)
    callback = LiveAttention(model, x[:2])
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[callback], verbose=0)
    assert callback.snapshots == [
        os.path.join("attention_snapshots", f"epoch_00{i}.html") for i in (1, 2)
    ]
    html = (tmp_path / callback.snapshots[1]).read_text(encoding="utf-8")
    assert "epoch 2 end" in html


def test_inside_a_notebook_no_snapshot_is_written(fake_comm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(live_attention_module, "in_notebook", lambda: True)
    model = make_model()
    x, y = data(samples=8)
    callback = LiveAttention(model, x[:2])
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[callback], verbose=0)
    assert callback.snapshots == [] and not (tmp_path / "attention_snapshots").exists()


def test_a_single_layer_can_be_watched_with_a_query_value_probe(fake_comm):
    layer = keras_attention.LuongAttention(name="cross")
    query, value = (
        np.ones((2, 3, 4), "float32"),
        np.random.default_rng(1).normal(size=(2, 5, 4)).astype("float32"),
    )
    callback = LiveAttention(layer, (query, value))
    _, expected = layer(query, value, return_attention_scores=True)
    cells = np.asarray(callback.sources["cross"].data["weight"]).reshape(3, 5)
    np.testing.assert_allclose(cells, keras.ops.convert_to_numpy(expected)[0], rtol=1e-6)


@pytest.mark.parametrize("every_n_batches", [0, -2, 1.5, True, "10"])
def test_every_n_batches_below_one_is_rejected(every_n_batches, fake_comm):
    x, _ = data()
    with pytest.raises(ValueError, match=f"every_n_batches={every_n_batches!r}"):
        LiveAttention(make_model(), x[:2], every_n_batches=every_n_batches)


@pytest.mark.parametrize("max_frames", [0, 2.5, True])
def test_max_frames_below_one_is_rejected(max_frames, fake_comm):
    x, _ = data()
    with pytest.raises(ValueError, match=f"LiveAttention: `max_frames`.*max_frames={max_frames!r}"):
        LiveAttention(make_model(), x[:2], max_frames=max_frames)


def test_negative_min_interval_is_rejected(fake_comm):
    x, _ = data()
    with pytest.raises(ValueError, match="min_interval_s=-1"):
        LiveAttention(make_model(), x[:2], min_interval_s=-1)


def test_probe_of_the_wrong_shape_is_rejected_at_construction(fake_comm):
    x, _ = data(features=5)
    with pytest.raises(
        ValueError,
        match=r"input shape of '.*' \(None, 6, 4\).*Received: probe_inputs of shape \(2, 6, 5\)",
    ):
        LiveAttention(make_model(), x[:2])


def test_probe_the_model_cannot_take_is_rejected_at_construction(fake_comm):
    layer = keras_attention.LuongAttention(name="cross")
    with pytest.raises(
        ValueError, match=r"calling 'cross' on `probe_inputs` failed.*\[\(2, 3, 4\), \(2, 5, 7\)\]"
    ):
        LiveAttention(layer, (np.ones((2, 3, 4), "float32"), np.ones((2, 5, 7), "float32")))


def test_model_without_attention_layers_is_rejected(fake_comm):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="no keras_attention attention layers.*Sequential"):
        LiveAttention(model, np.ones((1, 3)))


def test_snapshots_stay_inside_their_share_of_the_budget(fake_comm, tmp_path, monkeypatch):
    # Each snapshot burns 0.2 s of CPU in the writer; epochs take a few ms.
    # A third of the 3% budget allows no second snapshot mid-fit, so only
    # the first and the last epoch's are written.
    monkeypatch.chdir(tmp_path)
    render = LiveAttention._render_snapshot

    def expensive_render(self, path, latest, epoch):
        stop = time.thread_time() + 0.2
        while time.thread_time() < stop:
            pass
        render(self, path, latest, epoch)

    monkeypatch.setattr(LiveAttention, "_render_snapshot", expensive_render)
    model = make_model()
    x, y = data(samples=8)
    callback = LiveAttention(model, x[:2])
    model.fit(x, y, batch_size=4, epochs=6, callbacks=[callback], verbose=0)
    assert callback.snapshots == [
        os.path.join("attention_snapshots", f"epoch_00{i}.html") for i in (1, 6)
    ]
    assert "epoch 6 end" in (tmp_path / callback.snapshots[1]).read_text(encoding="utf-8")
    assert callback.snapshot_time >= 0.4

    # A snapshot that costs (almost) nothing is written every epoch.
    def cheap_render(self, path, latest, epoch):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(str(epoch))

    monkeypatch.setattr(LiveAttention, "_render_snapshot", cheap_render)
    callback = LiveAttention(model, x[:2])

    class WriterCatchesUp(keras.callbacks.Callback):
        # Epochs of 8 samples take a few ms, and a third of 3% of that is
        # less than a file write: give each epoch 250 ms of training time, so
        # the budget at the second epoch's end is 5 ms, and a tiny write
        # (CI once measured more than the 1 ms that 50 ms epochs allowed)
        # fits it. On a loaded machine the writer thread may not have run by
        # the next epoch's end, and a snapshot still in flight rightly skips
        # that epoch's; let it finish so only the budget decides here.
        def on_epoch_begin(self, epoch, logs=None):
            time.sleep(0.25)
            concurrent.futures.wait([future for _, future in callback._pending])

    model.fit(x, y, batch_size=4, epochs=4, callbacks=[callback, WriterCatchesUp()], verbose=0)
    # Each cheap write stayed far inside the budget (a failure here says the
    # machine, not the budget logic, decided).
    assert callback._last_snapshot_cost < 0.005, callback._last_snapshot_cost
    assert len(callback.snapshots) == 4


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(example=3), r"`example` must be in \[0, 2\).*Received: example=3"),
        (dict(head=5), r"`head` must be None or in \[0, 1\): 'att' has 1 head.*head=5"),
        (dict(example=-1), r"`example` must be a non-negative integer.*example=-1"),
        (dict(head=1.5), r"`head` must be a non-negative integer or None.*head=1.5"),
        (dict(query_tokens=5), r"`query_tokens` must be a list of token strings"),
    ],
)
def test_example_and_head_out_of_range_blame_themselves(fake_comm, kwargs, pattern):
    x, _ = data()
    with pytest.raises((ValueError, TypeError), match=rf"^LiveAttention: {pattern}") as info:
        LiveAttention(make_model(), x[:2], **kwargs)
    assert "probe_inputs" not in str(info.value)


def test_a_head_of_a_multi_head_layer_is_drawn(fake_comm):
    layer = keras_attention.MultiHeadAttention(num_heads=2, key_dim=2, name="mha")
    query = np.random.default_rng(2).normal(size=(2, 3, 4)).astype("float32")
    callback = LiveAttention(layer, (query, query), example=np.int64(1), head=np.int64(1))
    _, expected = layer(query, query, return_attention_scores=True)
    cells = np.asarray(callback.sources["mha"].data["weight"]).reshape(3, 3)
    np.testing.assert_allclose(cells, keras.ops.convert_to_numpy(expected)[1, 1], rtol=1e-5)
    with pytest.raises(ValueError, match=r"^LiveAttention: `head` must be None or in \[0, 2\)"):
        LiveAttention(layer, (query, query), head=2)


def test_rollout_is_followed_during_fit(fake_comm, no_snapshots):
    from keras_attention import analysis

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 4)),
            keras_attention.MultiHeadAttention(2, 2, name="mha0"),
            keras_attention.MultiHeadAttention(2, 2, name="mha1"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    x, y = data()

    def expected_rollout():
        """Rollout of the two layers' own weights (not through capture_attention)."""
        first, second = model.get_layer("mha0"), model.get_layer("mha1")
        hidden, weights0 = first(x[:1], x[:1], return_attention_scores=True)
        _, weights1 = second(hidden, hidden, return_attention_scores=True)
        return analysis.attention_rollout([weights0, weights1])[0]

    callback = LiveAttention(
        model, x[:1], every_n_batches=4, min_interval_s=0, overhead_budget=1.0, view="rollout"
    )
    assert list(callback.sources) == ["rollout"]
    np.testing.assert_allclose(callback.frames[0][1]["rollout"], expected_rollout(), rtol=1e-5)
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[callback], verbose=0)
    assert callback.updates >= 2 and callback.figures["rollout"].title.text.startswith(
        "rollout · epoch 1 end"
    )
    drawn = np.reshape(callback.sources["rollout"].data["weight"], (6, 6))
    np.testing.assert_allclose(drawn, expected_rollout(), rtol=1e-5)
    assert not np.allclose(callback.frames[0][1]["rollout"], drawn, atol=1e-4)  # it followed
    # Rollout peaks far below 1: its colours span what it shows, at each update and in
    # every replayed and exported frame (a fixed 0-1 scale drew it in one dark colour).
    assert colour_scale(callback.figures["rollout"]) == pytest.approx((0.0, drawn.max()))
    assert drawn.max() < 0.9
    first = callback.frames[0][1]["rollout"]
    callback.show_frame(0)
    assert colour_scale(callback.figures["rollout"]) == pytest.approx((0.0, first.max()))
    exported = callback.standalone_layout().select_one({"name": "swap_frame"}).args["frames"]
    assert exported["0"]["props"]["colors:rollout"] == pytest.approx(
        {"low": 0.0, "high": first.max()}
    )
    with pytest.raises(ValueError, match=r"^LiveAttention: `view` must be .*view='flow'"):
        LiveAttention(model, x[:1], view="flow")
    # One layer is no stack to roll out.
    with pytest.raises(ValueError, match=r"view='rollout'. needs two or more self-attention"):
        LiveAttention(make_model(), x[:1], view="rollout")


def colour_scale(fig):
    from bokeh.models import LinearColorMapper

    mapper = fig.select_one({"type": LinearColorMapper})
    return mapper.low, mapper.high


@pytest.mark.parametrize(
    "color_range, expected",
    [("auto", lambda m: (0.0, 1.0)), ("fit", lambda m: (0.0, m.max())), ((0.1, 0.4), None)],
)
def test_the_colour_range_is_the_readers_choice(fake_comm, no_snapshots, color_range, expected):
    x, _ = data()
    callback = LiveAttention(make_model(), x[:1], color_range=color_range)
    weights = reference(callback.target, x[:1])
    expected = color_range if expected is None else expected(weights)
    assert colour_scale(callback.figures["att"]) == pytest.approx(expected)


@pytest.mark.parametrize("color_range", ["wide", (1.0, 0.0), (0.0, float("nan")), (0, 1, 2), 1])
def test_a_bad_colour_range_is_refused(fake_comm, color_range):
    x, _ = data()
    with pytest.raises(ValueError, match=r"^LiveAttention: `color_range` must be .*Received"):
        LiveAttention(make_model(), x[:1], color_range=color_range)
