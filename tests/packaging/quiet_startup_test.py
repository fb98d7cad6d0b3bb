"""Our entry points start without TensorFlow's log block; importing the library changes nothing."""

import os
import subprocess
import sys

import pytest

from keras_attention import _quiet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Lines as TensorFlow 2.21 (absl) and 2.18 (its own logging) print them.
NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796121063.149406    7406 port.cc:153] oneDNN custom operations are on.",
    "I0000 00:00:1796121063.149714    7406 cudart_stub.cc:31] Could not find cuda drivers",
    "E0000 00:00:1796121072.666931    7406 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
    "2026-12-01 10:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations",
    "2026-12-01 10:00:00.123456: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:477]"
    " Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow",
]
KEPT = [
    "E0000 00:00:1796121072.666931    7406 op_kernel.cc:1830] OP_REQUIRES failed: INVALID_ARGUMENT",
    "Traceback (most recent call last):",
    "UserWarning: something of ours",
    "hello",
]


def clean_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", _quiet.ENV_VARIABLE)
    }
    env["PYTHONPATH"] = ROOT
    env.setdefault("KERAS_BACKEND", "tensorflow")
    env.update(extra)
    return env


def tensorflow_log_lines(text):
    return [
        line
        for line in text.splitlines()
        if _quiet.is_startup_noise(line) or _quiet._LOG_LINE.match(line)
    ]


@pytest.mark.parametrize("line", NOISE)
def test_startup_block_lines_are_recognised(line):
    assert _quiet.is_startup_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_other_lines_are_kept(line):
    assert not _quiet.is_startup_noise(line)


def test_only_our_command_line_counts_as_asking():
    assert _quiet.requested({}, ["python", "-m", "keras_attention.export", "check", "p"])
    assert _quiet.requested({}, ["/venv/bin/python", "/venv/bin/keras-attention", "check"])
    assert _quiet.requested({_quiet.ENV_VARIABLE: "1"}, ["python", "train.py"])
    assert not _quiet.requested({_quiet.ENV_VARIABLE: "0"}, ["python", "train.py"])
    assert not _quiet.requested({}, ["python", "-m", "pytest"])
    assert not _quiet.requested({}, ["python", "-c", "import keras_attention"])


PROBE = (
    "import logging, os, sys\n"
    "import {module}\n"
    "import tensorflow as tf\n"
    "tf.constant(1.0) + 1.0\n"
    "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), logging.getLogger().level,"
    " len(logging.getLogger().handlers), tf.get_logger().level,"
    " logging.getLogger('absl').level)\n"
    "print('to stderr', file=sys.stderr)\n"
)


def run_probe(env, module="keras_attention"):
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def test_importing_the_library_changes_no_global_logging():
    baseline = run_probe(clean_env(), module="keras")
    plain = run_probe(clean_env())
    # TensorFlow sets TF_CPP_MIN_LOG_LEVEL=1 itself: the same with or without us.
    assert plain.stdout.split() == baseline.stdout.split(), (plain.stdout, baseline.stdout)
    # TensorFlow's own block still reaches the user who imports us.
    assert tensorflow_log_lines(plain.stderr), plain.stderr
    assert "to stderr" in plain.stderr


def test_the_environment_switch_hides_the_block_and_keeps_other_output():
    quiet = run_probe(clean_env(**{_quiet.ENV_VARIABLE: "1"}))
    assert tensorflow_log_lines(quiet.stdout + quiet.stderr) == [], quiet.stderr
    assert "to stderr" in quiet.stderr
    assert quiet.stdout.split()[0] == "3"  # later native log lines stay hidden too


def test_check_command_starts_quiet(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keras_attention.export", "check", str(tmp_path / "missing")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "is not a SavedModel" in result.stderr
    assert tensorflow_log_lines(result.stdout + result.stderr) == [], result.stderr


LATE = (
    "import warnings\n"
    "warnings.simplefilter('always')\n"
    "import keras\n"
    "import keras_attention\n"
    "print('imported')\n"
)


def test_the_switch_after_keras_warns_exactly_once():
    late = subprocess.run(
        [sys.executable, "-c", LATE],
        env=clean_env(**{_quiet.ENV_VARIABLE: "1"}),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert late.stderr.count(_quiet.LATE_WARNING) == 1, late.stderr
    assert "RuntimeWarning" in late.stderr and "imported" in late.stdout
    # Without the switch, or with TensorFlow's own level already at 3: no warning.
    for env in (clean_env(), clean_env(**{_quiet.ENV_VARIABLE: "1", "TF_CPP_MIN_LOG_LEVEL": "3"})):
        plain = subprocess.run(
            [sys.executable, "-c", LATE],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        assert _quiet.ENV_VARIABLE not in plain.stderr, plain.stderr
