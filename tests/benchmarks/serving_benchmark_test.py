"""The serving benchmark runs: both translators, both decodings, a full table.

Only that it runs and pairs served with `translate()` rows: throughput is
measured by running the script itself (benchmarks/RESULTS.md), never in tests.
"""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "serving_benchmark.py")


@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.tf_only
def test_benchmark_reports_served_and_translate_for_each_mode():
    result = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--repeats", "2"],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KERAS_BACKEND="tensorflow"),
    )
    rows = [
        line.split("|")[1:-1]
        for line in result.stdout.splitlines()
        if line.startswith("| ") and "Translator" in line
    ]
    assert [(r[0].split()[0], r[1].strip()) for r in rows] == [
        ("Seq2SeqTranslator", "greedy"),
        ("Seq2SeqTranslator", "beam 4"),
        ("TransformerTranslator", "greedy"),
        ("TransformerTranslator", "beam 4"),
    ]
    for row in rows:
        served, translated, ratio = float(row[3]), float(row[6]), float(row[8])
        assert served > 0 and translated > 0 and ratio > 0
