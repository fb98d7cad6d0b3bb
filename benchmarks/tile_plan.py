"""The tile plan (#50): the blockwise kernel on its plan against the kernel before it.

Forward + backward (the gradients of `sum(out * cotangent)` with respect to
q, k and v) of `memory_efficient_attention` on `(1, L, 8, 64)` float32,
blocks of 512, for two masks:

- causal;
- causal inside 8 packed documents (random lengths, segment ids).

"plan" is the kernel now: it visits its `TilePlan`'s full tiles without
evaluating a mask and its partial tiles with it. "before" is the kernel of
commit `--baseline` (default: the last one before the plan), loaded from git
into this process with its own `AttentionMask`: it visited every tile in its
key ranges (cut to the documents' blocks) and masked each one. Both are
traced and run once, then alternate `--repeats` times; the ratio is of the
medians (`--cpu-time` times by the process's CPU time, for a shared
machine). The plan's fractions of full, partial and skipped tiles are
printed per case.

`--plan-block N` runs the plan at tiles of N tokens (query and key blocks)
while the kernel before it keeps 512: the tile size as one more thing the
plan could choose (packed documents waste less of a partial tile in smaller
tiles; each tile's fixed cost grows with their number).

`--model` also runs the plan's sharing check: 4 `MultiHeadAttention`
layers on packed batches (`--model-length` tokens), the plan built once per
batch by the model and passed to every layer; 10 batches packed differently
through one compiled training step (`tf.function` / `jax.jit`), counting
the traces and the plans built while tracing.

    KERAS_BACKEND=tensorflow python benchmarks/tile_plan.py --lengths 8192 16384
    KERAS_BACKEND=tensorflow python benchmarks/tile_plan.py --xla
    KERAS_BACKEND=jax python benchmarks/tile_plan.py --model
"""

import argparse
import os
import subprocess
import sys
import time
import types

import keras
import numpy as np

BACKEND = keras.backend.backend()
HEADS, DIM, BLOCK, DOCUMENTS = 8, 64, 512, 8
BASELINE = "ce6d3d7"  # main before the tile plan
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(commit, name, path, replacements=()):
    source = subprocess.check_output(["git", "-C", ROOT, "show", f"{commit}:{path}"], text=True)
    for old, new in replacements:
        source = source.replace(old, new)
    module = types.ModuleType(name)
    module.__file__ = f"<{commit}:{path}>"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def baseline(commit):
    """`(AttentionMask, memory_efficient_attention)` of `commit`."""
    masks = _load(commit, "baseline_attention_mask", "keras_attention/ops/attention_mask.py")
    kernel = _load(
        commit,
        "baseline_memory_efficient",
        "keras_attention/ops/memory_efficient.py",
        [
            (
                "from keras_attention.ops import attention_mask as attention_masks",
                "import baseline_attention_mask as attention_masks",
            )
        ],
    )
    attend = kernel.memory_efficient_attention
    if BACKEND == "tensorflow":  # its source is not a file autograph can read
        import tensorflow as tf

        attend = tf.autograph.experimental.do_not_convert(attend)
    return masks.AttentionMask, attend


def packed_ids(length, rng):
    """`(1, L)` int32 ids of `DOCUMENTS` documents of random lengths."""
    cuts = np.sort(rng.choice(np.arange(1, length), DOCUMENTS - 1, replace=False))
    return np.searchsorted(cuts, np.arange(length), side="right")[None].astype("int32")


def masks(mask_class, name, ids):
    if name == "causal":
        return mask_class(causal=True)
    return mask_class(causal=True, query_segment_ids=ids, key_segment_ids=ids)


