"""examples/distributed_training.py runs on split CPUs with both engines."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "distributed_training.py")

pytestmark = pytest.mark.slow


def run(*args):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    env.pop("KERAS_BACKEND", None)  # the example picks it
    completed = subprocess.run(
        [sys.executable, EXAMPLE, *args], capture_output=True, text=True, env=env, timeout=400
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout


def losses(out, label):
    match = re.search(rf"{label}.*?loss ([\d.]+) -> ([\d.]+)", out)
    assert match, out
    return float(match.group(1)), float(match.group(2))


def test_jax_data_model_and_sequence_parallel():
    out = run("--engine", "jax", "--cpu-devices", "4", "--steps", "8")
    assert "devices: 4 x cpu" in out
    for label in (
        "DataParallel over 4",
        "ModelParallel on a \\(2, 2\\)",
        "Sequence parallel over 4",
    ):
        first, last = losses(out, label)
        assert last < first, (label, out)
    assert "query kernel (32, 4, 8), per device (32, 2, 8)" in out
    assert "kernel 'ring'" in out


def test_tensorflow_mirrored_strategy():
    out = run("--engine", "tensorflow", "--cpu-devices", "2", "--steps", "8")
    assert "MirroredStrategy: 2 replicas" in out
    first, last = losses(out, "TransformerTranslator under MirroredStrategy")
    assert last < first
    assert "translate('four two seven') ->" in out
