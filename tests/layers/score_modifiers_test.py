"""`MultiHeadAttention`'s score modifiers (#36): soft cap, ALiBi, learned
sinks and a `score_mod`, on every kernel the layer runs, against float64 NumPy.

The combinations test draws them with every other option (cache, selected
weights, masks, dtypes, modes); the kernels' gradients are in
`tests/ops/kernel_contract_test.py`. Here: Gemma 2's configuration at 512
tokens on each kernel, the layer contract (config, `.keras`, XLA fit, mixed
precision) with every modifier, `safe_mode`, and bad arguments.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_attention import MultiHeadAttention
from keras_attention.layers.machinery.kernel_selector import Kernel
from tests.attention_reference import positional
from tests.attention_reference import score_mod
from tests.kernel_spy import spy_kernels
from tests.testing import run_layer_contract_test
from tests.testing import to_numpy

BACKEND = keras.backend.backend()
# Gemma 2's local layers: soft cap 50 and a sliding window (4096 there,
# 128 here at 512 tokens), causal, grouped heads.
GEMMA2 = dict(num_heads=8, key_dim=16, num_key_value_heads=4, logit_soft_cap=50.0)
WINDOW = 128


def _gemma2_kernels():
    kernels = [
        ("dense", dict(memory_efficient=False), Kernel.DENSE, None),
        ("blockwise", dict(memory_efficient=True, block_size=128), Kernel.BLOCKWISE, None),
    ]
    if BACKEND == "tensorflow":
        kernels.append(("shifted", dict(memory_efficient=False), Kernel.SHIFTED, "xla"))
    return kernels


@pytest.mark.parametrize("local", [True, False], ids=["local", "global"])
@pytest.mark.parametrize(
    "label, options, kernel, mode", _gemma2_kernels(), ids=[k[0] for k in _gemma2_kernels()]
)
def test_gemma2_attention_at_512_tokens_matches_float64_numpy(
    monkeypatch, label, options, kernel, mode, local
):
    rng = np.random.default_rng(0)
    length, features = 512, 32
    window = WINDOW if local else None
    layer = MultiHeadAttention(**GEMMA2, sliding_window=window, **options)
    x = rng.normal(size=(1, length, features)).astype("float32")
    layer.build(x.shape, x.shape)
    # Large enough weights that many logits pass the cap's knee.
    layer.set_weights([rng.normal(scale=1.2, size=w.shape) for w in layer.get_weights()])
    weights = {w.path.split("/", 1)[1]: to_numpy(w.value) for w in layer.weights}
    allowed = positional(np.arange(length), np.arange(length), True, window)
    ran = spy_kernels(monkeypatch)

    def call(x):
        return layer(x, use_causal_mask=True, return_attention_scores=label == "dense")

    if mode == "xla":
        import tensorflow as tf

        call = tf.function(call, jit_compile=True)
    result = call(keras.ops.convert_to_tensor(x))
    output = to_numpy(result[0] if label == "dense" else result)
    assert ran == [kernel]
    expected = _gemma2_reference(weights, x, allowed, cap=50.0)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(output, expected, atol=1e-5 * scale, rtol=0)
    # The cap changes the result here (a no-op cap would pass otherwise).
    uncapped = _gemma2_reference(weights, x, allowed, cap=None)
    assert np.abs(uncapped - expected).max() > 1e-2 * scale


def _gemma2_reference(weights, x, allowed, cap):
    """Gemma 2's attention from its definition, float64."""
    w = weights
    x = x.astype("float64")
    q = np.einsum("btf,fhd->bthd", x, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("btf,fhd->bthd", x, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("btf,fhd->bthd", x, w["value/kernel"]) + w["value/bias"]
    k, v = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
    if cap is not None:
        logits = cap * np.tanh(logits / cap)
    logits = np.where(allowed, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", probs, v)
    output = np.einsum("bqhd,hdo->bqo", context, w["attention_output/kernel"])
    return output + w["attention_output/bias"]


def every_modifier(**kwargs):
    return MultiHeadAttention(
        num_heads=4,
        key_dim=4,
        num_key_value_heads=2,
        logit_soft_cap=5.0,
        alibi=[0.5, 0.25, 0.125, 0.0625],
        attention_sinks=True,
        score_mod=score_mod,
        **kwargs,
    )


def test_layer_contract_with_every_modifier(tmp_path):
    run_layer_contract_test(every_modifier, tmp_path, expected_cross_output_shape=(2, 5, 8))


def test_config_and_keras_file_keep_every_modifier(tmp_path):
    layer = every_modifier()
    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    inputs = keras.Input((6, 8))
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    layer.set_weights([w + 0.3 for w in layer.get_weights()])  # sinks off zero
    path = str(tmp_path / "modifiers.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-6)
    config = loaded.layers[-1].get_config()
    assert config["logit_soft_cap"] == 5.0 and config["attention_sinks"] is True
    assert config["alibi"] == [0.5, 0.25, 0.125, 0.0625]
    assert loaded.layers[-1].score_mod is score_mod
    assert "sinks" in [w.path.split("/")[-1] for w in loaded.layers[-1].weights]


def test_a_lambda_score_mod_is_refused_under_safe_mode(tmp_path):
    layer = MultiHeadAttention(2, 4, score_mod=lambda s, b, h, q, k: s * 0.5)
    inputs = keras.Input((3, 4))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "lambda.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save(path)
    assert any("lambda" in str(w.message) for w in caught)  # Keras' own warning
    with pytest.raises((TypeError, ValueError), match="lambda"):
        keras.saving.load_model(path, safe_mode=True)
    unsafe = keras.saving.load_model(path, safe_mode=False)
    x = np.ones((1, 3, 4), "float32")
    np.testing.assert_allclose(to_numpy(unsafe(x)), to_numpy(model(x)), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(logit_soft_cap=0), ValueError, r"`logit_soft_cap` must be a finite number in \(0"),
        (dict(logit_soft_cap="50"), ValueError, r"logit_soft_cap='50'"),
        (dict(alibi=[0.5]), ValueError, r"one slope per query head, shape \(2,\).*\(1,\)"),
        # #49: a nesting of num_heads values was flattened into the slopes.
        (
            dict(alibi=[[0.5], [0.25]]),
            ValueError,
            r"`alibi` must give one slope per query head, shape \(2,\)\. "
            r"Received: alibi with shape \(2, 1\)",
        ),
        (dict(alibi=[0.5, [0.25]]), ValueError, r"`alibi`.*shape \(2,\).*a ragged alibi"),
        (dict(alibi="paper"), TypeError, r"alibi='paper'"),
        (dict(attention_sinks="yes"), TypeError, r"attention_sinks='yes'"),
        (dict(score_mod=3), TypeError, r"score_mod=3"),
    ],
)
def test_bad_modifier_arguments_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=f"^MultiHeadAttention.*{message}"):
        MultiHeadAttention(2, 4, **kwargs)


def test_learned_sinks_train_on_the_blockwise_kernel_as_on_the_dense_one(monkeypatch):
    """The sink logits are a weight: the blockwise kernel's hand-written
    backward gives them (and every other weight) autodiff's gradients."""
    from tests.gradients import layer_gradients

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 11, 8)).astype("float32")
    cotangent = rng.normal(size=(2, 11, 8)).astype("float32")
    results = {}
    for kernel, options in (
        ("blockwise", dict(memory_efficient=True, block_size=4)),
        ("dense", dict(memory_efficient=False)),
    ):
        layer = MultiHeadAttention(4, 4, num_key_value_heads=2, attention_sinks=True, **options)
        layer.build(x.shape, x.shape)
        layer.set_weights(
            [np.random.default_rng(4).normal(scale=0.5, size=w.shape) for w in layer.get_weights()]
        )
        ran = spy_kernels(monkeypatch)
        results[kernel] = layer_gradients(layer, [x], cotangent, use_causal_mask=True)
        assert ran == [Kernel.BLOCKWISE if kernel == "blockwise" else Kernel.DENSE]
        names = [v.path.split("/")[-1] for v in layer.trainable_variables]
    sinks = names.index("sinks")
    assert np.abs(results["dense"][2][sinks]).max() > 1e-3
    np.testing.assert_allclose(results["blockwise"][0], results["dense"][0], rtol=1e-5, atol=1e-5)
    for got, want in zip(results["blockwise"][2], results["dense"][2], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max())


@keras.saving.register_keras_serializable(package="keras_attention_tests")
def _near(batch, head, q_idx, k_idx):
    return keras.ops.abs(q_idx - k_idx) < 2


@pytest.mark.tf_only  # the values on every kernel and backend: kernel_contract_test
def test_composed_mask_mods_are_saved_with_the_layer(tmp_path):
    """`or_masks(and_masks(f, g), h)` is a `mask_mod` that a `.keras` file
    names (`safe_mode`), as FlexAttention's compositions are functions."""
    from keras_attention.ops import and_masks
    from keras_attention.ops import or_masks
    from tests.attention_reference import mask_mod

    composed = or_masks(and_masks(mask_mod, _near), mask_mod)
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, MultiHeadAttention(2, 4, mask_mod=composed)(inputs))
    path = str(tmp_path / "composed.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-6)
    again = loaded.layers[-1].mask_mod
    assert again.combine == "or" and again.mask_mods[0].mask_mods == [mask_mod, _near]
