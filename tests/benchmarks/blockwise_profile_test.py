"""The blockwise kernel's profile runs and prints a row per variant.

Only that it runs: the figures come from running the script itself
(benchmarks/RESULTS.md), never from tests.
"""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "blockwise_profile.py")


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.tf_only
def test_profile_reports_every_variant_against_the_ceiling():
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--lengths",
            "256",
            "--block-sizes",
            "64,128",
            "--repeats",
            "1",
            "--matmuls-only",
            "--exp-floor",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
    )
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("   256")]
    what = sorted(" ".join(row[2:-2]) for row in rows)
    assert what == sorted(
        ["forward", "forward+backward"] * 2 + ["matmuls only", "matmuls + exp"]
    ), rows
    assert all(float(row[-1].rstrip("%")) > 0 for row in rows), rows
