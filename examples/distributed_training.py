"""Train attention models on several devices with the engines' own strategies.

JAX (`--engine jax`, `keras.distribution`):
  1. DataParallel: the batch split over the devices, weights replicated;
  2. ModelParallel over a (batch, model) mesh with
     `keras_attention.distribution.get_layout_map`: attention heads and the
     Transformer feed-forward split over the "model" axis;
  3. sequence parallelism: `MultiHeadAttention(sequence_parallel="sequence")`
     over a (batch, sequence) mesh, exact attention computed ring-style.
TensorFlow (`--engine tensorflow`, `tf.distribute.MirroredStrategy`):
  a TransformerTranslator trained with `fit` under the strategy.

On a machine without accelerators, `--cpu-devices N` (default 4) splits the
CPU into N devices (JAX: forced host devices; TensorFlow: logical devices),
so the same code runs on a laptop; on GPUs/TPUs pass `--cpu-devices 0` and
the strategies use the accelerators. The engine must be chosen before
Keras is imported, so this script sets KERAS_BACKEND itself.

Run: `python examples/distributed_training.py --engine jax` (or tensorflow).
"""

import argparse
import os
import sys


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["jax", "tensorflow"], default="jax")
    parser.add_argument("--cpu-devices", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    return parser.parse_args(argv)


def setup(args):
    """Picks the backend and splits the CPU, before Keras starts."""
    os.environ["KERAS_BACKEND"] = args.engine
    if args.engine == "jax" and args.cpu_devices:
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.cpu_devices}"
    if args.engine == "tensorflow" and args.cpu_devices:
        import tensorflow as tf

        (cpu,) = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_devices
        )


def encoder_model(sequence_length, sequence_parallel=None):
    """Token ids -> one Transformer encoder block -> per-token logits."""
    import keras

    import keras_attention as ka

    inputs = keras.Input((sequence_length,), dtype="int32")
    x = keras.layers.Embedding(32, 32)(inputs)
    x = x + ka.PositionEmbedding(sequence_length)(x)
    attention = ka.MultiHeadAttention(
        4, 8, sequence_parallel=sequence_parallel, name="self_attention"
    )
    x = ka.TransformerEncoderBlock(4, 8, 64, attention=attention, name="encoder")(x)
    return keras.Model(inputs, keras.layers.Dense(32)(x))


def copy_task(samples, length, seed=0):
    """Predict, at each position, the token one step back (a causal lookup)."""
    import numpy as np

    tokens = np.random.default_rng(seed).integers(1, 32, (samples, length))
    return tokens.astype("int32"), np.roll(tokens, 1, axis=1).astype("int32")


def fit(model, args, length=16):
    import keras

    x, y = copy_task(64, length)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(x, y, batch_size=16, epochs=max(1, args.steps // 4), verbose=0)
    return history.history["loss"]


def run_jax(args):
    import keras

    import keras_attention as ka

    devices = keras.distribution.list_devices()
    print(f"devices: {len(devices)} x {devices[0].split(':')[0]}")
    if len(devices) < 4 or len(devices) % 2:
        raise SystemExit("needs an even number (>= 4) of devices: --cpu-devices 4")
    half = len(devices) // 2

    data_parallel = keras.distribution.DataParallel(devices=devices)
    with data_parallel.scope():
        losses = fit(encoder_model(16), args)
    print(f"DataParallel over {len(devices)} devices: loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    mesh = keras.distribution.DeviceMesh((half, 2), ("batch", "model"), devices)
    model_parallel = keras.distribution.ModelParallel(
        layout_map=ka.distribution.get_layout_map(mesh), batch_dim_name="batch"
    )
    with model_parallel.scope():
        model = encoder_model(16)
        losses = fit(model, args)
    query = next(v for v in model.weights if v.path.endswith("query/kernel"))
    shard = query.value.addressable_shards[0].data.shape
    print(
        f"ModelParallel on a ({half}, 2) mesh: loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}; query kernel {tuple(query.shape)}, "
        f"per device {tuple(shard)}"
    )

    mesh = keras.distribution.DeviceMesh((1, len(devices)), ("batch", "sequence"), devices)
    sequence_parallel = keras.distribution.ModelParallel(
        layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="batch"
    )
    length = 16 * len(devices)
    with sequence_parallel.scope():
        model = encoder_model(length, sequence_parallel="sequence")
        losses = fit(model, args, length=length)
    kernel = model.get_layer("encoder").self_attention.kernel_for((16, length, 32)).value
    print(
        f"Sequence parallel over {len(devices)} devices (L={length}, kernel "
        f"{kernel!r}): loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )


def run_tensorflow(args):
    import keras
    import tensorflow as tf

    from keras_attention.models import TransformerTranslator

    strategy = tf.distribute.MirroredStrategy()
    print(f"MirroredStrategy: {strategy.num_replicas_in_sync} replicas")
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    import numpy as np

    digits = np.random.default_rng(0).integers(0, 10, (256, 3))
    sources = [" ".join(words[d] for d in row) for row in digits]
    targets = [" ".join(str(d) for d in row) for row in digits]
    with strategy.scope():
        translator = TransformerTranslator.from_texts(
            sources,
            targets,
            source_split="whitespace",
            target_split="whitespace",
            max_source_length=4,
            max_target_length=4,
            num_layers=1,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=64,
            seed=0,
        )
        translator.compile(optimizer=keras.optimizers.Adam(1e-2))
        dataset = translator.make_dataset(sources, targets, batch_size=32, seed=0)
        history = translator.fit(dataset, epochs=max(1, args.steps // 4), verbose=0)
    losses = history.history["loss"]
    print(f"TransformerTranslator under MirroredStrategy: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print("translate('four two seven') ->", translator.translate(["four two seven"])[0].text)


def main(argv=None):
    args = parse(argv)
    setup(args)
    (run_jax if args.engine == "jax" else run_tensorflow)(args)


if __name__ == "__main__":
    main(sys.argv[1:])
