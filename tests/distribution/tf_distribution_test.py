"""`tf.distribute` on the TensorFlow backend, each strategy in its own process.

`MirroredStrategy` over 2 logical CPUs: every layer group and both
translators' `fit` train to single-device weights.
`MultiWorkerMirroredStrategy` over 2 worker processes on 127.0.0.1 fails
inside Keras 3's `fit` (keras-team/keras#20585); the test pins that error.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.distribution import cases
from tests.distribution.subprocesses import ROOT
from tests.distribution.subprocesses import run_worker

pytestmark = pytest.mark.slow

# Dropout is left out of the equality check: under MirroredStrategy each
# replica applies Keras' dropout to its half of the batch (test below). The
# two model families are the translators' architectures as functional models
# (for the JAX layouts); here the translators themselves train under the
# strategy, with their masked loss and tf.data input, so the families'
# copies are left out (9 of the worker's 63 s of CPU).
GROUPS = sorted(set(cases.CASES) - {"dropout", "recurrent_family", "transformer_family"})
TRANSLATORS = ["seq2seq_translator", "transformer_translator"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results():
    return run_worker(
        "tests.distribution.tf_worker",
        GROUPS + TRANSLATORS + ["dropout_masks"],
        backend="tensorflow",
        timeout=600,
    )


def test_two_replicas(results):
    assert results["replicas"] == 2


@pytest.mark.parametrize("name", GROUPS + TRANSLATORS)
def test_mirrored_training_matches_one_device(results, name):
    run = results[name]
    assert set(run["replicas"]) == {2}, run["replicas"]  # mirrored variables
    assert run["weights_changed"] > 1e-3
    assert run["weight_difference"] < TOLERANCE, run["weight_difference"]
    assert run["loss_difference"] < TOLERANCE, (run["losses"], run["single_losses"])


@pytest.mark.parametrize("variable", ["random_plan", "projection"])
def test_random_state_is_identical_across_replicas(results, variable):
    report = results["multi_head_layers"]["random_state"][variable]
    assert report["copies"] == 2
    assert report["copies_differ"] == 0.0
    assert report["built_vs_single"] == 0.0
    assert report["trained_vs_single"] == 0.0


def test_replicas_draw_the_same_dropout_masks(results):
    # Keras' SeedGenerator state is a mirrored variable: every replica draws
    # the same mask stream (documented in docs/guides/distribution.md). Pinned so a change in
    # Keras shows up here.
    report = results["dropout_masks"]
    assert report["dropout_acted"] > 1e-3
    assert report["replicas_differ"] == 0.0


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_multi_worker_mirrored_strategy_is_broken_in_keras_fit():
    ports = [_free_port(), _free_port()]
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=str(ROOT))
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.distribution.multi_worker",
                str(task),
                *ports,
                "score_layers",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for task in range(2)
    ]
    reports = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=240)
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            assert worker.returncode == 0 and lines, err[-4000:]
            reports.append(json.loads(lines[-1][len("RESULT ") :]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for task, report in enumerate(reports):
        assert report["task"] == task and report["replicas"] == 2
        # The cluster formed (2 replicas) and single-device training works;
        # fit under the strategy fails where Keras builds the model from a
        # distributed batch (keras-team/keras#20585). If this assertion
        # fails, Keras fixed it: update the strategy list in docs/guides/distribution.md.
        assert "error" in report, "MultiWorkerMirroredStrategy works now"
        assert report["error"].startswith("ValueError: Attempt to convert a value (PerReplica"), (
            report["error"]
        )
        assert any("_maybe_symbolic_build" in frame for frame in report["traceback"])
        assert report["single_losses"][-1] < report["single_losses"][0]
