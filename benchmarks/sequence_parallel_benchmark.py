"""Ring attention: per-device memory and time vs sequence length on 1/2/4 devices.

JAX, forced host devices (`--xla_force_host_platform_device_count=N`, one
subprocess per N). A step is forward + backward of `sum(out * cotangent)`
with respect to q, k, v (batch 1, 8 heads of 64, self-attention, causal or
not), compiled with `jax.jit`.

Memory: XLA's own accounting of the compiled SPMD program
(`compiled.memory_analysis()`), which is per device: arguments + outputs +
temporaries of one device's program. Time: the fastest of `--repeats`
steps after one warm-up. In the same run, on one device: the anchor, JAX's
exact `jax.nn.dot_product_attention` (materialised `L x L` weights), and
our blockwise kernel (`memory_efficient_attention`).

On CPU, N forced host devices share the machine's cores: the time columns
show the ring's overhead (N hops, N smaller matmuls, collectives) at equal
total length and equal total compute, not a speed-up.

Usage:
    PYTHONPATH=$PWD flock /tmp/heavy.lock \
        python benchmarks/sequence_parallel_benchmark.py [--lengths 1024 2048 4096 8192]
"""

import argparse
import json
import os
import subprocess
import sys
import time

HEADS, HEAD_DIM = 8, 64


def child(devices, lengths, repeats, causal):
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    from keras_attention.ops.attention_mask import AttentionMask
    from keras_attention.ops.memory_efficient import memory_efficient_attention
    from keras_attention.ops.ring import ring_attention

    mesh = Mesh(np.array(jax.devices()), ("sequence",))
    rule = AttentionMask(causal=causal)
    kernels = {"ring": lambda q, k, v: ring_attention(q, k, v, mesh=mesh, mask=rule)}
    if causal and devices > 1:
        # Same process, same load: the default (zigzag under the causal rule)
        # against contiguous blocks, whose last device does N times the first's work.
        kernels["ring_contiguous"] = lambda q, k, v: ring_attention(
            q, k, v, mesh=mesh, mask=rule, balance="contiguous"
        )
    if devices == 1:
        kernels["exact_jax"] = lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal
        )
        kernels["blockwise"] = lambda q, k, v: memory_efficient_attention(
            q, k, v, mask=rule, block_size=1024
        )
    rows = []
    for length in lengths:
        rng = np.random.default_rng(0)
        q, k, v, cotangent = (
            jnp.asarray(rng.normal(size=(1, length, HEADS, HEAD_DIM)), jnp.float32)
            for _ in range(4)
        )
        for name, kernel in kernels.items():

            def step(q, k, v, kernel=kernel, cotangent=cotangent):
                out, pullback = jax.vjp(kernel, q, k, v)
                return pullback(cotangent)

            compiled = jax.jit(step).lower(q, k, v).compile()
            memory = compiled.memory_analysis()
            per_device = (
                memory.argument_size_in_bytes
                + memory.output_size_in_bytes
                + memory.temp_size_in_bytes
            )
            jax.block_until_ready(compiled(q, k, v))
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                jax.block_until_ready(compiled(q, k, v))
                times.append(time.perf_counter() - start)
            rows.append(
                {
                    "devices": devices,
                    "kernel": name,
                    "length": length,
                    "memory_mib": per_device / 2**20,
                    "temp_mib": memory.temp_size_in_bytes / 2**20,
                    "seconds": min(times),
                }
            )
    print("RESULT " + json.dumps(rows), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.lengths, args.repeats, args.causal)
    rows = []
    for devices in args.devices:
        command = [
            sys.executable,
            __file__,
            "--child",
            str(devices),
            "--repeats",
            str(args.repeats),
            "--lengths",
            *map(str, args.lengths),
        ]
        if args.causal:
            command.append("--causal")
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rows += json.loads(
            [line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:]
        )
    baseline = {r["length"]: r for r in rows if r["kernel"] == "ring" and r["devices"] == 1}
    exact = {r["length"]: r for r in rows if r["kernel"] == "exact_jax"}
    print(f"causal={args.causal}, batch 1, {HEADS} heads x {HEAD_DIM}, forward+backward")
    print(
        "| kernel | devices | L | per-device memory | temporaries | vs ring on 1 device "
        "| time | time vs ring on 1 device | time vs exact (JAX) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(
        rows, key=lambda r: (r["length"], r["kernel"] != "exact_jax", r["kernel"], r["devices"])
    ):
        base, anchor = baseline[r["length"]], exact[r["length"]]
        print(
            f"| {r['kernel']} | {r['devices']} | {r['length']} | "
            f"{r['memory_mib']:.1f} MiB | {r['temp_mib']:.1f} MiB | "
            f"{r['memory_mib'] / base['memory_mib']:.2f}x | {r['seconds'] * 1e3:.0f} ms | "
            f"{r['seconds'] / base['seconds']:.2f}x | "
            f"{r['seconds'] / anchor['seconds']:.2f}x |"
        )


if __name__ == "__main__":
    main()
