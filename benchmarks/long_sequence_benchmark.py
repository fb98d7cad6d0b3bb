"""Time and peak memory of long-sequence attention, forward + backward.

Compares, in one run, `SparseAttention`, `PerformerAttention`, our exact
`MultiHeadAttention` and `keras.layers.MultiHeadAttention`: 8 heads,
key_dim 64 (model width 512), batch 1, self-attention, at L = 1024 ... 65536,
TensorFlow backend, graph mode (`tf.function`).

Each (layer, length) runs in its own subprocess, so the peak resident set
size (`ru_maxrss`) belongs to that configuration alone; we report it both in
total and above the process's RSS just before the first call (TensorFlow,
Keras and the built layer). A step is the gradient of `sum(output^2)` with
respect to the input and every trainable weight; after one warm-up step
(tracing) we time `--repeats` steps and keep the fastest. Configurations whose
dense `L x L` scores alone would exceed `--dense-budget-gb` are not started,
a run whose time, extrapolated from the two previous lengths, would exceed
`--timeout` seconds is not started, and any run longer than that is stopped;
all are reported as such.

Usage:
    KERAS_BACKEND=tensorflow flock /tmp/heavy.lock \
        python benchmarks/long_sequence_benchmark.py [--lengths 1024 ... 65536]

Prints a table with time ratios against our exact MultiHeadAttention and
writes `benchmarks/long_sequence.png` (log-log time and memory vs L).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

NUM_HEADS, KEY_DIM = 8, 64
LAYERS = ("sparse", "performer", "ours_exact", "keras_exact")
LABELS = {
    "sparse": "SparseAttention",
    "performer": "PerformerAttention",
    "ours_exact": "our MultiHeadAttention (exact)",
    "keras_exact": "keras.layers.MultiHeadAttention",
}
DENSE = ("keras_exact",)  # stores (B, H, L, L) scores


def _rss_mib():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _current_rss_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def make_layer(kind):
    import keras_attention  # first: a quiet TensorFlow start

    # isort: split
    import keras

    if kind == "keras_exact":
        return keras.layers.MultiHeadAttention(NUM_HEADS, KEY_DIM)

    if kind == "sparse":
        return keras_attention.SparseAttention(NUM_HEADS, KEY_DIM, seed=0)
    if kind == "performer":
        return keras_attention.PerformerAttention(NUM_HEADS, KEY_DIM, seed=0)
    if kind == "ours_exact":
        return keras_attention.MultiHeadAttention(NUM_HEADS, KEY_DIM)
    raise ValueError(kind)


def worker(kind, length, repeats):
    """Runs in a subprocess; prints one JSON line."""
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    import numpy as np
    import tensorflow as tf

    layer = make_layer(kind)
    x = tf.constant(
        np.random.default_rng(0).standard_normal((1, length, NUM_HEADS * KEY_DIM)),
        dtype="float32",
    )
    shape = (1, length, NUM_HEADS * KEY_DIM)
    if kind == "keras_exact":
        layer.build(shape, shape)
    else:
        layer.build(shape)
    weights = layer.trainable_variables

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x) if kind == "keras_exact" else layer(x)
            loss = tf.reduce_sum(tf.square(y))
        grads = tape.gradient(loss, [x] + weights)
        return loss, grads

    base_rss = _current_rss_mib()
    start = time.perf_counter()
    loss, grads = step(x)
    _ = float(loss)
    first = time.perf_counter() - start
    times = []
    # A slow configuration is timed once: the first call is already far
    # longer than its tracing.
    for _ in range(repeats if first < 60 else 1):
        start = time.perf_counter()
        loss, grads = step(x)
        _ = [g.numpy() for g in grads[:1]]
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "kind": kind,
                "length": length,
                "seconds": min(times),
                "first_call_seconds": first,
                "peak_rss_mib": _rss_mib(),
                "base_rss_mib": base_rss,
                "finite": bool(np.isfinite(float(loss))),
            }
        )
    )


def run_one(kind, length, repeats, timeout):
    command = [sys.executable, __file__, "--worker", kind, str(length), "--repeats", str(repeats)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=os.environ
        )
    except subprocess.TimeoutExpired:
        return {"kind": kind, "length": length, "status": f"timeout > {timeout} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            result["status"] = "ok"
            return result
    tail = (done.stderr or "").strip().splitlines()[-1:] or ["?"]
    status = (
        "out of memory"
        if done.returncode in (-9, 137)
        or "OOM" in done.stderr
        or "MemoryError" in done.stderr
        or "ResourceExhausted" in done.stderr
        else f"failed: {tail[0][:120]}"
    )
    return {"kind": kind, "length": length, "status": status}


def predicted(results, kind, length, repeats):
    """Wall time of a run at `length`, extrapolated from the last two lengths."""
    done = sorted(
        (r for r in results if r["kind"] == kind and r["status"] == "ok"), key=lambda r: r["length"]
    )
    if len(done) < 2:
        return 0.0
    (l0, t0), (l1, t1) = [(r["length"], r["seconds"]) for r in done[-2:]]
    exponent = max(1.0, math.log(t1 / t0) / math.log(l1 / l0))
    step = t1 * (length / l1) ** exponent
    return step * (2 if step > 60 else 1 + repeats)


def dense_gib(length):
    """Memory of the stored (1, H, L, L) float32 scores and their gradient."""
    return 2 * NUM_HEADS * length * length * 4 / 2**30


def table(results, lengths, kinds):
    by = {(r["kind"], r["length"]): r for r in results}
    lines = [
        "| L | "
        + " | ".join(f"{LABELS[k]} s (peak RSS / above base, MiB)" for k in kinds)
        + " | exact/sparse | exact/performer | keras/sparse | keras/performer |",
        "|" + "---|" * (len(kinds) + 5),
    ]
    for length in lengths:
        cells = []
        for kind in kinds:
            r = by.get((kind, length))
            if r is None:
                cells.append("-")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                cells.append(
                    f"{r['seconds']:.3g} ({r['peak_rss_mib']:.0f} / "
                    f"{r['peak_rss_mib'] - r['base_rss_mib']:.0f})"
                )

        def ratio(a, b, length=length):
            ra, rb = by.get((a, length)), by.get((b, length))
            if not ra or not rb or ra["status"] != "ok" or rb["status"] != "ok":
                return "-"
            return f"{ra['seconds'] / rb['seconds']:.1f}x"

        lines.append(
            f"| {length} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(
                [
                    ratio("ours_exact", "sparse"),
                    ratio("ours_exact", "performer"),
                    ratio("keras_exact", "sparse"),
                    ratio("keras_exact", "performer"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def plot(results, kinds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind in kinds:
        ok = sorted(
            (r for r in results if r["kind"] == kind and r["status"] == "ok"),
            key=lambda r: r["length"],
        )
        if not ok:
            continue
        lengths = [r["length"] for r in ok]
        left.plot(lengths, [r["seconds"] for r in ok], marker="o", label=LABELS[kind])
        right.plot(lengths, [r["peak_rss_mib"] / 1024 for r in ok], marker="o", label=LABELS[kind])
    for axis, name in ((left, "forward+backward time (s)"), (right, "peak RSS (GiB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("sequence length L")
        axis.set_ylabel(name)
        axis.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle("8 heads, key_dim 64, batch 1, TF graph mode, 2-core CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"saved {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "LENGTH"))
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536]
    )
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=LAYERS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--dense-budget-gb", type=float, default=12.0)
    parser.add_argument("--json", default=None, help="also write raw results here")
    parser.add_argument(
        "--plot", default=os.path.join(os.path.dirname(__file__), "long_sequence.png")
    )
    parser.add_argument(
        "--verbose",
        type=int,
        choices=(0, 1, 2),
        default=1,
        help="1: a keras.utils.Progbar over the runs (default); 2: one JSON "
        "line per run as it finishes; 0: only the final table",
    )
    parser.add_argument(
        "--replot",
        metavar="JSON",
        default=None,
        help="only redraw --plot from the results a --json run wrote",
    )
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as handle:
            results = json.load(handle)
        kinds = [kind for kind in LAYERS if any(r["kind"] == kind for r in results)]
        plot(results, kinds, args.plot)
        print(f"redrew {args.plot} from {args.replot}")
        return
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.repeats)
        return
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    import keras

    results = []
    skipped = set()
    runs = [(length, kind) for length in args.lengths for kind in args.layers]
    progress = keras.utils.Progbar(len(runs), unit_name="run") if args.verbose == 1 else None
    for length, kind in runs:
        if kind in DENSE and dense_gib(length) > args.dense_budget_gb:
            result = {
                "kind": kind,
                "length": length,
                "status": f"not run: needs > {dense_gib(length):.0f} GiB",
            }
        elif kind in skipped:
            result = {
                "kind": kind,
                "length": length,
                "status": "not run (shorter length timed out)",
            }
        elif predicted(results, kind, length, args.repeats) > args.timeout:
            result = {
                "kind": kind,
                "length": length,
                "status": "not run: predicted "
                f"{predicted(results, kind, length, args.repeats):.0f} s "
                f"> {args.timeout:.0f} s",
            }
        else:
            result = run_one(kind, length, args.repeats, args.timeout)
            if result["status"].startswith("timeout"):
                skipped.add(kind)
        results.append(result)
        if progress is not None:
            progress.add(1)
        elif args.verbose == 2:
            print(json.dumps(result), flush=True)
    print()
    print(table(results, args.lengths, args.layers))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    plot(results, args.layers, args.plot)


if __name__ == "__main__":
    main()
