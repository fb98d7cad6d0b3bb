"""Attention dropout inside the blockwise kernel (#50): what a training step costs.

One training step (forward + backward: gradients of the input and every
weight of `mean(y^2)`) of `MultiHeadAttention(num_heads=8, key_dim=64,
dropout=0.1)` on `(1, L, 512)` inputs, batch 1, float32, self-attention,
the layer's default kernel choice (`kernel_for` is printed: at these
lengths the blockwise kernel, which now drops weights itself instead of
sending the call to the dense kernel). The step with dropout
(`training=True`) and the same step without it (`training=False`: the same
layer and weights, dropout off) run in one process: each is traced and run
once (warm-up), then they alternate `--repeats` times; the ratio is of the
medians. TensorFlow: `tf.function` (graph mode; `--xla` for
`jit_compile=True`); JAX: `jax.jit` of `stateless_call`, the dropout's seed
state threaded through the steps (a new mask each step, as `fit` does).

Memory: the process's peak RSS (`ru_maxrss`, MiB) right after the dropout
step's warm-up (it has run nothing else: tracing and one full step), and
above the RSS before it; then the peak after every step of both.

    KERAS_BACKEND=tensorflow python benchmarks/dropout_training.py --length 65536 --repeats 1
    KERAS_BACKEND=jax python benchmarks/dropout_training.py --length 16384 --repeats 3

`--cpu-time` times by the process's CPU time (a machine shared with other
work); `--blockwise` forces the blockwise kernel (`memory_efficient=True`)
at lengths where the layer would materialise.
"""

import argparse
import resource
import time

import keras
import numpy as np

HIDDEN, HEADS, KEY_DIM, RATE = 512, 8, 64, 0.1
BACKEND = keras.backend.backend()


def _rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def training_steps(layer, xla=False):
    """`{"dropout": step, "no dropout": step}`, each `step(x)` running one
    training step and returning its gradients as NumPy arrays."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def make(training):
            @tf.function(jit_compile=xla)
            def step(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, training=training)
                    loss = tf.reduce_mean(y * y)
                return tape.gradient(loss, [x] + layer.trainable_variables)

            return lambda x: [g.numpy() for g in step(x)]

        return {"dropout": make(True), "no dropout": make(False)}
    import jax

    trainable = [v.value for v in layer.trainable_variables]
    state = {"frozen": [v.value for v in layer.non_trainable_variables]}

    def make(training):
        def loss(weights, frozen, x):
            y, frozen = layer.stateless_call(weights, frozen, x, training=training)
            return jax.numpy.mean(y * y), frozen

        grad = jax.jit(jax.grad(loss, argnums=(0, 2), has_aux=True))

        def step(x):
            grads, state["frozen"] = grad(trainable, state["frozen"], x)
            return [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]

        return step

    return {"dropout": make(True), "no dropout": make(False)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--xla", action="store_true", help="TensorFlow: jit_compile=True")
    parser.add_argument("--cpu-time", action="store_true", help="time by the process's CPU time")
    parser.add_argument(
        "--blockwise",
        action="store_true",
        help="memory_efficient=True: the blockwise kernel at any length",
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter

    import keras_attention as ka

    layer = ka.MultiHeadAttention(
        HEADS, KEY_DIM, dropout=RATE, seed=0, memory_efficient=True if args.blockwise else "auto"
    )
    shape = (1, args.length, HIDDEN)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=shape).astype("float32"))
    layer(x[:, :8])  # build
    kernels = {
        "dropout": layer.kernel_for(shape, training=True).value,
        "no dropout": layer.kernel_for(shape, training=False).value,
    }
    steps = training_steps(layer, args.xla)
    before = _rss_mib()
    start = clock()
    finite = all(np.all(np.isfinite(g)) for g in steps["dropout"](x))
    first = {"dropout": clock() - start}
    dropout_peak = _peak_mib()
    start = clock()
    steps["no dropout"](x)
    first["no dropout"] = clock() - start
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = clock()
            step(x)
            times[name].append(clock() - start)
    median = {name: float(np.median(t)) for name, t in times.items()}
    mode = "JAX jit" if BACKEND == "jax" else ("TF XLA" if args.xla else "TF graph")
    print(
        f"{mode}, L={args.length}, {'CPU' if args.cpu_time else 'wall'} time, median of "
        f"{args.repeats}: dropout {median['dropout']:.2f} s (kernel {kernels['dropout']}; "
        f"first step with tracing {first['dropout']:.2f} s), no dropout "
        f"{median['no dropout']:.2f} s (kernel {kernels['no dropout']}; first "
        f"{first['no dropout']:.2f} s), ratio {median['dropout'] / median['no dropout']:.3f}; "
        f"finite gradients {finite}"
    )
    print(
        f"peak RSS after the dropout step: {dropout_peak:.0f} MiB "
        f"({dropout_peak - before:.0f} above the RSS before it, {before:.0f}); "
        f"after every step: {_peak_mib():.0f} MiB"
    )


if __name__ == "__main__":
    main()
