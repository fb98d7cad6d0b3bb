"""KerasHub's Llama and Gemma 3 attention against ours built from them (#37).

`MultiHeadAttention.from_keras_hub(theirs)` gives ours with the same weights.
One training step each (forward + backward: gradients of the input and every
weight), batch 1, hidden 512, 8 query heads of 64, 4 key/value heads, causal,
float32, on this machine's CPU:

- `--timing`: one process, calls alternating, median of `--repeats`, at
  `--lengths`; TF graph (`tf.function`) or JAX (`jax.jit`) by KERAS_BACKEND.
  Theirs is called as its decoder calls it (a dense causal `attention_mask`);
  ours as a Keras user calls it (`use_causal_mask=True`) and, for the record,
  with their dense mask too, and with the blockwise kernel forced
  (`memory_efficient=True`). Peak memory of each at each length comes from
  fresh processes (`--memory`): the step's peak RSS above the process's RSS
  before it.
- `--long L`: Gemma 3's configuration (QK-norm, soft cap none, local window
  1024 or none) at `L` tokens with ours (the blockwise kernel): time and peak
  RSS of one training step; KerasHub's layer is tried at each of
  `--their-lengths` in a fresh process capped at `--cap-gib` of address space,
  and the largest that fits is reported with its peak.

    KERAS_BACKEND=tensorflow python benchmarks/keras_hub_attention.py --timing
    KERAS_BACKEND=jax python benchmarks/keras_hub_attention.py --timing
    KERAS_BACKEND=tensorflow python benchmarks/keras_hub_attention.py --long 32768
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import keras
import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 512, 8, 4, 64
BACKEND = keras.backend.backend()


def _rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build(family, window=None, **overrides):
    """`(theirs, ours)` with the same random weights (`overrides` go to
    ours, e.g. `memory_efficient=True`)."""
    from keras_hub.src.models.gemma3.gemma3_attention import CachedGemma3Attention
    from keras_hub.src.models.llama.llama_attention import LlamaAttention

    import keras_attention as ka

    if family == "llama":
        theirs = LlamaAttention(HEADS, KV_HEADS, rope_max_wavelength=500000)
    else:
        theirs = CachedGemma3Attention(
            head_dim=HEAD_DIM,
            num_query_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            use_query_key_norm=True,
            use_sliding_window_attention=window is not None,
            sliding_window_size=window or 4096,
        )
    theirs.build((1, 16, HIDDEN))
    rng = np.random.default_rng(0)
    theirs.set_weights([rng.normal(scale=0.05, size=w.shape) for w in theirs.get_weights()])
    return theirs, ka.MultiHeadAttention.from_keras_hub(theirs, **overrides)


def _arguments(kind, layer, x, mask):
    """`(args, kwargs)` of a call: theirs as its decoder calls it, ours as a
    Keras user does (or with their dense mask)."""
    if kind == "theirs":
        if "Gemma" in type(layer).__name__:
            return (x,), {"attention_mask": mask}
        return (), {"hidden_states": x, "attention_mask": mask}
    if kind == "ours_dense_mask":
        return (x,), {"attention_mask": mask}
    return (x,), {"use_causal_mask": True}


def training_step(kind, layer, length):
    """A compiled `step(x) -> gradients` of one training step."""
    # Ours as a Keras user calls it needs no mask: none is built (at 32768
    # tokens a dense one is 4 GiB).
    mask = None if kind == "ours" else np.tril(np.ones((length, length), "int32"))[None]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        mask = None if mask is None else tf.constant(mask)

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                args, kwargs = _arguments(kind, layer, x, mask)
                y = layer(*args, **kwargs)
                loss = tf.reduce_mean(y * y)
            return tape.gradient(loss, [x] + layer.trainable_variables)

        return step
    import jax

    trainable = [v.value for v in layer.trainable_variables]
    frozen = [v.value for v in layer.non_trainable_variables]
    mask = None if mask is None else jax.numpy.asarray(mask)

    def loss(weights, x):
        args, kwargs = _arguments(kind, layer, x, mask)
        y, _ = layer.stateless_call(weights, frozen, *args, **kwargs)
        return jax.numpy.mean(y * y)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return lambda x: jax.tree_util.tree_leaves(grad(trainable, x))


def _finish(results):
    for r in results:
        np.asarray(r)


def timing(lengths, repeats):
    rows = []
    for family in ("llama", "gemma3"):
        theirs, ours = build(family)
        blockwise = build(family, memory_efficient=True)[1]
        for length in lengths:
            x = keras.ops.convert_to_tensor(
                np.random.default_rng(1).normal(size=(1, length, HIDDEN)).astype("float32")
            )
            steps = {
                "theirs": training_step("theirs", theirs, length),
                "ours": training_step("ours", ours, length),
                "ours_dense_mask": training_step("ours_dense_mask", ours, length),
                "ours_blockwise": training_step("ours", blockwise, length),
            }
            times = {k: [] for k in steps}
            for step in steps.values():
                _finish(step(x))
            for _ in range(repeats):
                for name, step in steps.items():
                    start = time.perf_counter()
                    _finish(step(x))
                    times[name].append(time.perf_counter() - start)
            median = {k: float(np.median(v)) for k, v in times.items()}
            row = dict(
                backend=BACKEND,
                family=family,
                length=length,
                kernel=ours.kernel_for(
                    (1, length, HIDDEN), training=True, use_causal_mask=True
                ).value,
                **{f"{k}_s": round(v, 4) for k, v in median.items()},
                ratio=round(median["ours"] / median["theirs"], 3),
                ratio_dense_mask=round(median["ours_dense_mask"] / median["theirs"], 3),
                ratio_blockwise=round(median["ours_blockwise"] / median["theirs"], 3),
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def memory_child(kind, family, length, window):
    # "ours_blockwise": ours with the blockwise kernel forced.
    theirs, ours = build(
        family, window, memory_efficient=True if kind == "ours_blockwise" else "auto"
    )
    layer = theirs if kind == "theirs" else ours
    kind = "ours" if kind == "ours_blockwise" else kind
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(1).normal(size=(1, length, HIDDEN)).astype("float32")
    )
    before = _rss_mib()
    step = training_step(kind, layer, length)
    start = time.perf_counter()
    grads = step(x)
    finite = all(bool(np.all(np.isfinite(np.asarray(g)))) for g in grads)
    first = time.perf_counter() - start
    start = time.perf_counter()
    _finish(step(x))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kernel = "-"
    if kind != "theirs":
        kernel = ours.kernel_for((1, length, HIDDEN), training=True, use_causal_mask=True).value
    print(
        "RESULT "
        + json.dumps(
            dict(
                backend=BACKEND,
                kind=kind,
                family=family,
                length=length,
                window=window,
                seconds=round(seconds, 3),
                first_seconds=round(first, 3),
                peak_rss_mib=round(peak),
                step_peak_mib=round(peak - before),
                finite=finite,
                kernel=kernel,
            )
        ),
        flush=True,
    )


def in_child(kind, family, length, window=None, cap_gib=None):
    """The `memory_child` figures from a fresh process, or the reason it died."""
    args = [sys.executable, __file__, "--child", kind, family, str(length), str(window or 0)]
    label = kind

    def limit():
        if cap_gib:
            cap = int(cap_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    done = subprocess.run(args, capture_output=True, text=True, preexec_fn=limit, env=os.environ)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]), kind=label)
    tail = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
    return dict(kind=kind, family=family, length=length, failed=f"rc {done.returncode}: {tail}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--long", type=int, default=0)
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--their-lengths", default="4096,8192,16384")
    parser.add_argument("--cap-gib", type=float, default=14.0)
    parser.add_argument("--child", nargs=4)
    args = parser.parse_args()
    if args.child:
        kind, family, length, window = args.child
        memory_child(kind, family, int(length), int(window) or None)
        return
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.timing:
        timing(lengths, args.repeats)
    if args.memory:
        for family in ("llama", "gemma3"):
            for length in lengths:
                for kind in ("theirs", "ours", "ours_blockwise"):
                    print(json.dumps(in_child(kind, family, length)), flush=True)
    if args.long:
        window = args.window or None
        print(json.dumps(in_child("ours", "gemma3", args.long, window)), flush=True)
        for length in (int(n) for n in args.their_lengths.split(",")):
            print(
                json.dumps(in_child("theirs", "gemma3", length, window, args.cap_gib)), flush=True
            )


if __name__ == "__main__":
    main()
