"""Cost of one decoding step of TransformerDecoderBlock: cached vs recomputed.

For a prefix of length L, producing the next position either recomputes the
whole prefix (a full causal call on (B, L, d)) or runs one cached step
(inputs (B, 1, d), self-attention cache (B, 2, L_max, H, D), precomputed
cross-attention cache). Both are compiled (XLA on TensorFlow, jax.jit on
JAX) with fixed shapes and timed in the same process; the script prints
the ratio and checks that the cached step's output equals the last row of
the full call.

    KERAS_BACKEND=tensorflow python benchmarks/decoder_cache_benchmark.py
"""

import argparse
import os
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")

import keras_attention  # noqa: E402,F401  (first: a quiet TensorFlow start)

# isort: split
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from keras_attention.layers import TransformerDecoderBlock  # noqa: E402


def compile_fn(fn):
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    return fn


def best_time(fn, *args, repeats):
    ops.convert_to_numpy(fn(*args)[0])  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ops.convert_to_numpy(fn(*args)[0])
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--source-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    key_dim = args.hidden // args.heads
    block = TransformerDecoderBlock(args.heads, key_dim, 4 * args.hidden)
    rng = np.random.default_rng(0)
    max_length = max(args.lengths)
    target = rng.standard_normal((1, max_length, args.hidden)).astype("float32")
    source = rng.standard_normal((1, args.source_length, args.hidden)).astype("float32")
    block(target[:, :2], source)
    cross_cache = block.precompute_cross_attention_cache(source)

    full_call = compile_fn(lambda x, s: (block(x, s),))
    cached_step = compile_fn(
        lambda x, cache, index, cross: block(
            x,
            self_attention_cache=cache,
            cache_update_index=index,
            cross_attention_cache=cross,
        )
    )

    print(
        f"backend={keras.backend.backend()} hidden={args.hidden} "
        f"heads={args.heads} source_length={args.source_length} batch=1"
    )
    print("| prefix L | full causal call (ms) | cached step (ms) | full / cached |")
    print("|---|---|---|---|")
    for length in args.lengths:
        prefix = target[:, :length]
        # Fill the cache with the prefix, then time the step at position L - 1.
        cache = block.initial_self_attention_cache(1, length)
        _, cache = block(
            prefix[:, :-1],
            self_attention_cache=cache,
            cache_update_index=0,
            cross_attention_cache=cross_cache,
        )
        index = ops.convert_to_tensor(length - 1, "int32")
        step_input = prefix[:, -1:]
        full_output = ops.convert_to_numpy(full_call(prefix, source)[0])
        step_output = ops.convert_to_numpy(cached_step(step_input, cache, index, cross_cache)[0])
        np.testing.assert_allclose(step_output[:, 0], full_output[:, -1], atol=1e-4)
        full_time = best_time(full_call, prefix, source, repeats=args.repeats)
        step_time = best_time(
            cached_step, step_input, cache, index, cross_cache, repeats=args.repeats
        )
        print(
            f"| {length} | {full_time * 1e3:.2f} | {step_time * 1e3:.2f} | "
            f"{full_time / step_time:.1f} |"
        )


if __name__ == "__main__":
    main()
