"""Programmable attention (#36): what the mask rules and score modifiers cost.

TensorFlow graph mode (`tf.function`), `memory_efficient_attention` forward +
backward (gradients of q, k and v), 8 heads of 64, batch 1, float32, one
process; calls alternate and each figure is the median of `--repeats`:

- `packed`: `--length` tokens packed as `--documents` equal documents, causal.
  Ours: the blockwise kernel with `segment_ids` (it skips the tiles of other
  documents) against the same call spelled as a dense boolean
  `attention_mask` `(1, L, L)` (block-diagonal and causal), which the kernel
  must read tile by tile and cannot skip. Also the fraction of tiles skipped
  (of the causal kernel's tiles, and of all tiles).
- `modifiers`: the plain causal blockwise kernel against the same with a soft
  cap (50), ALiBi (the paper's slopes) and learned sinks, each alone.
- `gemma2` (`--gemma2`): Gemma 2's attention (soft cap 50, causal sliding
  window 4096) in a `MultiHeadAttention` at `--gemma2-length` tokens,
  forward + backward of one training step: time, peak RSS, finite gradients,
  and what Keras' `ops.dot_product_attention(attn_logits_soft_cap=50)` does
  with the same call.

    KERAS_BACKEND=tensorflow python benchmarks/programmable_attention.py \
        --length 8192 --documents 8 --repeats 3 [--gemma2 --gemma2-length 16384]
    KERAS_BACKEND=jax python benchmarks/programmable_attention.py --skip-packed

`--xla` compiles the TensorFlow steps with `jit_compile=True`; on JAX the
modifiers' steps are `jax.jit(jax.grad(...))`. `--cpu-time` times by the
process's CPU time, for a machine shared with other work.
"""

import argparse
import resource
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attention.ops import AttentionMask
from keras_attention.ops import ScoreModifier
from keras_attention.ops import alibi_slopes
from keras_attention.ops.memory_efficient import memory_efficient_attention

HEADS, HEAD_DIM, BLOCK = 8, 64, 512


XLA = False  # --xla: every step compiled with `jit_compile=True`


CPU_TIME = False  # --cpu-time: the process's CPU time instead of wall time


def _jax_step(mask, modifier=None):
    import jax
    import jax.numpy as jnp

    def loss(q, k, v):
        out = memory_efficient_attention(q, k, v, mask=mask, modifier=modifier, block_size=BLOCK)
        return jnp.sum(out * out)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _step(mask, modifier=None):
    if keras.backend.backend() == "jax":
        return _jax_step(mask, modifier)

    @tf.function(jit_compile=XLA)
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = memory_efficient_attention(
                q, k, v, mask=mask, modifier=modifier, block_size=BLOCK
            )
            loss = tf.reduce_sum(out * out)
        return tape.gradient(loss, [q, k, v])

    return step


