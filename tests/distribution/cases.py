"""Models of one layer each, and the single- vs multi-device training check.

Shared by the JAX (`keras.distribution`) and TensorFlow (`tf.distribute`)
workers, which run in their own processes (multi-device CPUs must be set up
before the backend starts). Every model starts from the same weights (built
once on one device, then copied), trains a few full-batch `fit` steps with
SGD, and reports its weights and per-step losses; the tests compare the
distributed run with the single-device one.
"""

import keras
import numpy as np

import keras_attention as ka

BATCH, LENGTH, FEATURES, HEADS = 8, 8, 16, 4
VOCAB, SOURCE_LENGTH, TARGET_LENGTH = 20, 8, 6
STEPS = 3


def _multi_head(cls, name, **kwargs):
    return lambda x: cls(num_heads=HEADS, key_dim=4, name=name, **kwargs)(x, x)


# Every attention layer and block, named after its case; one model per group
# (one compilation trains them all; each branch gets its own output head).
LAYERS = {
    "score_layers": {
        "additive": lambda x: ka.AdditiveAttention(name="additive")(x, x),
        "luong": lambda x: ka.LuongAttention(score="general", name="luong")(x, x),
        "low_rank": lambda x: ka.LowRankAttention(rank=4, name="low_rank")(x, x),
        "attention_pooling": lambda x: ka.AttentionPooling(name="attention_pooling")(x)[:, None, :],
    },
    "multi_head_layers": {
        "multi_head": _multi_head(ka.MultiHeadAttention, "multi_head", memory_efficient=False),
        "multi_head_memory_efficient": _multi_head(
            ka.MultiHeadAttention,
            "multi_head_memory_efficient",
            memory_efficient=True,
            block_size=4,
        ),
        "sparse": _multi_head(
            ka.SparseAttention,
            "sparse",
            block_size=2,
            window_blocks=1,
            global_blocks=1,
            random_blocks=1,
            seed=3,
        ),
        "performer": _multi_head(ka.PerformerAttention, "performer", num_features=8, seed=3),
        "linformer": _multi_head(
            ka.LinformerAttention, "linformer", projected_length=4, max_length=LENGTH
        ),
    },
    "blocks": {
        "encoder_block": lambda x: ka.TransformerEncoderBlock(HEADS, 4, 32, name="encoder_block")(
            x
        ),
        "decoder_block": lambda x: ka.TransformerDecoderBlock(HEADS, 4, 32, name="decoder_block")(
            x, x, use_causal_mask=True
        ),
    },
    # Dropout on: replicas must draw the masks single-device training draws.
    "dropout": {
        "multi_head_dropout": _multi_head(
            ka.MultiHeadAttention, "multi_head_dropout", dropout=0.3, seed=5
        ),
        "encoder_block_dropout": lambda x: ka.TransformerEncoderBlock(
            HEADS, 4, 32, dropout=0.3, seed=5, name="encoder_block_dropout"
        )(x),
    },
}


def _branches(group):
    def make():
        inputs = keras.Input((LENGTH, FEATURES))
        outputs = [
            keras.layers.Dense(4, name=f"{name}_head")(branch(inputs))
            for name, branch in LAYERS[group].items()
        ]
        # A pooled branch (B, 1, 4) broadcasts over time.
        total = outputs[0]
        for output in outputs[1:]:
            total = total + output
        return keras.Model(inputs, total)

    return make, "regression"


def _recurrent_family():
    # The Seq2SeqTranslator's architecture (embeddings, GRU encoder/decoder,
    # additive attention, vocabulary logits) as a functional model.
    source = keras.Input((SOURCE_LENGTH,), dtype="int32")
    target = keras.Input((TARGET_LENGTH,), dtype="int32")
    encoded = keras.layers.GRU(FEATURES, return_sequences=True, name="encoder")(
        keras.layers.Embedding(VOCAB, FEATURES, name="source_embedding")(source)
    )
    decoded = keras.layers.GRU(FEATURES, return_sequences=True, name="decoder")(
        keras.layers.Embedding(VOCAB, FEATURES, name="target_embedding")(target)
    )
    context = ka.AdditiveAttention(name="attention")(decoded, encoded)
    joined = keras.layers.Concatenate()([decoded, context])
    logits = keras.layers.Dense(VOCAB, name="logits")(joined)
    return keras.Model([source, target], logits)


