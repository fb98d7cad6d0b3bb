"""Where the blockwise exact kernel's time goes, against the matmul ceiling.

In one process (TensorFlow graph mode by default, or `--backend jax` with
`jax.jit`), for each length: the fp32 matmul ceiling (a square matmul), then

- `forward`: `ops.memory_efficient_attention` forward only;
- `forward+backward`: forward and the recomputing backward;
- `matmuls only`: the same tile loops with the same einsums, but no mask, no
  exp, no rescaling (the kernel's matmul work alone, forward and backward);

so `forward+backward - matmuls only` is the elementwise work (exp, scale,
mask, online-softmax rescaling) plus loop overhead; and, with `--exp-floor`,

- `matmuls + exp`: those loops with one exp on each forward logits tile and
  one on each recomputed backward tile, the least elementwise work an exact
  kernel does; its %-of-peak (in useful FLOPs, as the kernel's) bounds what
  any kernel built from the backend's separate ops can reach. Useful FLOPs are
`4 L^2 H D` forward and `12 L^2 H D` forward+backward (the backward's
recomputation of the logits, 2 more, is not counted as useful). With several
`--block-sizes`, every variant of a length runs in the same process, in
rounds (one step of each per round), so a busy machine slows them alike; the
time is the median of the rounds after a warm-up step, and the matmul
ceiling is measured again after each length (both readings printed).

    flock /tmp/heavy.lock python benchmarks/blockwise_profile.py --lengths 8192,16384 \
        --block-sizes 256,512,1024
"""

import argparse
import os
import statistics
import time

from mha_benchmark import best_time  # noqa: E402  (benchmarks/ is the script's folder)

HEADS, KEY_DIM = 8, 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192,16384")
    parser.add_argument("--block-sizes", default="1024")
    parser.add_argument(
        "--matmuls-only",
        action="store_true",
        help="also time the kernel's einsums alone (the largest block only)",
    )
    parser.add_argument(
        "--exp-floor",
        action="store_true",
        help="also time the einsums plus one exp per logits tile (largest block)",
    )
    parser.add_argument("--forward", action=argparse.BooleanOptionalAction, default=True)
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
    a = keras.ops.convert_to_tensor(
        np.random.default_rng(0).standard_normal((size, size)), "float32"
    )
    matmul = compile_(lambda a: ops.matmul(a, a))
    ceiling = 2 * size**3 / best_time(lambda: sync(matmul(a)), 5)
    blocks = [int(b) for b in args.block_sizes.split(",")]
    print(
        f"# {args.backend}: fp32 matmul {size}^3 {ceiling / 1e9:.1f} GF/s; "
        f"{HEADS} heads x {KEY_DIM}, batch 1, blocks {blocks}",
        flush=True,
    )
    print(f"{'L':>6} {'block':>6} {'what':>18} {'seconds':>9} {'% of matmul peak':>17}", flush=True)

    def matmuls_only(q, k, v, block, exp=False):
        """The kernel's per-tile einsums (forward 2, backward 5), nothing else;
        with `exp`, an exp on the forward and the recomputed logits tile."""
        n = q.shape[1] // block
        tile = ops.exp if exp else (lambda x: x)
        if exp:  # logits of the kernel's scale, so the exps stay finite
            q = q * (KEY_DIM**-0.5)
        qb = loops.to_time_blocks(q, n, block)  # (n, B, H, b, D)
        kb = loops.to_time_blocks(k, n, block)
        vb = loops.to_time_blocks(v, n, block)

        def query_step(i, total):
            q_tile = ops.take(qb, i, axis=0)

            def key_step(j, acc):
                k_tile, v_tile = ops.take(kb, j, axis=0), ops.take(vb, j, axis=0)
                logits = tile(ops.einsum("bhqd,bhkd->bhqk", q_tile, k_tile))
                out = ops.einsum("bhqk,bhkd->bhqd", logits, v_tile)  # forward: 2
                d_p = ops.einsum("bhqd,bhkd->bhqk", out, v_tile)  # backward: 5
                re = tile(ops.einsum("bhqd,bhkd->bhqk", q_tile, k_tile))
                dq = ops.einsum("bhqk,bhkd->bhqd", d_p, k_tile)
                dk = ops.einsum("bhqk,bhqd->bhkd", re, q_tile)
                dv = ops.einsum("bhqk,bhqd->bhkd", d_p, out)
                return acc + dq + dk + dv

            return total + loops.sequential_fori_loop(0, n, key_step, ops.zeros_like(q_tile))

        return loops.sequential_fori_loop(0, n, query_step, ops.zeros_like(ops.take(qb, 0, axis=0)))

    for length in [int(v) for v in args.lengths.split(",") if v]:
        rng = np.random.default_rng(1)
        q, k, v = (
            keras.ops.convert_to_tensor(rng.standard_normal((1, length, HEADS, KEY_DIM)), "float32")
            for _ in range(3)
        )
        runs = {}
        for block in blocks:

            def kernel(q, k, v, block=block):
                return memory_efficient_attention(q, k, v, block_size=block)

            if args.forward:
                runs[(block, "forward")] = (compile_(kernel), 4)
            runs[(block, "forward+backward")] = (compile_(value_and_grad(kernel)), 12)
        if args.matmuls_only:
            block = max(blocks)
            runs[(block, "matmuls only")] = (
                compile_(lambda q, k, v, block=block: matmuls_only(q, k, v, block)),
                14,
            )
        if args.exp_floor:
            block = max(blocks)
            runs[(block, "matmuls + exp")] = (
                compile_(lambda q, k, v, block=block: matmuls_only(q, k, v, block, exp=True)),
                12,
            )
        times = {name: [] for name in runs}
        for fn, _ in runs.values():  # warm-up: tracing and compilation
            sync(fn(q, k, v))
        for _ in range(args.repeats):
            for name, (fn, _) in runs.items():
                start = time.perf_counter()
                sync(fn(q, k, v))
                times[name].append(time.perf_counter() - start)
        after = 2 * size**3 / best_time(lambda: sync(matmul(a)), 5)
        for (block, what), (_, factor) in runs.items():
            seconds = statistics.median(times[(block, what)])
            flops = factor * length**2 * HEADS * KEY_DIM
            print(
                f"{length:>6} {block:>6} {what:>18} {seconds:9.3f} "
                f"{100 * flops / seconds / ceiling:16.1f}%",
                flush=True,
            )
        print(
            f"# matmul ceiling after L={length}: {after / 1e9:.1f} GF/s "
            f"(before: {ceiling / 1e9:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