def _median_times(steps, inputs, repeats):
    """Alternating runs of each step (one warm-up each): median seconds."""
    clock = time.process_time if CPU_TIME else time.perf_counter
    for step in steps.values():
        keras.ops.convert_to_numpy(step(*inputs)[0])
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = clock()
            keras.ops.convert_to_numpy(step(*inputs)[0])
            times[name].append(clock() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def _inputs(length):
    rng = np.random.default_rng(0)
    return [
        keras.ops.convert_to_tensor(
            rng.standard_normal((1, length, HEADS, HEAD_DIM)).astype("float32")
        )
        for _ in range(3)
    ]


def packed(length, documents, repeats):
    ids = np.repeat(np.arange(documents), length // documents)[None].astype("int32")
    rows, cols = np.arange(length)[:, None], np.arange(length)[None]
    dense = (ids[0][:, None] == ids[0][None]) & (cols <= rows)
    size = length // documents

    def same_document(batch, head, q_idx, k_idx):  # the documents as a `mask_mod`
        return tf.equal(q_idx // size, k_idx // size)

    steps = {
        "segment_ids": _step(steps_mask(ids)),
        "mask_mod": _step(AttentionMask(causal=True, mask_mod=same_document)),
        "dense_mask": _step(AttentionMask(pair_mask=tf.constant(dense[None]))),
    }
    times = _median_times(steps, _inputs(length), repeats)
    computed, causal_tiles, blocks = visited_tiles(steps_mask(ids), length)
    print(
        f"packed L={length} documents={documents}: segment_ids {times['segment_ids']:.2f} s, "
        f"the same as a mask_mod {times['mask_mod']:.2f} s, "
        f"dense attention_mask {times['dense_mask']:.2f} s, "
        f"ratio {times['segment_ids'] / times['dense_mask']:.3f} "
        f"(mask_mod {times['mask_mod'] / times['dense_mask']:.3f}); tiles computed "
        f"{computed} of {blocks * blocks} ({1 - computed / blocks**2:.1%} skipped; "
        f"{1 - computed / causal_tiles:.1%} of the causal kernel's {causal_tiles})"
    )


def steps_mask(ids):
    return AttentionMask(causal=True, query_segment_ids=ids, key_segment_ids=ids)


def visited_tiles(mask, length):
    """Tiles the blockwise kernel computes under `mask` (from the same
    `key_block_ranges` / `segment_block_bounds` it loops over), the causal
    kernel's tiles, and the number of blocks."""
    blocks = -(-length // BLOCK)
    bounds = mask.segment_block_bounds(BLOCK, blocks, BLOCK, blocks)
    computed = 0
    for i in range(blocks):
        cut = (int(bounds[0][i]), int(bounds[1][i]))
        first = i * BLOCK
        for start, stop in mask.key_block_ranges(first, first + BLOCK - 1, BLOCK, blocks, cut):
            computed += max(int(stop) - int(start), 0)
    return computed, blocks * (blocks + 1) // 2, blocks


def modifiers(length, repeats):
    causal = AttentionMask(causal=True)
    sinks = keras.Variable(np.zeros(HEADS, "float32"))
    steps = {
        "plain": _step(causal),
        "soft_cap": _step(causal, ScoreModifier(soft_cap=50.0)),
        "alibi": _step(causal, ScoreModifier(alibi_slopes=alibi_slopes(HEADS))),
        "sinks": _step(causal, ScoreModifier(sink_logits=sinks)),
    }
    times = _median_times(steps, _inputs(length), repeats)
    plain = times["plain"]
    mode = "JAX jit" if keras.backend.backend() == "jax" else ("TF XLA" if XLA else "TF graph")
    clock = "CPU" if CPU_TIME else "wall"
    print(
        f"modifiers L={length} causal, {mode}, {clock} time: plain {plain:.2f} s; "
        + ", ".join(
            f"{name} {t:.2f} s ({t / plain:.3f}x)" for name, t in times.items() if name != "plain"
        )
    )


def gemma2(length):
    import keras

    import keras_attention as ka

    layer = ka.MultiHeadAttention(
        num_heads=HEADS,
        key_dim=HEAD_DIM // 2,
        num_key_value_heads=HEADS // 2,
        logit_soft_cap=50.0,
        sliding_window=4096,
        memory_efficient=True,
    )
    x = tf.constant(np.random.default_rng(0).standard_normal((1, length, 256)), tf.float32)
    layer(x[:, :8], use_causal_mask=True)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, use_causal_mask=True)
            loss = tf.reduce_mean(y * y)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    start = time.perf_counter()
    grads = step(x)
    first = time.perf_counter() - start
    start = time.perf_counter()
    grads = step(x)
    finite = all(bool(np.all(np.isfinite(g.numpy()))) for g in grads)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"gemma2 L={length}: forward+backward {seconds:.1f} s (first, with tracing, "
        f"{first:.1f} s), finite gradients {finite}, peak RSS {peak:.0f} MiB, "
        f"kernel {layer.kernel_for(tuple(x.shape)).value}"
    )
    q = tf.zeros((1, 64, HEADS, HEAD_DIM // 2))
    try:
        keras.ops.dot_product_attention(q, q, q, is_causal=True, attn_logits_soft_cap=50.0)
        print("keras.ops.dot_product_attention(attn_logits_soft_cap=50): ran")
    except Exception as error:  # noqa: BLE001 - what Keras raises is the figure
        print(
            "keras.ops.dot_product_attention(attn_logits_soft_cap=50): "
            f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-packed", action="store_true")
    parser.add_argument("--skip-modifiers", action="store_true")
    parser.add_argument("--gemma2", action="store_true")
    parser.add_argument("--gemma2-length", type=int, default=16384)
    parser.add_argument("--xla", action="store_true")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the process's CPU time (a machine shared with other work)",
    )
    args = parser.parse_args()
    global XLA, CPU_TIME
    XLA, CPU_TIME = args.xla, args.cpu_time
    if keras.backend.backend() == "jax" and (not args.skip_packed or args.gemma2):
        parser.error("on JAX only the modifiers run: pass --skip-packed, without --gemma2")
    if not args.skip_packed:
        packed(args.length, args.documents, args.repeats)
    if not args.skip_modifiers:
        modifiers(args.length, args.repeats)
    if args.gemma2:
        gemma2(args.gemma2_length)


if __name__ == "__main__":
    main()
