"""Cost of `masking.confine_nonfinite` (NaN behind per-query masks, issue 11).

Two measurements, TensorFlow graph mode, 8 heads of 64 (width 512), batch 1,
float32:

- `step`: MultiHeadAttention forward+backward (gradients of the input and
  every weight), two `tf.function`s over the same layer and input, one traced
  with the helper replaced by the identity; steps alternate (the order flips
  each pair) and the median of the per-pair ratios is reported, so the
  machine's load hits both alike.
- `alone`: the helper by itself, forward+backward, on `(1, L, 8, 64)` keys and
  values: its absolute cost, to set against the step's time.

    KERAS_BACKEND=tensorflow python benchmarks/confine_nonfinite_cost.py \
        --lengths 1024,4096,8192 --repeats 6 [--causal]
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import keras_attention as ka
from keras_attention.ops import masking


def _timed(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = function()
        _ = out[0].numpy()
        times.append(time.perf_counter() - start)
    return times


def step_ratio(length, repeats, causal):
    layer = ka.MultiHeadAttention(8, 64)
    x = tf.constant(np.random.default_rng(0).standard_normal((1, length, 512)), tf.float32)
    layer(x[:, :8])

    def step():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, use_causal_mask=causal)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    with_helper = tf.function(step)
    with_helper()
    original = masking.confine_nonfinite
    masking.confine_nonfinite = lambda key, value: (key, value)
    try:
        without = tf.function(step)
        without()
    finally:
        masking.confine_nonfinite = original
    ratios, on, off = [], [], []
    for i in range(repeats):
        pair = [(with_helper, on), (without, off)]
        for function, store in pair[:: 1 if i % 2 else -1]:
            store.extend(_timed(function, 1))
        ratios.append(on[-1] / off[-1])
    print(
        f"step  L={length} causal={causal} kernel={layer.kernel_for(tuple(x.shape)).value}: "
        f"with {np.median(on):.3f} s, without {np.median(off):.3f} s, "
        f"median ratio {np.median(ratios):.3f} (min {min(ratios):.3f}, "
        f"max {max(ratios):.3f}, {repeats} pairs)"
    )


def helper_alone(length, repeats):
    rng = np.random.default_rng(0)
    key = tf.constant(rng.standard_normal((1, length, 8, 64)), tf.float32)
    value = tf.constant(rng.standard_normal((1, length, 8, 64)), tf.float32)

    @tf.function
    def confine():
        with tf.GradientTape() as tape:
            tape.watch([key, value])
            k, v = masking.confine_nonfinite(key, value)
            loss = tf.reduce_sum(k) + tf.reduce_sum(v)
        return tape.gradient(loss, [key, value])

    confine()
    times = _timed(confine, repeats)
    print(
        f"alone L={length}: fwd+bwd median {1e3 * np.median(times):.2f} ms "
        f"(min {1e3 * min(times):.2f} ms, {repeats} runs)"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,8192")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--alone-repeats", type=int, default=30)
    args = parser.parse_args()
    for length in (int(n) for n in args.lengths.split(",")):
        helper_alone(length, args.alone_repeats)
        step_ratio(length, args.repeats, args.causal)


if __name__ == "__main__":
    main()
