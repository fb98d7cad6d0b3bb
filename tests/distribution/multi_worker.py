"""One worker of a 2-process `tf.distribute.MultiWorkerMirroredStrategy`.

Usage: python -m tests.distribution.multi_worker TASK_INDEX PORT0 PORT1 CASE
TF_CONFIG is built here for 127.0.0.1. The worker trains CASE under the
strategy, then on its own device, and prints both as JSON.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
_task, _ports, _case = int(sys.argv[1]), sys.argv[2:4], sys.argv[4]
os.environ["TF_CONFIG"] = json.dumps(
    {
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in _ports]},
        "task": {"type": "worker", "index": _task},
    }
)

# Imported after TF_CONFIG above: TensorFlow reads it at import.
import tensorflow as tf  # noqa: E402

# Created first: the strategy must exist before any other TF op runs.
strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.config.disable_traceback_filtering()  # the test reads the frames

from tests.distribution import cases  # noqa: E402


def main():
    weights = cases.initial_weights(_case)
    report = {"task": _task, "replicas": strategy.num_replicas_in_sync}
    try:
        run = cases.train(_case, weights, strategy.scope())
        report.update(losses=run["losses"], weights=[w.tolist() for w in run["weights"]])
    except Exception as error:  # reported: the test pins what breaks
        import traceback

        report["error"] = f"{type(error).__name__}: {error}"[:300]
        report["traceback"] = [
            f"{frame.filename}:{frame.lineno} {frame.name}"
            for frame in traceback.extract_tb(error.__traceback__)
        ]
    single = cases.train(_case, weights)
    report.update(
        single_losses=single["losses"],
        single_weights=[w.tolist() for w in single["weights"]],
        initial=[np.asarray(w).tolist() for w in weights],
    )
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
