"""KerasHub's attention classes on Keras' MHA or on ours (one per process).

    python keras_hub_worker.py keras OUT.npz          # as KerasHub ships
    python keras_hub_worker.py ours OUT.npz WEIGHTS   # ours substituted

In `ours` mode `keras.layers.MultiHeadAttention` is replaced by
`keras_attention.MultiHeadAttention` before `keras_hub` is imported, so
KerasHub's `CachedMultiHeadAttention` (and Whisper's and XLNet's attention,
which subclass Keras' layer or it) are built on ours. Each case builds the
same KerasHub object from the same seed; `ours` loads the weights `keras`
saved (so the weight lists must line up one for one) and both write their
outputs for the test to compare.
"""

import os
import sys

import numpy as np

MODE, OUT = sys.argv[1], sys.argv[2]
WEIGHTS = sys.argv[3] if len(sys.argv) > 3 else None

# Imported after the arguments are read: MODE decides what is imported below.
import keras  # noqa: E402

if MODE == "ours":
    import keras_attention  # noqa: E402

    keras.layers.MultiHeadAttention = keras_attention.MultiHeadAttention
import keras_hub  # noqa: E402
from keras import ops  # noqa: E402

if MODE == "ours":
    assert issubclass(keras_hub.layers.CachedMultiHeadAttention, keras_attention.MultiHeadAttention)

rng = np.random.default_rng(0)
x = rng.normal(size=(2, 5, 8)).astype("float32")
memory = rng.normal(size=(2, 4, 8)).astype("float32")
padding = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
causal = np.tril(np.ones((5, 5), "float32"))
features = rng.normal(size=(2, 6, 80)).astype("float32")  # Whisper's input
weight_rng = np.random.default_rng(1)  # only the `keras` process draws from it
saved = dict(np.load(WEIGHTS, allow_pickle=True)) if WEIGHTS else {}
results, weights = {}, {}


def randomise(name, layer):
    """Random weights and biases (the same in both processes)."""
    if WEIGHTS:
        count = int(saved[f"{name}/count"])
        layer.set_weights([saved[f"{name}/{i}"] for i in range(count)])
        return
    values = [
        weight_rng.normal(scale=0.4, size=w.shape).astype(w.dtype) for w in layer.get_weights()
    ]
    layer.set_weights(values)
    weights[f"{name}/count"] = np.array(len(values))
    for i, value in enumerate(values):
        weights[f"{name}/{i}"] = value


def out(name, value):
    results[name] = np.asarray(ops.convert_to_numpy(value), "float64")


# CachedMultiHeadAttention: a call, a causal call, the scores, a decoding loop.
cached = keras_hub.layers.CachedMultiHeadAttention(num_heads=2, key_dim=4)
cached(x, x)
randomise("cached", cached)
out("cached/call", cached(x, memory))
output, scores = cached(x, x, attention_mask=causal, return_attention_scores=True)
out("cached/causal", output)
out("cached/scores", scores)
cache = ops.zeros((2, 2, 5, 2, 4))
steps = []
for t in range(5):
    step, cache = cached(
        x[:, t : t + 1],
        x[:, t : t + 1],
        cache=cache,
        cache_update_index=t,
        attention_mask=causal[t : t + 1],
    )
    steps.append(step)
out("cached/steps", ops.concatenate(steps, axis=1))
out("cached/cache", cache)
cross_cache = ops.stack([cached._key_dense(memory), cached._value_dense(memory)], axis=1)
out("cached/cross", cached(x, memory, cache=cross_cache)[0])

# TransformerEncoder / TransformerDecoder (self, cross and cached attention).
encoder = keras_hub.layers.TransformerEncoder(intermediate_dim=16, num_heads=2)
encoder(x, padding_mask=padding)
if MODE == "ours":  # built from `keras.layers.MultiHeadAttention`: ours
    assert type(encoder._self_attention_layer) is keras_attention.MultiHeadAttention
randomise("encoder", encoder)
out("encoder", encoder(x, padding_mask=padding))
decoder = keras_hub.layers.TransformerDecoder(intermediate_dim=16, num_heads=2)
decoder(x, memory, decoder_padding_mask=padding)
randomise("decoder", decoder)
out("decoder", decoder(x, memory, decoder_padding_mask=padding))
self_cache = ops.zeros((2, 2, 5, 2, 4))
cross = ops.stack(
    [
        decoder._cross_attention_layer._key_dense(memory),
        decoder._cross_attention_layer._value_dense(memory),
    ],
    axis=1,
)
decoded = []
for t in range(5):
    step, self_cache, _ = decoder(
        x[:, t : t + 1],
        memory,
        self_attention_cache=self_cache,
        self_attention_cache_update_index=t,
        cross_attention_cache=cross,
        cross_attention_cache_update_index=None,
    )
    decoded.append(step)
out("decoder/steps", ops.concatenate(decoded, axis=1))

# Models whose attention subclasses Keras' MHA: Whisper (its own `build`,
# `_build_attention`, `_get_common_kwargs_for_sublayer`) and XLNet (its own
# `call` and the protected shapes and equations).
whisper = keras_hub.models.WhisperBackbone(
    vocabulary_size=10,
    num_layers=1,
    num_heads=2,
    hidden_dim=8,
    intermediate_dim=16,
    max_encoder_sequence_length=6,
    max_decoder_sequence_length=6,
)
whisper_inputs = {
    "encoder_features": features,
    "decoder_token_ids": np.array([[1, 2, 3, 4, 5, 6]] * 2),
    "decoder_padding_mask": np.ones((2, 6), bool),
}
whisper(whisper_inputs)
randomise("whisper", whisper)
for name, value in whisper(whisper_inputs).items():
    out(f"whisper/{name}", value)
xlnet = keras_hub.models.XLNetBackbone(
    vocabulary_size=10, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16
)
xlnet_inputs = {
    "token_ids": np.array([[1, 2, 3, 4, 5]] * 2),
    "padding_mask": np.ones((2, 5), bool),
    "segment_ids": np.zeros((2, 5), "int32"),
}
xlnet(xlnet_inputs)
randomise("xlnet", xlnet)
out("xlnet", xlnet(xlnet_inputs))

np.savez(OUT, **results)
if not WEIGHTS:
    np.savez(os.path.splitext(OUT)[0] + "_weights.npz", **weights)
print("cases:", len(results))
