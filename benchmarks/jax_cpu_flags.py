"""JAX on CPU: which XLA setting lifts its fp32 matmul ceiling, and our layer.

For each candidate `XLA_FLAGS` setting, one child process measures (a) the
fp32 matmul FLOP/s of `jax.jit(jnp.matmul)` on square matrices, and (b) one
forward+backward step of our `MultiHeadAttention` and of Keras' (8 heads x 64,
batch 1, self-attention) under `jax.jit`, with the fraction of that
process' own matmul ceiling in useful FLOPs (`12 L^2 H D + 24 L d^2`). A
TensorFlow child measures TensorFlow's matmul (graph mode, oneDNN) as the
anchor. Ratios come from one process each; the machine is shared, so compare
rows of one run.

    flock /tmp/heavy.lock python benchmarks/jax_cpu_flags.py --lengths 4096,8192
"""

import argparse
import json
import os
import subprocess
import sys

from mha_benchmark import best_time  # noqa: E402  (benchmarks/ is the script's folder)

SETTINGS = {
    "default": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_custom_call": (
        "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true"
    ),
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "no_thunks": "--xla_cpu_use_thunk_runtime=false",
    "fast_math": "--xla_cpu_enable_fast_math=true",
}
HEADS, KEY_DIM = 8, 64


def jax_child(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    size = args.matmul_size
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    seconds = best_time(lambda: matmul(a, a).block_until_ready(), 5)
    result = {"matmul_gflops": 2 * size**3 / seconds / 1e9, "steps": {}}
    import keras

    import keras_attention

    for length in args.lengths:
        x = jnp.asarray(
            np.random.default_rng(1).standard_normal((1, length, HEADS * KEY_DIM)), jnp.float32
        )
        row = {}
        for name, layer in (
            ("ours", keras_attention.MultiHeadAttention(HEADS, KEY_DIM)),
            ("keras", keras.layers.MultiHeadAttention(HEADS, KEY_DIM)),
        ):
            layer(x[:, :8], x[:, :8])

            def loss(trainable, non_trainable, x, layer=layer):
                y, _ = layer.stateless_call(trainable, non_trainable, x, x)
                return jnp.sum(y * y)

            grad = jax.jit(jax.grad(loss, argnums=(0, 2)))
            trainable = [v.value for v in layer.trainable_variables]
            non_trainable = [v.value for v in layer.non_trainable_variables]
            seconds = best_time(
                lambda grad=grad, trainable=trainable, non_trainable=non_trainable, x=x: (
                    jax.block_until_ready(grad(trainable, non_trainable, x))
                ),
                args.repeats,
            )
            flops = 12 * length**2 * HEADS * KEY_DIM + 24 * length * (HEADS * KEY_DIM) ** 2
            row[name] = {
                "seconds": seconds,
                "fraction": flops / seconds / (result["matmul_gflops"] * 1e9),
            }
        result["steps"][length] = row
    print(json.dumps(result))


def tf_child(args):
    import numpy as np
    import tensorflow as tf

    size = args.matmul_size
    a = tf.constant(np.random.default_rng(0).standard_normal((size, size)), tf.float32)
    matmul = tf.function(lambda a: tf.matmul(a, a))
    seconds = best_time(lambda: matmul(a).numpy(), 5)
    print(json.dumps({"matmul_gflops": 2 * size**3 / seconds / 1e9}))


def _run(args, backend, flags=""):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    command = [
        sys.executable,
        __file__,
        "--child",
        backend,
        "--lengths",
        ",".join(map(str, args.lengths)),
        "--repeats",
        str(args.repeats),
        "--matmul-size",
        str(args.matmul_size),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,8192")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--child", choices=["jax", "tensorflow"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.lengths = [int(v) for v in str(args.lengths).split(",") if v]
    if args.child == "jax":
        return jax_child(args)
    if args.child == "tensorflow":
        return tf_child(args)
    tf_result = _run(args, "tensorflow")
    print(
        f"# TensorFlow graph-mode fp32 matmul {args.matmul_size}^3: "
        f"{tf_result.get('matmul_gflops', float('nan')):.1f} GF/s",
        flush=True,
    )
    print(
        f"{'setting':>20} {'JAX matmul GF/s':>15} {'/ TF':>6} "
        + " ".join(
            f"{'L=' + str(n) + ' ours s':>13} {'%ceil':>6} {'keras s':>8} {'%ceil':>6} {'ratio':>6}"
            for n in args.lengths
        ),
        flush=True,
    )
    for name in args.settings.split(","):
        result = _run(args, "jax", SETTINGS[name])
        if "error" in result:
            print(f"{name:>20} failed: {result['error']}", flush=True)
            continue
        gflops = result["matmul_gflops"]
        cells = []
        for length in args.lengths:
            row = result["steps"][str(length)]
            ours, keras_ = row["ours"], row["keras"]
            cells.append(
                f"{ours['seconds']:13.3f} {100 * ours['fraction']:5.1f}% "
                f"{keras_['seconds']:8.3f} {100 * keras_['fraction']:5.1f}% "
                f"{ours['seconds'] / keras_['seconds']:6.2f}"
            )
        print(
            f"{name:>20} {gflops:15.1f} "
            f"{gflops / tf_result.get('matmul_gflops', float('nan')):6.2f} " + " ".join(cells),
            flush=True,
        )


if __name__ == "__main__":
    main()
