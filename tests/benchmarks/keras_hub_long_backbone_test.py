"""The long-backbone benchmark (#51 item 3) runs on both backends and reports.

Only that it runs and prints one row per call, ours and KerasHub's, finite:
its figures come from running the script (benchmarks/RESULTS.md), never from
tests.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_long_backbone_benchmark_reports_ours_and_theirs(backend):
    pytest.importorskip("keras_hub")
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "keras_hub_long_backbone.py"),
            *("--lengths", "64", "--their-lengths", "64", "--new-tokens", "4", "--window", "16"),
            *("--kinds", "ours,theirs,ours_decode,theirs_decode"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT),
    )
    rows = [json.loads(line) for line in done.stdout.strip().splitlines()]
    kinds = ["ours", "theirs", "ours_decode", "theirs_decode"]
    assert [(row["kind"], row["length"]) for row in rows] == [(k, 64) for k in kinds], rows
    assert all(row["finite"] and row["peak_rss_mib"] > 0 for row in rows[:2]), rows
    # The decode rows: a rate for the 4 new tokens after a 60-token prompt.
    assert all(row["decode_tokens_per_s"] > 0 and row["new_tokens"] == 4 for row in rows[2:]), rows