def _transformer_family():
    # The TransformerTranslator's architecture as a functional model.
    source = keras.Input((SOURCE_LENGTH,), dtype="int32")
    target = keras.Input((TARGET_LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, FEATURES, name="source_embedding")(source)
    x = ka.PositionEmbedding(SOURCE_LENGTH, name="source_position")(x) + x
    encoded = ka.TransformerEncoderBlock(HEADS, 4, 32, name="encoder_block")(x)
    y = keras.layers.Embedding(VOCAB, FEATURES, name="target_embedding")(target)
    y = ka.TransformerDecoderBlock(HEADS, 4, 32, name="decoder_block")(
        y, encoded, use_causal_mask=True
    )
    logits = keras.layers.Dense(VOCAB, name="logits")(y)
    return keras.Model([source, target], logits)


CASES = {
    **{group: _branches(group) for group in LAYERS},
    "recurrent_family": (_recurrent_family, "tokens"),
    "transformer_family": (_transformer_family, "tokens"),
}

# What the layout shards: these layers' models must end up with sharded
# variables under ModelParallel.
SHARDED = {
    "multi_head",
    "multi_head_memory_efficient",
    "sparse",
    "performer",
    "linformer",
    "encoder_block",
    "decoder_block",
    "multi_head_dropout",
    "encoder_block_dropout",
    "transformer_family",
}


def data(kind, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "tokens":
        inputs = [
            rng.integers(0, VOCAB, (BATCH, SOURCE_LENGTH)).astype("int32"),
            rng.integers(0, VOCAB, (BATCH, TARGET_LENGTH)).astype("int32"),
        ]
        targets = rng.integers(0, VOCAB, (BATCH, TARGET_LENGTH)).astype("int32")
        return inputs, targets
    inputs = rng.normal(size=(BATCH, LENGTH, FEATURES)).astype("float32")
    return inputs, rng.normal(size=(BATCH, LENGTH, 4)).astype("float32")


def compile_model(model, kind):
    loss = (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True) if kind == "tokens" else "mse"
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)


def initial_weights(name):
    keras.utils.set_random_seed(0)
    make, _ = CASES[name]
    return make().get_weights()


def _random_copies(model):
    """Every device's copy of each stored random variable (plans, features)."""
    copies = {}
    for variable in model.weights:
        if variable.path.split("/")[-1] in ("random_plan", "projection"):
            value = variable.value
            shards = getattr(value, "addressable_shards", None)  # JAX arrays
            if shards is None:  # TF: a mirrored variable's per-device values
                values = getattr(variable.value, "values", None)
                shards = values if values is not None else [value]
            else:
                shards = [shard.data for shard in shards]
            copies[variable.path.split("/")[-1]] = [np.asarray(s) for s in shards]
    return copies


def train(name, weights, scope=None, evaluate=False):
    """Trains `STEPS` full-batch steps, redrawing Performer features each step.

    Returns a dict: `model`, `weights` (trained), `losses` (per step),
    `initial_loss` (inference mode, no dropout; only with `evaluate=True`),
    `random_built` and `random_trained` (each device's copy of the random
    variables right after `build` and after training).
    """
    import contextlib

    make, kind = CASES[name]
    run = {}
    with scope or contextlib.nullcontext():
        keras.utils.set_random_seed(0)
        model = make()
        run["random_built"] = _random_copies(model)
        model.set_weights(weights)
        compile_model(model, kind)
        inputs, targets = data(kind)
        if evaluate:
            run["initial_loss"] = model.evaluate(inputs, targets, batch_size=BATCH, verbose=0)
        history = model.fit(
            inputs,
            targets,
            batch_size=BATCH,
            epochs=STEPS,
            shuffle=False,
            verbose=0,
            callbacks=[ka.RedrawFeatures(every_n_steps=1)],
        )
        run["random_trained"] = _random_copies(model)
    run.update(model=model, weights=model.get_weights(), losses=history.history["loss"])
    return run


def random_state_report(single, replicas):
    """Per random variable: how far device copies differ from each other and
    from single-device training, and how far training (redraws) moved it."""
    report = {}
    for key, built in replicas["random_built"].items():
        trained = replicas["random_trained"][key]
        report[key] = {
            "copies": len(built),
            "copies_differ": max(
                float(np.max(np.abs(copy - copies[0])))
                for copies in (built, trained)
                for copy in copies
            ),
            "built_vs_single": float(np.max(np.abs(built[0] - single["random_built"][key][0]))),
            "trained_vs_single": float(
                np.max(np.abs(trained[0] - single["random_trained"][key][0]))
            ),
            "moved": float(np.max(np.abs(trained[0] - built[0]))),
        }
    return report


def differences(weights_a, weights_b):
    return [
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(weights_a, weights_b, strict=True)
    ]


def max_difference(weights_a, weights_b):
    return max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(weights_a, weights_b, strict=True)
    )
