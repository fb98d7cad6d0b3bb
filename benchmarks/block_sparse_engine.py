"""Block-sparse attention on the tiled engine (#50) against its own sweeps before.

Forward + backward (the gradients of `sum(out * cotangent)` with respect to
q, k and v) of `block_sparse_attention` on `(1, L, 8, 64)` float32 with
SparseAttention's default pattern (blocks of 64, a window of 3 blocks, 2
global blocks, 3 random blocks), causal or not.

"engine" is the kernel now: one sweep of `tiled_engine.TiledSweep` over
`sparse_tile_plan`'s tiles (64 x 64), and one of exact attention (the
engine's default tiles) for the global blocks' rows. "before" is
`block_sparse.py` of commit `--baseline` (default: main before the engine),
loaded from git into this process: its own `_recomputed_block_rows` (chunks
of 16 query blocks against their gathered key blocks) plus a blockwise strip
for the global rows. Both are traced and run once, then alternate
`--repeats` times; the ratio is of the medians (`--cpu-time`: the process's
CPU time, for a shared machine). The plan's fractions of full, partial and
skipped tiles are printed per case.

    KERAS_BACKEND=tensorflow python benchmarks/block_sparse_engine.py --lengths 4096 8192
    KERAS_BACKEND=jax python benchmarks/block_sparse_engine.py --lengths 4096 8192
"""

import argparse
import os
import sys
import time

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tile_plan import _load  # noqa: E402

BACKEND = keras.backend.backend()
HEADS, DIM = 8, 64
PATTERN = dict(block_size=64, window_blocks=3, global_blocks=2)
RANDOM_BLOCKS = 3
BASELINE = "33b49d0"  # main before block-sparse ran on the engine


def training_step(kernel, plan, causal, xla):
    """`step(q, k, v, cotangent)` -> gradients as NumPy, compiled once."""
    from keras_attention.ops import AttentionMask

    def attend(q, k, v):
        return kernel(q, k, v, random_plan=plan, mask=AttentionMask(causal=causal), **PATTERN)

    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=xla)
        def step(q, k, v, cotangent):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                loss = tf.reduce_sum(attend(q, k, v) * cotangent)
            return tape.gradient(loss, [q, k, v])

        return lambda *a: [g.numpy() for g in step(*a)]
    import jax

    def loss(q, k, v, cotangent):
        return jax.numpy.sum(attend(q, k, v) * cotangent)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return lambda *a: [np.asarray(g) for g in grad(*a)]


def compare(length, causal, repeats, xla, clock, commit, rng):
    import keras_attention as ka
    from keras_attention.ops import block_sparse

    old = _load(commit, "baseline_block_sparse", "keras_attention/ops/block_sparse.py")
    old_kernel = old.block_sparse_attention
    if BACKEND == "tensorflow":  # its source is not a file autograph can read
        import tensorflow as tf

        old_kernel = tf.autograph.experimental.do_not_convert(old_kernel)
    shape = (1, length, HEADS, DIM)
    q, k, v, cotangent = (rng.normal(size=shape).astype("float32") for _ in range(4))
    nq = length // PATTERN["block_size"]
    plan = rng.integers(0, 2**20, (nq, RANDOM_BLOCKS)).astype("int32")
    tiles = ka.ops.sparse_tile_plan(
        ka.ops.AttentionMask(causal=causal), length, random_plan=plan, **PATTERN
    )
    steps = {
        "engine": training_step(block_sparse.block_sparse_attention, plan, causal, xla),
        "before": training_step(old_kernel, plan, causal, xla),
    }
    grads = {key: step(q, k, v, cotangent) for key, step in steps.items()}  # warm-up
    error = max(float(np.max(np.abs(a - b))) for a, b in zip(*grads.values(), strict=True))
    times = {key: [] for key in steps}
    for _ in range(repeats):
        for key, step in steps.items():
            start = clock()
            step(q, k, v, cotangent)
            times[key].append(clock() - start)
    median = {key: float(np.median(t)) for key, t in times.items()}
    fractions = ", ".join(f"{key} {value:.3f}" for key, value in tiles.fractions().items())
    print(
        f"L={length} {'causal' if causal else 'bidirectional'}: engine {median['engine']:.3f} s, "
        f"before {median['before']:.3f} s, ratio {median['engine'] / median['before']:.3f}; "
        f"tiles: {fractions}; max |grad difference| {error:.2e}",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--xla", action="store_true", help="TensorFlow: jit_compile=True")
    parser.add_argument("--cpu-time", action="store_true", help="time by the process's CPU time")
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument("--global-blocks", type=int, default=PATTERN["global_blocks"])
    args = parser.parse_args()
    PATTERN["global_blocks"] = args.global_blocks
    clock = time.process_time if args.cpu_time else time.perf_counter
    rng = np.random.default_rng(0)
    mode = "JAX jit" if BACKEND == "jax" else ("TF XLA" if args.xla else "TF graph")
    print(
        f"{mode}, {'CPU' if args.cpu_time else 'wall'} time, median of {args.repeats}, "
        f"pattern {PATTERN}, {RANDOM_BLOCKS} random blocks"
    )
    for length in args.lengths:
        for causal in args.causal:
            compare(length, bool(causal), args.repeats, args.xla, clock, args.baseline, rng)


if __name__ == "__main__":
    main()
