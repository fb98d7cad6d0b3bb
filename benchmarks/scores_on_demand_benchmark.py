"""Peak memory of attention weights on demand vs the dense path's full weights.

Self-attention, batch 1, 8 heads of 64 (width 512), float32, TensorFlow graph
mode (`tf.function`), forward only (what a notebook inspecting weights runs).
"on demand": `return_attention_scores=True, attention_scores_heads=[0],
attention_scores_query_range=(0, rows)` with `memory_efficient=True`: the
output comes from the blockwise kernel and only `(1, 1, rows, L)` weights are
formed. "dense": `return_attention_scores=True` with `memory_efficient=False`,
all `(1, 8, L, L)` weights (what Keras' layer returns). Each measurement runs
in its own child process; the figure is that process' peak RSS (TensorFlow's
own ~0.7 GiB included). Children cap their data segment so an attempt that
does not fit fails as OOM instead of waking the OOM killer.

Usage (from the repository root):

    python benchmarks/scores_on_demand_benchmark.py --lengths 4096,16384 --rows 256
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HEADS, KEY_DIM = 8, 64


def _child(args):
    limit = int(args.memory_cap_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    import keras_attention

    length = args.length
    on_demand = args.which == "on_demand"
    layer = keras_attention.MultiHeadAttention(HEADS, KEY_DIM, memory_efficient=on_demand)
    x = tf.constant(
        np.random.default_rng(0).standard_normal((1, length, HEADS * KEY_DIM)),
        tf.float32,
    )
    selection = (
        dict(attention_scores_heads=[0], attention_scores_query_range=(0, args.rows))
        if on_demand
        else {}
    )

    @tf.function
    def run(x):
        out, scores = layer(x, return_attention_scores=True, **selection)
        return tf.reduce_sum(out), scores[0, 0, : args.rows]

    start = time.perf_counter()
    try:
        total, rows = run(x)
        rows = rows.numpy()
    except (tf.errors.ResourceExhaustedError, MemoryError) as error:
        print(json.dumps({"oom": type(error).__name__}))
        return
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "peak_mib": round(peak),
                "seconds": round(elapsed, 2),
                "row_sums": float(np.abs(rows.sum(-1) - 1).max()),
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--memory-cap-gib", type=float, default=20)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--which", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    print(f"{'L':>6} {'path':>10} {'peak MiB':>9} {'seconds':>8}  weights returned")
    for length in [int(n) for n in args.lengths.split(",")]:
        for which in ("on_demand", "dense"):
            result = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    f"--which={which}",
                    f"--length={length}",
                    f"--rows={args.rows}",
                    f"--memory-cap-gib={args.memory_cap_gib}",
                ],
                capture_output=True,
                text=True,
            )
            lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
            data = json.loads(lines[-1]) if lines else {"oom": f"exit {result.returncode}"}
            shape = (
                f"(1, 1, {args.rows}, {length})"
                if which == "on_demand"
                else f"(1, {HEADS}, {length}, {length})"
            )
            if "oom" in data:
                print(f"{length:>6} {which:>10} {'OOM':>9} {'-':>8}  {shape} ({data['oom']})")
            else:
                print(
                    f"{length:>6} {which:>10} {data['peak_mib']:>9} {data['seconds']:>8}  {shape}"
                )


if __name__ == "__main__":
    main()
