"""The tile-plan and bounded-cache benchmarks run on both backends and report.

Only that they run and print their rows (the plan against the kernel before
it, with the plan's tile fractions and the grads agreeing; the ring cache
beside the full one): their figures come from running the scripts
(benchmarks/RESULTS.md), never from tests.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run(script, args, backend):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT),
    )
    return done.stdout.strip().splitlines()


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_tile_plan_benchmark_compares_with_the_kernel_before(backend):
    # On JAX the plan runs at tiles of 256 (`--plan-block`), the kernel before at 512.
    smaller = ["--plan-block", "256"] if backend == "jax" else []
    lines = _run(
        "tile_plan.py",
        ["--lengths", "1024", "--repeats", "1", "--model", "--model-length", "256", *smaller],
        backend,
    )
    rows = [line for line in lines if line.startswith("L=1024")]
    assert len(rows) == 2, lines
    for row in rows:
        assert ("plan (tiles of 256) " in row) == bool(smaller), row
        assert float(re.search(r"ratio ([0-9.]+)", row).group(1)) > 0, row
        assert float(re.search(r"grad difference\| ([0-9.e+-]+)", row).group(1)) < 1e-3, row
    assert "traces 1;" in lines[-1], lines


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_bounded_cache_benchmark_reports_both_caches(backend):
    lines = _run(
        "bounded_cache.py", ["--contexts", "4200", "--steps", "4", "--repeats", "1"], backend
    )
    assert [line.split()[:2] for line in lines[-2:]] == [["4200", "full"], ["4200", "ring"]], lines
