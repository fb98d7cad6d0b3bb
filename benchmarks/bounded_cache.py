"""A window's ring-buffer cache against the full cache (#51): decoding speed and memory.

One `MultiHeadAttention(num_heads=8, key_dim=64, sliding_window=4096,
sink_tokens=4)` decodes `--steps` tokens one at a time, in one compiled loop
(`tf.function(jit_compile=True)` / `jax.jit` of a `fori_loop`), after a
context of `C` tokens, with either

- the full cache: `C + steps` slots, as KerasHub's and ours were; or
- the ring: `sink_tokens + sliding_window` slots, whatever `C`
  (`long-sequences.md`: the slots wrap and keep absolute positions).

Each (context, cache) pair runs in its own process (a fresh `ru_maxrss`), the
loop traced and run once, then timed `--repeats` times (median). Printed:
tokens/s, the process's peak RSS, and the cache's own size. The context's
keys are zeros here (a timing and memory check: the step equality is the
tests' `test_a_window_cache_shorter_than_the_sequence_wraps...`).

    KERAS_BACKEND=tensorflow python benchmarks/bounded_cache.py
    KERAS_BACKEND=jax python benchmarks/bounded_cache.py --contexts 4096 65536
    # StreamingLLM: 10,000 tokens from an empty context through the ring
    KERAS_BACKEND=tensorflow python benchmarks/bounded_cache.py --contexts 0 \
        --steps 10000 --repeats 1 --kinds ring
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HIDDEN, HEADS, KEY_DIM, WINDOW, SINKS = 512, 8, 64, 4096, 4


def run(context, kind, steps, repeats):
    import keras
    import numpy as np

    import keras_attention as ka

    layer = ka.MultiHeadAttention(HEADS, KEY_DIM, sliding_window=WINDOW, sink_tokens=SINKS)
    slots = context + steps if kind == "full" else SINKS + WINDOW
    # Each step's input is made from its index inside the loop, so nothing
    # in the process grows with the number of steps but what the cache holds
    # (a stored `(1, steps, HIDDEN)` input would: 20 MB at 10,000 steps, and
    # TensorFlow keeps copies of a traced constant).
    phases = np.random.default_rng(0).uniform(0, 6.28, size=(1, 1, HIDDEN)).astype("float32")

    def embedding(i):
        return keras.ops.sin(keras.ops.cast(i, "float32") * 0.01 + phases)

    layer(phases)  # build
    cache = np.zeros((1, 2, slots, HEADS, KEY_DIM), "float32")

    def step(i, state):
        cache, total = state
        token = embedding(i)
        out, cache = layer(token, cache=cache, cache_update_index=context + i, use_causal_mask=True)
        return cache, total + keras.ops.sum(out)

    if keras.backend.backend() == "jax":
        import jax

        weights = [v.value for v in layer.trainable_variables]

        def stateless_step(i, state, weights):
            cache, total = state
            token = embedding(i)
            (out, cache), _ = layer.stateless_call(
                weights,
                [],
                token,
                cache=cache,
                cache_update_index=context + i,
                use_causal_mask=True,
            )
            return cache, total + out.sum()

        loop = jax.jit(
            lambda cache, w: jax.lax.fori_loop(
                0, steps, lambda i, s: stateless_step(i, s, w), (cache, 0.0)
            )[1]
        )
        decode = lambda: float(loop(cache, weights))  # noqa: E731
    else:
        import tensorflow as tf

        loop = tf.function(
            lambda cache: keras.ops.fori_loop(0, steps, step, (cache, 0.0))[1], jit_compile=True
        )
        decode = lambda: float(loop(tf.constant(cache)))  # noqa: E731
    decode()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        decode()
        times.append(time.perf_counter() - start)
    return {
        "tokens_per_s": steps / float(np.median(times)),
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cache_mib": cache.nbytes / 2**20,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["full", "ring"], choices=["full", "ring"])
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # context, kind: a child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run(int(args.one[0]), args.one[1], args.steps, args.repeats)))
        return
    import keras

    print(
        f"{keras.backend.backend()}, window {WINDOW} + {SINKS} sinks, {args.steps} tokens "
        f"after the context, median of {args.repeats}"
    )
    print(f"{'context':>8} {'cache':>6} {'tokens/s':>9} {'peak MiB':>9} {'cache MiB':>10}")
    for context in args.contexts:
        for kind in args.kinds:
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--steps",
                    str(args.steps),
                    "--repeats",
                    str(args.repeats),
                    "--one",
                    str(context),
                    kind,
                ],
                capture_output=True,
                text=True,
                env=os.environ,
                check=True,
            )
            result = json.loads(child.stdout.strip().splitlines()[-1])
            print(
                f"{context:>8} {kind:>6} {result['tokens_per_s']:>9.1f} "
                f"{result['peak_mib']:>9.0f} {result['cache_mib']:>10.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
