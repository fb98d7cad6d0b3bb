"""Runs in a fresh process with 4 forced host devices (see jax_distribution_test).

Usage: python -m tests.distribution.jax_worker CASE [CASE ...]
Prints one JSON object: per case and distribution, the largest weight and
loss differences from single-device training and each variable's sharding.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

# Imported after the environment above: Keras and JAX read it at import.
import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_attention as ka  # noqa: E402
from tests.distribution import cases  # noqa: E402


def _padded(axes, rank):
    axes = tuple(axes) if axes is not None else ()
    return list(axes) + [None] * (rank - len(axes))


def shardings(model, differences, layout_map=None):
    """Each variable: path, shape, sharding spec, layout, shard shape, and
    its largest difference from single-device training."""
    rows = []
    for variable, difference in zip(model.weights, differences, strict=True):
        value = variable.value
        rank = len(variable.shape)
        promised = None if layout_map is None else layout_map[variable.path]
        rows.append(
            {
                "path": variable.path,
                "shape": list(variable.shape),
                "spec": _padded(value.sharding.spec, rank),
                "promised": _padded(None if promised is None else promised.axes, rank),
                "shard_shape": list(value.addressable_shards[0].data.shape),
                "devices": len(value.sharding.device_set),
                "difference": difference,
            }
        )
    return rows


def run(names):
    devices = keras.distribution.list_devices()
    assert len(devices) == 4, devices
    data_parallel = keras.distribution.DataParallel(devices=devices[:2])
    mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), devices)
    layout_map = ka.distribution.get_layout_map(mesh)
    model_parallel = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    results = {"devices": [str(d) for d in jax.devices()]}
    for name in names:
        weights = cases.initial_weights(name)
        # The inference loss, for the dropout test (dropout and its control).
        single = cases.train(name, weights, evaluate=name in ("dropout", "blocks"))
        results[name] = {}
        for label, distribution, layouts in (
            ("data_parallel", data_parallel, None),
            ("model_parallel", model_parallel, layout_map),
        ):
            run = cases.train(name, weights, distribution.scope())
            results[name][label] = {
                "initial_loss": single.get("initial_loss"),
                "single_losses": single["losses"],
                "losses": run["losses"],
                "loss_difference": float(
                    np.max(np.abs(np.subtract(single["losses"], run["losses"])))
                ),
                "weights_changed": cases.max_difference(weights, run["weights"]),
                "variables": shardings(
                    run["model"], cases.differences(single["weights"], run["weights"]), layouts
                ),
                "random_state": cases.random_state_report(single, run),
            }
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(sys.argv[1:])))
