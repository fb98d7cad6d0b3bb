"""Overhead of LiveAttention on `fit`: training time with and without the callback.

Same model, data and run; the variants alternate in a rotating order so that
drift on a shared machine hits all of them, and the median epoch time of each
is compared. The time training waited inside the callback's hooks is reported
too: it is the direct cost, free of the machine's noise. Every variant starts
from the same weights, and the first epoch (tracing / XLA compilation) is
dropped.

Settings:
- `default`: `LiveAttention(model, probe)` with its defaults
  (every_n_batches=1, min_interval_s=0.25, overhead_budget=0.03, frames
  kept for replay), widget built (patches are serialised for the comm), no
  snapshots: the notebook case.
- `script`: the defaults outside a notebook, writing one HTML snapshot per epoch
  (serialised by a worker thread).
- `stress`: every_n_batches=1, min_interval_s=0: only the overhead budget
  throttles updates.

Run: flock /tmp/heavy.lock python benchmarks/live_attention_overhead.py
"""

import argparse
import os
import statistics
import tempfile
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")

import keras_attention  # noqa: E402  (first: a quiet TensorFlow start)

# isort: split
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention.widgets import LiveAttention  # noqa: E402


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def make_model(length, vocabulary, dim):
    inputs = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, dim)(inputs)
    x = keras_attention.AdditiveAttention(units=dim, name="attention")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(vocabulary)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def run(variant, args, data, initial_weights, snapshot_root):
    x, y = data
    model = make_model(args.length, args.vocabulary, args.dim)
    model.set_weights(initial_weights)
    timer = EpochTimer()
    callbacks = [timer]
    live = None
    if variant != "baseline":
        options = {"snapshot_dir": None}
        if variant == "script":
            options["snapshot_dir"] = tempfile.mkdtemp(dir=snapshot_root)
        if variant == "stress":
            options.update(every_n_batches=1, min_interval_s=0)
        live = LiveAttention(model, x[:2], **options)
        if variant != "script":
            live.widget  # noqa: B018 - builds the BokehModel so patches are serialised
            # Outside a notebook snapshots would be written; the notebook case has none.
            live.snapshot_dir = None
            import keras_attention.widgets.live_attention as module

            module.in_notebook = lambda: True
        callbacks.insert(0, live)
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks, verbose=0)
    # Time the callback itself spent per measured epoch (training waits for it).
    spent = live.time_spent * (args.epochs - 1) / args.epochs if live else 0.0
    return timer.times[1:], (live.updates if live else 0), spent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--vocabulary", type=int, default=200)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.integers(0, args.vocabulary, size=(args.samples, args.length)).astype("int32")
    y = x[:, 0]
    initial_weights = make_model(args.length, args.vocabulary, args.dim).get_weights()
    variants = ["baseline", "default", "script", "stress"]
    epoch_times = {v: [] for v in variants}
    updates = {v: [] for v in variants}
    spent = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as snapshot_root:
        for repeat in range(args.repeats):
            # Rotate the order so that no variant always runs first or last.
            for variant in variants[repeat % 4 :] + variants[: repeat % 4]:
                times, count, seconds = run(variant, args, (x, y), initial_weights, snapshot_root)
                epoch_times[variant].extend(times)
                updates[variant].append(count)
                spent[variant].append(seconds / len(times))

    backend = keras.backend.backend()
    batches = args.samples // args.batch_size
    print(
        f"backend={backend} batches/epoch={batches} epochs={args.epochs} (first dropped) "
        f"repeats={args.repeats} batch={args.batch_size} length={args.length} dim={args.dim}"
    )
    base = statistics.median(epoch_times["baseline"])
    print(
        "overhead = median epoch time / baseline median - 1 "
        "(wall clock, noisy on a shared machine);"
    )
    print(
        "in-callback = seconds training waited inside LiveAttention per epoch "
        "/ baseline median epoch"
    )
    print(
        f"{'variant':10s} {'median epoch s':>15s} {'overhead':>9s} "
        f"{'in-callback':>12s} {'updates/run':>12s}"
    )
    for variant in variants:
        median = statistics.median(epoch_times[variant])
        inside = statistics.mean(spent[variant]) / base
        print(
            f"{variant:10s} {median:15.4f} {100 * (median / base - 1):8.2f}% {100 * inside:11.2f}% "
            f"{statistics.mean(updates[variant]):12.1f}"
        )


if __name__ == "__main__":
    main()
