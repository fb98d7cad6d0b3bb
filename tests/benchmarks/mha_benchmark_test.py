"""The MultiHeadAttention benchmark runs on every backend/dtype it offers.

Only that it runs and reports both layers: speed and memory are measured by
running the script itself (benchmarks/RESULTS.md), never in tests. The
bfloat16 and JAX paths are what a GPU machine runs; they must not rot on
CPU-only CI.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "mha_benchmark.py")


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.parametrize(
    "options, mode",
    [
        (["--modes", "graph", "--memory-lengths", ""], "graph"),
        (["--backend", "jax", "--dtype", "bfloat16"], "jit"),
    ],
)
def test_benchmark_times_both_layers_and_measures_memory(tmp_path, options, mode):
    report = tmp_path / "report.json"
    command = [
        sys.executable,
        SCRIPT,
        "--lengths",
        "64",
        "--repeats",
        "1",
        "--memory-lengths",
        "64",
        "--json",
        str(report),
    ] + options
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    records = json.loads(report.read_text())
    (timing,) = records["timing"]
    assert timing["mode"] == mode
    assert timing["failed"] == {}
    assert len(timing["times"]["ours"]) == len(timing["times"]["keras"]) == 1
    assert timing["matmul_gflops"] > 0
    if "jax" not in options:
        return
    impls = sorted(r["impl"] for r in records["memory"])
    assert impls == ["keras", "ours"]
    for record in records["memory"]:
        assert record["rss_peak_mib"] >= record["rss_before_mib"] > 0
