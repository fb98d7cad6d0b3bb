"""Where the blockwise exact kernel's time goes, against the matmul ceiling.

In one process (TensorFlow graph mode by default, or `--backend jax` with
`jax.jit`), for each length: the fp32 matmul ceiling (a square matmul), then

- `forward`: `ops.memory_efficient_attention` forward only;
- `forward+backward`: forward and the recomputing backward;
- `matmuls only`: the same tile loops with the same einsums, but no mask, no
  exp, no rescaling (the kernel's matmul work alone, forward and backward);

so `forward+backward - matmuls only` is the elementwise work (exp, scale,
mask, online-softmax rescaling) plus loop overhead. Useful FLOPs are
`4 L^2 H D` forward and `12 L^2 H D` forward+backward (the backward's
recomputation of the logits, 2 more, is not counted as useful).

    flock /tmp/heavy.lock python benchmarks/blockwise_profile.py --lengths 8192,16384
"""

import argparse
import os
import time

from mha_benchmark import best_time  # noqa: E402  (benchmarks/ is the script's folder)

HEADS, KEY_DIM = 8, 64




def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192,16384")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="tensorflow", choices=["tensorflow", "jax"])
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    from keras import ops

    from keras_attention.ops import loops
    from keras_attention.ops.memory_efficient import memory_efficient_attention

    if args.backend == "tensorflow":
        import tensorflow as tf

        compile_ = tf.function

        def value_and_grad(fn):
            def run(q, k, v):
                with tf.GradientTape() as tape:
                    tape.watch([q, k, v])
                    out = fn(q, k, v)
                    loss = tf.reduce_sum(out)
                return loss, tape.gradient(loss, [q, k, v])
            return run

        def sync(x):
            return [np.asarray(t) for t in tf.nest.flatten(x)]
    else:
        import jax

        compile_ = jax.jit

        def value_and_grad(fn):
            return jax.value_and_grad(lambda q, k, v: ops.sum(fn(q, k, v)), argnums=(0, 1, 2))

        def sync(x):
            return jax.block_until_ready(x)

    size = 2048
    a = keras.ops.convert_to_tensor(np.random.default_rng(0).standard_normal((size, size)),
                                    "float32")
    matmul = compile_(lambda a: ops.matmul(a, a))
    ceiling = 2 * size**3 / best_time(lambda: sync(matmul(a)), 5)
    print(f"# {args.backend}: fp32 matmul {size}^3 {ceiling / 1e9:.1f} GF/s; "
          f"{HEADS} heads x {KEY_DIM}, batch 1, block {args.block_size}", flush=True)
    print(f"{'L':>6} {'what':>18} {'seconds':>9} {'% of matmul peak':>17}", flush=True)

    block = args.block_size

    def matmuls_only(q, k, v):
        """The kernel's per-tile einsums (forward 2, backward 5), nothing else."""
        n = q.shape[1] // block
        qb = loops.to_time_blocks(q, n, block)  # (n, B, H, b, D)
        kb = loops.to_time_blocks(k, n, block)
        vb = loops.to_time_blocks(v, n, block)

        def query_step(i, total):
            q_tile = ops.take(qb, i, axis=0)

            def key_step(j, acc):
                k_tile, v_tile = ops.take(kb, j, axis=0), ops.take(vb, j, axis=0)
                logits = ops.einsum("bhqd,bhkd->bhqk", q_tile, k_tile)
                out = ops.einsum("bhqk,bhkd->bhqd", logits, v_tile)  # forward: 2
                d_p = ops.einsum("bhqd,bhkd->bhqk", out, v_tile)  # backward: 5
                re = ops.einsum("bhqd,bhkd->bhqk", q_tile, k_tile)
                dq = ops.einsum("bhqk,bhkd->bhqd", d_p, k_tile)
                dk = ops.einsum("bhqk,bhqd->bhkd", re, q_tile)
                dv = ops.einsum("bhqk,bhqd->bhkd", d_p, out)
                return acc + dq + dk + dv

            return total + loops.sequential_fori_loop(0, n, key_step, ops.zeros_like(q_tile))

        return loops.sequential_fori_loop(
            0, n, query_step, ops.zeros_like(ops.take(qb, 0, axis=0)))

    for length in [int(v) for v in args.lengths.split(",") if v]:
        rng = np.random.default_rng(1)
        q, k, v = (keras.ops.convert_to_tensor(
            rng.standard_normal((1, length, HEADS, KEY_DIM)), "float32") for _ in range(3))
        kernel = lambda q, k, v: memory_efficient_attention(q, k, v, block_size=block)  # noqa: E731
        useful = {"forward": 4, "forward+backward": 12, "matmuls only": 12}
        runs = {
            "forward": compile_(kernel),
            "forward+backward": compile_(value_and_grad(kernel)),
            "matmuls only": compile_(matmuls_only),
        }
        for what, fn in runs.items():
            seconds = best_time(lambda: sync(fn(q, k, v)), args.repeats)
            flops = useful[what] * length**2 * HEADS * KEY_DIM
            if what == "matmuls only":
                flops = 14 * length**2 * HEADS * KEY_DIM  # 7 einsums per tile
            print(f"{length:>6} {what:>18} {seconds:9.3f} {100 * flops / seconds / ceiling:16.1f}%",
                  flush=True)


if __name__ == "__main__":
    main()
