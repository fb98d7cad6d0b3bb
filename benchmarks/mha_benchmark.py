"""Forward+backward speed and peak memory: our MultiHeadAttention vs Keras'.

Self-attention, batch 1, 8 heads, key_dim 64 (model width 512), float32,
TensorFlow backend, in graph mode (`tf.function`) and with XLA
(`tf.function(jit_compile=True)`). For every length and mode one child
process builds both layers with the same weights, measures a large float32
matmul first (the FLOP/s ceiling), then alternates ours / Keras steps so both
see the same machine load; the ratio ours/Keras comes from that one process.
Peak memory (ru_maxrss) is measured in separate child processes, one per
layer, length and mode, because a process' peak covers everything it ran.

Children cap their data segment (RLIMIT_DATA) so that an attempt that does
not fit fails with an allocation error instead of waking the kernel's OOM
killer on a shared machine; such a failure is reported as OOM.

FLOP/s counts useful work only: `12 L^2 H D` for attention forward+backward
plus `24 L d^2` for the four projections forward+backward (`d = H D`),
whatever an implementation recomputes.

Usage (from the repository root):

    flock /tmp/heavy.lock python benchmarks/mha_benchmark.py \
        --lengths 256,1024,4096,8192,16384,32768 --repeats 3
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
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _useful_flops(length):
    return 12 * length**2 * HEADS * KEY_DIM + 24 * length * WIDTH**2


def _matmul_flops_per_second(tf, size=2048, repeats=5):
    a = tf.random.normal((size, size))
    b = tf.random.normal((size, size))
    matmul = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)))
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def _make_step(tf, layer, keras_layer, xla):
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x) if keras_layer else layer(x)
            loss = tf.reduce_sum(y * y)
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    return tf.function(step, jit_compile=xla)


def _build_layers(length, which, memory_efficient, block_size):
    import keras

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
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    result = {"length": args.length, "mode": args.mode, "rss_start_mib": _rss_mib()}
    xla = args.mode == "xla"
    which = args.which.split(",")
    if args.matmul:
        result["matmul_gflops"] = _matmul_flops_per_second(tf) / 1e9
    memory_efficient = {"auto": "auto", "true": True, "false": False}[args.memory_efficient]
    layers = _build_layers(args.length, which, memory_efficient, args.block_size)
    x = tf.random.normal((BATCH, args.length, WIDTH))
    result["rss_before_mib"] = _rss_mib()
    steps = {
        name: _make_step(tf, layer, name == "keras", xla)
        for name, layer in layers.items()
    }
    times = {name: [] for name in steps}
    failed = {}
    for name, step in steps.items():  # warm-up: tracing and compilation
        try:
            step(x).numpy()
        except (tf.errors.ResourceExhaustedError, MemoryError) as error:
            failed[name] = f"OOM: {type(error).__name__}"
        except tf.errors.OpError as error:  # allocation failures surface here too
            failed[name] = f"failed: {type(error).__name__}: {str(error)[:120]}"
    for _ in range(args.repeats):
        for name, step in steps.items():
            if name in failed:
                continue
            start = time.perf_counter()
            step(x).numpy()
            times[name].append(time.perf_counter() - start)
    result["times"] = times
    result["failed"] = failed
    result["rss_peak_mib"] = _rss_mib()
    print("RESULT " + json.dumps(result), flush=True)


def _run_child(args, length, mode, which, repeats, matmul):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        f"--length={length}",
        f"--mode={mode}",
        f"--which={which}",
        f"--repeats={repeats}",
        f"--memory-efficient={args.memory_efficient}",
        f"--block-size={args.block_size}",
        f"--memory-cap-gib={args.memory_cap_gib}",
    ] + (["--matmul"] if matmul else [])
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["wall_s"] = wall
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
    return {
        "length": length,
        "mode": mode,
        "crashed": f"exit {proc.returncode}: {tail[0][:160]}",
        "wall_s": wall,
    }


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024,4096,8192,16384,32768")
    parser.add_argument("--modes", default="graph,xla")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--long-repeats", type=int, default=1,
        help="repeats for lengths >= 16384 (each step takes minutes)",
    )
    parser.add_argument(
        "--keras-max-length", type=int, default=16384,
        help="longest length at which Keras is attempted (it needs ~5 "
        "(B,H,L,L) float32 tensors: 43 GiB at 16384)",
    )
    parser.add_argument(
        "--xla-max-length", type=int, default=0,
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
    modes = [m for m in args.modes.split(",") if m]
    records = {"timing": [], "memory": []}
    print(
        f"# MultiHeadAttention fwd+bwd, batch {BATCH}, {HEADS} heads x {KEY_DIM}, "
        f"float32, TF backend; memory_efficient={args.memory_efficient}",
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

            def frac(seconds):
                return f"{100 * flops / seconds / rate:7.1f}%" if seconds else f"{'-':>8}"

            ratio = f"{ours / theirs:6.2f}" if ours and theirs else f"{'-':>6}"
            note = "; ".join(f"{k}: {v}" for k, v in result.get("failed", {}).items())
            if length > args.keras_max_length:
                note = "keras: not attempted (needs > machine memory)"
            print(
                f"{length:>6} {mode:>5} {fmt(ours)} {fmt(theirs)} {ratio} "
                f"{frac(ours)} {frac(theirs):>9} {rate:11.1f}  {note}",
                flush=True,
            )
    if not args.no_memory:
        print("\n# Peak RSS (MiB) of one process doing one fwd+bwd step "
              "(incl. compilation); 'net' subtracts the RSS before the step", flush=True)
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
                        r for r in records["timing"]
                        if r.get("length") == length and r.get("mode") == mode
                        and which == "ours" and "crashed" not in r
                        and set(r.get("times", {})) == {"ours"}
                    ]
                    result = reused[0] if reused else _run_child(
                        args, length, mode, which, 0, matmul=False
                    )
                    records["memory"].append(dict(result, impl=which))
                    if "crashed" in result or result.get("failed"):
                        why = result.get("crashed") or result["failed"]
                        print(f"{length:>6} {mode:>5} {which:>6}  OOM/failed: {why}", flush=True)
                        continue
                    peak = result["rss_peak_mib"]
                    net = peak - result["rss_before_mib"]
                    print(f"{length:>6} {mode:>5} {which:>6} {peak:8.0f} {net:8.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
