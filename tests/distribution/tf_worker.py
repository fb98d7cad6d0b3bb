"""Runs in a fresh process: `tf.distribute.MirroredStrategy` on 2 logical CPUs.

Usage: python -m tests.distribution.tf_worker CASE [CASE ...]
(one strategy per process: a second MirroredStrategy breaks TF's collectives).
Prints one JSON object: per case, the largest weight and loss differences
between single-device training and training under the strategy.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

# Imported after the environment above: Keras reads it at import.
import tensorflow as tf  # noqa: E402

(_cpu,) = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tests.distribution import cases  # noqa: E402
from tests.translator_fixtures import WORDS  # noqa: E402

TRANSLATORS = {
    "seq2seq_translator": dict(embedding_dim=8, units=16, attention="additive", seed=1),
    "transformer_translator": dict(
        num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, seed=1
    ),
}


def _make_translator(name):
    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.models import TransformerTranslator

    cls = Seq2SeqTranslator if name == "seq2seq_translator" else TransformerTranslator
    # Every text has 3 tokens: each replica holds as many real (non-padding)
    # target tokens, so the per-replica mean loss Keras averages equals the
    # single-device mean (see docs/guides/distribution.md on masked losses).
    rng = np.random.default_rng(4)
    digits = rng.integers(0, 10, (32, 3))
    sources = [" ".join(WORDS[d] for d in row) for row in digits]
    targets = [" ".join(str(d) for d in row) for row in digits]
    translator = cls.from_texts(
        sources,
        targets,
        source_split="whitespace",
        target_split="whitespace",
        max_source_length=6,
        max_target_length=7,
        **TRANSLATORS[name],
    )
    return translator, sources, targets


def train_translator(name, weights=None, scope=None):
    import contextlib

    with scope or contextlib.nullcontext():
        keras.utils.set_random_seed(0)
        translator, sources, targets = _make_translator(name)
        dataset = translator.make_dataset(sources, targets, batch_size=16, shuffle=False)
        translator(next(iter(dataset))[0])  # build
        if weights is not None:
            translator.set_weights(weights)
        translator.compile(optimizer=keras.optimizers.SGD(0.5))
        initial = translator.get_weights()
        history = translator.fit(dataset, epochs=2, verbose=0)
    return {
        "model": translator,
        "initial": initial,
        "weights": translator.get_weights(),
        "losses": history.history["loss"],
    }


def compare(single, run, initial):
    report = {
        "loss_difference": float(np.max(np.abs(np.subtract(single["losses"], run["losses"])))),
        "losses": run["losses"],
        "single_losses": single["losses"],
        "weight_difference": cases.max_difference(single["weights"], run["weights"]),
        "weights_changed": cases.max_difference(initial, run["weights"]),
        "replicas": [len(getattr(v.value, "values", [v.value])) for v in run["model"].weights],
    }
    if "random_built" in run:
        report["random_state"] = cases.random_state_report(single, run)
    return report


def dropout_masks(strategy):
    """Our attention dropout on identical inputs on each replica: outputs per
    replica in training mode, and the inference output."""
    import keras_attention as ka

    with strategy.scope():
        layer = ka.MultiHeadAttention(2, 4, dropout=0.5, seed=3)
        x = np.ones((1, 4, 8), "float32") * np.arange(8, dtype="float32")
        layer(x, x)

    @tf.function
    def step():
        def replica_fn():
            inputs = tf.constant(x) + tf.range(4, dtype="float32")[None, :, None]
            return layer(inputs, inputs, training=True)

        return strategy.run(replica_fn)

    per_replica = [v.numpy() for v in step().values]
    inputs = x + np.arange(4, dtype="float32")[None, :, None]
    inference = np.asarray(layer(inputs, inputs, training=False))
    return {
        "replicas_differ": float(np.max(np.abs(per_replica[0] - per_replica[1]))),
        "dropout_acted": float(np.max(np.abs(per_replica[0] - inference))),
    }


def run(names):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    results = {"replicas": strategy.num_replicas_in_sync}
    for name in names:
        if name == "dropout_masks":
            results[name] = dropout_masks(strategy)
            continue
        if name in TRANSLATORS:
            single = train_translator(name)
            mirrored = train_translator(name, single["initial"], strategy.scope())
            results[name] = compare(single, mirrored, single["initial"])
            continue
        weights = cases.initial_weights(name)
        single = cases.train(name, weights)
        mirrored = cases.train(name, weights, strategy.scope())
        results[name] = compare(single, mirrored, weights)
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(sys.argv[1:])))
