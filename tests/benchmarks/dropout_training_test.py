"""The dropout training benchmark runs on both backends and reports both steps.

Only that it runs, on the blockwise kernel, with finite gradients: its
figures come from running the script itself (benchmarks/RESULTS.md), never
from tests.
"""

import os
import re
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "dropout_training.py")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_benchmark_times_the_step_with_and_without_dropout(backend):
    done = subprocess.run(
        [sys.executable, SCRIPT, "--length", "256", "--repeats", "1", "--blockwise"],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=os.path.abspath(ROOT)),
    )
    timing, memory = done.stdout.strip().splitlines()[-2:]
    assert "kernel blockwise" in timing and "finite gradients True" in timing, timing
    assert float(re.search(r"ratio ([0-9.]+)", timing).group(1)) > 0, timing
    assert re.match(r"peak RSS after the dropout step: \d+ MiB", memory), memory
