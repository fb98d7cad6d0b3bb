"""Forward+backward speed and peak memory: our MultiHeadAttention vs Keras'.

Self-attention, batch 1, 8 heads, key_dim 64 (model width 512). By default
float32 on the TensorFlow backend, in graph mode (`tf.function`) and with
XLA (`tf.function(jit_compile=True)`); `--backend jax` runs `jax.jit`
(mode "jit") and `--dtype bfloat16` runs both layers under the
`mixed_bfloat16` policy (the GPU check of the issue: JAX and TF-XLA in bf16).
For every length and mode one child process builds both layers with the same
weights, measures a large matmul in the benchmark's dtype first (the FLOP/s
ceiling), then alternates ours / Keras steps so both see the same machine
load; the ratio ours/Keras comes from that one process. Peak memory is
measured in separate child processes, one per layer, length and mode: on CPU
the process' peak RSS (ru_maxrss covers everything it ran), on a GPU the
device allocator's peak.

Children cap their data segment (RLIMIT_DATA) so that an attempt that does
not fit fails with an allocation error instead of waking the kernel's OOM
killer on a shared machine; such a failure is reported as OOM. Pass
`--memory-cap-gib 0` on a GPU machine (the cap would also limit the CUDA
driver's host mappings).

FLOP/s counts useful work only: `12 L^2 H D` for attention forward+backward
plus `24 L d^2` for the four projections forward+backward (`d = H D`),
whatever an implementation recomputes.

Usage (from the repository root):

    flock /tmp/heavy.lock python benchmarks/mha_benchmark.py \
        --lengths 256,1024,4096,8192,16384,32768 --repeats 3

On a GPU (bf16, JAX and TF with XLA):

    python benchmarks/mha_benchmark.py --backend jax --dtype bfloat16 \
        --memory-cap-gib 0
    python benchmarks/mha_benchmark.py --modes xla --dtype bfloat16 \
        --memory-cap-gib 0
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HEADS, KEY_DIM, BATCH = 8, 64, 1
WIDTH = HEADS * KEY_DIM


def _set_memory_cap(gib):
    if not gib:
        return
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _useful_flops(length):
    return 12 * length**2 * HEADS * KEY_DIM + 24 * length * WIDTH**2


def best_time(run, repeats):
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _matmul_flops_per_second(backend, dtype, size=None, repeats=5):
    """FLOP/s of a square matmul in `dtype` on the default device."""
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        size = size or (8192 if jax.default_backend() == "gpu" else 2048)
        a = jnp.ones((size, size), dtype) / size
        matmul = jax.jit(lambda a, b: jnp.sum(jnp.matmul(a, b), dtype="float32"))
        seconds = best_time(lambda: matmul(a, a).block_until_ready(), repeats)
    else:
        import tensorflow as tf

        gpu = bool(tf.config.list_logical_devices("GPU"))
        size = size or (8192 if gpu else 2048)
        a = tf.cast(tf.random.normal((size, size)), dtype)
        matmul = tf.function(lambda a, b: tf.reduce_sum(tf.cast(tf.matmul(a, b), "float32")))
        seconds = best_time(lambda: matmul(a, a).numpy(), repeats)
    return 2 * size**3 / seconds


def _make_step(backend, layer, keras_layer, mode):
    """One forward+backward step: gradients of `sum(y^2)` w.r.t. the input
    and every trainable weight, reduced to a scalar that is fetched."""
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        def loss(trainable, non_trainable, x):
            inputs = (x, x) if keras_layer else (x,)
            y, _ = layer.stateless_call(trainable, non_trainable, *inputs)
            return jnp.sum(jnp.square(y.astype("float32")))

        grad = jax.jit(jax.grad(loss, argnums=(0, 2)))
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def run(x):
            weight_grads, input_grad = grad(trainable, non_trainable, x)
            leaves = jax.tree_util.tree_leaves((weight_grads, input_grad))
            return float(sum(jnp.sum(g.astype("float32")) for g in leaves))

        return run

    import tensorflow as tf

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x) if keras_layer else layer(x)
            loss = tf.reduce_sum(tf.square(tf.cast(y, "float32")))
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        return tf.add_n([tf.reduce_sum(tf.cast(g, "float32")) for g in grads])

    compiled = tf.function(step, jit_compile=mode == "xla")
    return lambda x: compiled(x).numpy()


def _device_peak_mib(backend):
    """Peak device-allocator memory on a GPU, or None on CPU."""
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform != "gpu":
            return None
        return device.memory_stats()["peak_bytes_in_use"] / 2**20
    import tensorflow as tf

    if not tf.config.list_logical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def _build_layers(length, which, memory_efficient, block_size, dtype):
    import keras

    if dtype == "bfloat16":
        keras.config.set_dtype_policy("mixed_bfloat16")

    from keras_attention.layers import MultiHeadAttention

    layers = {}
    shape = (BATCH, length, WIDTH)
    keras.utils.set_random_seed(0)
    reference = keras.layers.MultiHeadAttention(HEADS, KEY_DIM)
    reference.build(shape, shape)
    if "keras" in which:
        layers["keras"] = reference
    if "ours" in which:
        kwargs = {"memory_efficient": memory_efficient}
        if block_size:
            kwargs["block_size"] = block_size
        layers["ours"] = MultiHeadAttention.from_keras(reference, **kwargs)
    return layers


def child(args):
    """Runs in a fresh process; prints one JSON line."""
    _set_memory_cap(args.memory_cap_gib)
    if args.backend == "jax":
        import jax

        errors = (MemoryError, jax.errors.JaxRuntimeError)

        def make_input():
            key = jax.random.PRNGKey(0)
            return jax.random.normal(key, (BATCH, args.length, WIDTH))
    else:
        import tensorflow as tf

        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        errors = (MemoryError, tf.errors.OpError)

        def make_input():
            return tf.random.normal((BATCH, args.length, WIDTH))

    result = {
        "length": args.length,
        "mode": args.mode,
        "backend": args.backend,
        "dtype": args.dtype,
        "rss_start_mib": _rss_mib(),
    }
    which = args.which.split(",")
    if args.matmul:
        result["matmul_gflops"] = _matmul_flops_per_second(args.backend, args.dtype) / 1e9
    memory_efficient = {"auto": "auto", "true": True, "false": False}[args.memory_efficient]
    layers = _build_layers(args.length, which, memory_efficient, args.block_size, args.dtype)
    x = make_input()
    result["rss_before_mib"] = _rss_mib()
    steps = {
        name: _make_step(args.backend, layer, name == "keras", args.mode)
        for name, layer in layers.items()
    }
    times = {name: [] for name in steps}
    failed = {}
    for name, step in steps.items():  # warm-up: tracing and compilation
        try:
            step(x)
        except errors as error:  # allocation failures surface as OpErrors too
            kind = (
                "OOM"
                if "xhaust" in type(error).__name__ or "memory" in str(error).lower()
                else "failed"
            )
            failed[name] = f"{kind}: {type(error).__name__}: {str(error)[:120]}"
    for _ in range(args.repeats):
        for name, step in steps.items():
            if name in failed:
                continue
            start = time.perf_counter()
            step(x)
            times[name].append(time.perf_counter() - start)
    result["times"] = times
    result["failed"] = failed
    result["rss_peak_mib"] = _rss_mib()
    result["device_peak_mib"] = _device_peak_mib(args.backend)
    print("RESULT " + json.dumps(result), flush=True)


def _run_child(args, length, mode, which, repeats, matmul):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"--length={length}",
        f"--mode={mode}",
        f"--backend={args.backend}",
        f"--dtype={args.dtype}",
        f"--which={which}",
        f"--repeats={repeats}",
        f"--memory-efficient={args.memory_efficient}",
        f"--block-size={args.block_size}",
        f"--memory-cap-gib={args.memory_cap_gib}",
    ] + (["--matmul"] if matmul else [])
    env = dict(
        os.environ,
        KERAS_BACKEND=args.backend,
        TF_CPP_MIN_LOG_LEVEL="2",
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            result["wall_s"] = wall
            return result
    if proc.returncode < 0:  # e.g. SIGSEGV when an allocation hits the cap
        why = f"killed by signal {-proc.returncode}"
    else:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        why = f"exit {proc.returncode}: {tail[0][:160]}"
    return {
        "length": length,
        "mode": mode,
        "crashed": why,
        "wall_s": wall,
    }


def _median(values):
    values = sorted(values)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024,4096,8192,16384,32768")
    parser.add_argument("--backend", default="tensorflow", choices=["tensorflow", "jax"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--modes",
        default="",
        help="tensorflow: graph,xla (default both); jax: jit",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--long-repeats",
        type=int,
        default=1,
        help="repeats for lengths >= 16384 (each step takes minutes)",
    )
    parser.add_argument(
        "--keras-max-length",
        type=int,
        default=16384,
        help="longest length at which Keras is attempted (it needs ~5 "
        "(B,H,L,L) float32 tensors: 43 GiB at 16384)",
    )
    parser.add_argument(
        "--xla-max-length",
        type=int,
        default=0,
        help="skip XLA above this length (0 = never skip); XLA on CPU is "
        "slower than graph mode here and 32768 takes ~10 min per step",
    )
    parser.add_argument("--memory-lengths", default="1024,8192,16384,32768")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--memory-efficient", default="auto", choices=["auto", "true", "false"])
    parser.add_argument("--block-size", type=int, default=0, help="0 = layer default")
    parser.add_argument("--memory-cap-gib", type=float, default=16.0)
    parser.add_argument("--json", default="", help="also write all results here")
    # Child-only arguments.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--which", default="ours,keras", help=argparse.SUPPRESS)
    parser.add_argument("--matmul", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    lengths = [int(v) for v in args.lengths.split(",") if v]
    default_modes = "jit" if args.backend == "jax" else "graph,xla"
    modes = [m for m in (args.modes or default_modes).split(",") if m]
    allowed = {"jax": {"jit"}, "tensorflow": {"graph", "xla"}}[args.backend]
    if set(modes) - allowed:
        parser.error(f"--modes for {args.backend}: {sorted(allowed)}; got {modes}")
    records = {"timing": [], "memory": []}
    print(
        f"# MultiHeadAttention fwd+bwd, batch {BATCH}, {HEADS} heads x {KEY_DIM}, "
        f"{args.dtype}, {args.backend} backend; "
        f"memory_efficient={args.memory_efficient}",
        flush=True,
    )
    header = (
        f"{'L':>6} {'mode':>5} {'ours s':>9} {'keras s':>9} {'ratio':>6} "
        f"{'ours %mm':>8} {'keras %mm':>9} {'matmul GF/s':>11}"
    )
    print(header, flush=True)
    for length in lengths:
        for mode in modes:
            if mode == "xla" and args.xla_max_length and length > args.xla_max_length:
                print(f"{length:>6} {mode:>5} skipped (--xla-max-length)", flush=True)
                continue
            which = "ours,keras" if length <= args.keras_max_length else "ours"
            repeats = args.repeats if length < 16384 else args.long_repeats
            result = _run_child(args, length, mode, which, repeats, matmul=True)
            if "crashed" in result and which == "ours,keras":
                # The process died (Keras' allocation): time ours alone.
                crashed = result["crashed"]
                result = _run_child(args, length, mode, "ours", repeats, matmul=True)
                result.setdefault("failed", {})["keras"] = f"process died ({crashed})"
            records["timing"].append(result)
            if "crashed" in result:
                print(f"{length:>6} {mode:>5} ours crashed: {result['crashed']}", flush=True)
                continue
            rate = result["matmul_gflops"]
            ours = _median(result["times"].get("ours", []))
            theirs = _median(result["times"].get("keras", []))
            flops = _useful_flops(length) / 1e9

            def fmt(seconds):
                return f"{seconds:9.3f}" if seconds else f"{'-':>9}"

            def frac(seconds, flops=flops, rate=rate):
                return f"{100 * flops / seconds / rate:7.1f}%" if seconds else f"{'-':>8}"

            # Steps alternate ours / Keras: the median of the per-repeat
            # ratios follows the machine's load drifting between repeats
            # better than the ratio of the medians. A layer that failed or
            # was not run has no times, and then there are no pairs.
            pairs = [
                a / b
                for a, b in zip(
                    result["times"].get("ours", []), result["times"].get("keras", []), strict=False
                )
            ]
            ratio = f"{_median(pairs):6.2f}" if pairs else f"{'-':>6}"
            note = "; ".join(f"{k}: {v}" for k, v in result.get("failed", {}).items())
            if length > args.keras_max_length:
                note = "keras: not attempted (needs > machine memory)"
            print(
                f"{length:>6} {mode:>5} {fmt(ours)} {fmt(theirs)} {ratio} "
                f"{frac(ours)} {frac(theirs):>9} {rate:11.1f}  {note}",
                flush=True,
            )
    if not args.no_memory:
        print(
            "\n# Peak RSS (MiB) of one process doing one fwd+bwd step "
            "(incl. compilation); 'net' subtracts the RSS before the step",
            flush=True,
        )
        print(f"{'L':>6} {'mode':>5} {'impl':>6} {'peak':>8} {'net':>8}", flush=True)
        for length in [int(v) for v in args.memory_lengths.split(",") if v]:
            for mode in modes:
                if mode == "xla" and args.xla_max_length and length > args.xla_max_length:
                    continue
                for which in ("ours", "keras"):
                    if which == "keras" and length > args.keras_max_length:
                        continue
                    # Long lengths: the timing child ran ours alone, reuse it.
                    reused = [
                        r
                        for r in records["timing"]
                        if r.get("length") == length
                        and r.get("mode") == mode
                        and which == "ours"
                        and "crashed" not in r
                        and set(r.get("times", {})) == {"ours"}
                    ]
                    result = (
                        reused[0]
                        if reused
                        else _run_child(args, length, mode, which, 0, matmul=False)
                    )
                    records["memory"].append(dict(result, impl=which))
                    failure = result.get("crashed") or result.get("failed", {}).get(which)
                    if failure:
                        why = failure
                        print(f"{length:>6} {mode:>5} {which:>6}  OOM/failed: {why}", flush=True)
                        continue
                    device_peak = result.get("device_peak_mib")
                    if device_peak is not None:  # GPU: the allocator's peak
                        print(
                            f"{length:>6} {mode:>5} {which:>6} {device_peak:8.0f} {'(device)':>8}",
                            flush=True,
                        )
                        continue
                    peak = result["rss_peak_mib"]
                    net = peak - result["rss_before_mib"]
                    print(f"{length:>6} {mode:>5} {which:>6} {peak:8.0f} {net:8.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