def training_step(kernel, mask, xla, block=BLOCK):
    """`step(q, k, v, cotangent)` -> gradients as NumPy, compiled once."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=xla)
        def step(q, k, v, cotangent):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = kernel(q, k, v, mask=mask, block_size=block)
                loss = tf.reduce_sum(out * cotangent)
            return tape.gradient(loss, [q, k, v])

        return lambda *a: [g.numpy() for g in step(*a)]
    import jax

    def loss(q, k, v, cotangent):
        return jax.numpy.sum(kernel(q, k, v, mask=mask, block_size=block) * cotangent)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return lambda *a: [np.asarray(g) for g in grad(*a)]


def compare(length, repeats, xla, clock, commit, rng, plan_block=BLOCK):
    import keras_attention as ka
    from keras_attention.ops.memory_efficient import memory_efficient_attention

    old_mask, old_kernel = baseline(commit)
    shape = (1, length, HEADS, DIM)
    q, k, v, cotangent = (rng.normal(size=shape).astype("float32") for _ in range(4))
    ids = packed_ids(length, rng)
    for name in ("causal", f"{DOCUMENTS} documents"):
        plan = ka.ops.tile_plan(
            masks(ka.ops.AttentionMask, name, ids), length, block_size=plan_block
        )
        steps = {
            "plan": training_step(
                memory_efficient_attention,
                masks(ka.ops.AttentionMask, name, ids),
                xla,
                plan_block,
            ),
            "before": training_step(old_kernel, masks(old_mask, name, ids), xla),
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
        fractions = ", ".join(f"{key} {value:.3f}" for key, value in plan.fractions().items())
        label = "plan" if plan_block == BLOCK else f"plan (tiles of {plan_block})"
        print(
            f"L={length} {name}: {label} {median['plan']:.3f} s, before {median['before']:.3f} s, "
            f"ratio {median['plan'] / median['before']:.3f}; tiles: {fractions}; "
            f"max |grad difference| {error:.2e}"
        )


def shared_plan(length, rng):
    """The 4-layer check: plans built while tracing, and traces, over 10 batches."""
    import keras_attention as ka
    from keras_attention.ops import tiling

    builds = []
    build = tiling.build

    def counting(*args, **kwargs):
        builds.append(1)
        return build(*args, **kwargs)

    tiling.build = counting
    layers = [ka.MultiHeadAttention(HEADS, DIM, memory_efficient=True) for _ in range(4)]
    traces = []

    def forward(x, ids):
        mask = ka.ops.AttentionMask(causal=True, query_segment_ids=ids, key_segment_ids=ids)
        plan = ka.ops.tile_plan(mask, length, block_size=layers[0].block_size)
        for layer in layers:
            x = x + layer(x, x, use_causal_mask=True, segment_ids=ids, tile_plan=plan)
        return x

    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(x, ids):
            traces.append(1)
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_mean(forward(x, ids) ** 2)
            return tape.gradient(loss, [x] + [w for la in layers for w in la.trainable_weights])

    else:
        import jax

        def step(x, ids):
            traces.append(1)
            return jax.grad(lambda x: jax.numpy.mean(forward(x, ids) ** 2))(x)

        step = jax.jit(step)
    x = rng.normal(size=(1, length, HEADS * DIM)).astype("float32")
    for layer in layers:
        layer(x[:, :8], x[:, :8])
    counts = []
    for _ in range(10):
        builds.clear()
        step(x, packed_ids(length, rng))
        counts.append(len(builds))
    tiling.build = build
    print(
        f"4 layers, L={length}, 10 batches packed differently: traces {len(traces)}; "
        f"plans built per call while tracing {counts} (one per batch: the model's)"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--xla", action="store_true", help="TensorFlow: jit_compile=True")
    parser.add_argument("--cpu-time", action="store_true", help="time by the process's CPU time")
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument("--model", action="store_true", help="the 4-layer sharing check")
    parser.add_argument("--model-length", type=int, default=2048)
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument(
        "--plan-block", type=int, default=BLOCK, help="the plan's tile size (before: 512)"
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    rng = np.random.default_rng(0)
    mode = "JAX jit" if BACKEND == "jax" else ("TF XLA" if args.xla else "TF graph")
    print(f"{mode}, {'CPU' if args.cpu_time else 'wall'} time, median of {args.repeats}")
    if not args.skip_kernels:
        for length in args.lengths:
            compare(length, args.repeats, args.xla, clock, args.baseline, rng, args.plan_block)
    if args.model:
        shared_plan(args.model_length, rng)


if __name__ == "__main__":
    main()
