"""T5's relative position bias as a weighted `score_mod` (#36).

The buckets equal KerasHub's `T5MultiHeadAttention.compute_bias` on the same
table (bidirectional for the encoder, one-way for the decoder, and a decoding
offset); a `MultiHeadAttention` with the layer as its `score_mod` equals a
float64 NumPy reference on the dense and blockwise kernels (spied), and its
table gets the same gradient from the blockwise kernel's hand-written
backward as from autodiff through the dense kernel; it saves as `.keras`.
"""

import keras
import numpy as np
import pytest

from keras_attention import MultiHeadAttention
from keras_attention.layers import RelativePositionBias
from keras_attention.layers.machinery.kernel_selector import Kernel
from tests.attention_reference import positional
from tests.gradients import layer_gradients
from tests.kernel_spy import spy_kernels
from tests.testing import to_numpy

HEADS = 4


def _bias_of(layer, rows, cols):
    """Our `(1, H, Tq, Tk)` bias: the `score_mod` applied to zero scores."""
    q = keras.ops.reshape(keras.ops.convert_to_tensor(rows, "int32"), (1, 1, -1, 1))
    k = keras.ops.reshape(keras.ops.convert_to_tensor(cols, "int32"), (1, 1, 1, -1))
    head = keras.ops.reshape(keras.ops.arange(layer.num_heads, dtype="int32"), (1, -1, 1, 1))
    zeros = keras.ops.zeros((1, layer.num_heads, len(rows), len(cols)))
    return to_numpy(layer(zeros, None, head, q, k))


@pytest.mark.parametrize("decoder, offset", [(False, 0), (True, 0), (True, 150)])
def test_bias_equals_keras_hub_t5_on_the_same_table(decoder, offset):
    from keras_hub.src.models.t5.t5_multi_head_attention import T5MultiHeadAttention

    theirs = T5MultiHeadAttention(
        is_decoder=decoder,
        hidden_dim=16,
        key_value_dim=4,
        num_heads=HEADS,
        dropout=0.0,
        use_relative_attention_bias=True,
    )
    ours = RelativePositionBias(HEADS, bidirectional=not decoder)
    ours.build()
    table = np.random.default_rng(0).normal(size=(32, HEADS)).astype("float32")
    theirs.relative_attention_bias.assign(table)
    ours.embeddings.assign(table)
    q_len, k_len = 7, 300  # distances past max_distance (128) in both directions
    expected = to_numpy(theirs.compute_bias(q_len, k_len, query_start_index=offset))
    got = _bias_of(ours, np.arange(q_len) + offset, np.arange(k_len))
    np.testing.assert_array_equal(got, expected)


def _numpy_bucket(relative, bidirectional, num_buckets=32, max_distance=128):
    """T5's bucketing (Raffel et al.'s code), in NumPy."""
    n = -np.asarray(relative)
    result = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        result += (n < 0) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        large = exact + (
            np.log(np.maximum(n, 1) / exact) / np.log(max_distance / exact) * (num_buckets - exact)
        ).astype(int)
    return result + np.where(n < exact, n, np.minimum(large, num_buckets - 1))


@pytest.mark.parametrize(
    "kernel, options", [(Kernel.DENSE, dict(memory_efficient=False)), (Kernel.BLOCKWISE, {})]
)
def test_layer_with_the_bias_matches_numpy_and_trains_its_table(monkeypatch, kernel, options):
    rng = np.random.default_rng(1)
    length, features = 13, 8
    x = rng.normal(size=(2, length, features)).astype("float32")
    cotangent = rng.normal(size=(2, length, features)).astype("float32")

    def make(**kwargs):
        layer = MultiHeadAttention(
            HEADS, 4, score_mod=RelativePositionBias(HEADS, bidirectional=False), **kwargs
        )
        layer.build(x.shape, x.shape)
        return layer

    layer = make(block_size=4, **{"memory_efficient": True, **options})
    layer.set_weights([rng.normal(scale=0.5, size=w.shape) for w in layer.get_weights()])
    ran = spy_kernels(monkeypatch)
    out, _, weight_grads = layer_gradients(layer, [x], cotangent, use_causal_mask=True)
    assert set(ran) == {kernel}
    # Against NumPy: the projections, the bias, the causal softmax.
    w = {v.path.split("/", 1)[1]: to_numpy(v.value) for v in layer.weights}
    q = np.einsum("btf,fhd->bthd", x, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("btf,fhd->bthd", x, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("btf,fhd->bthd", x, w["value/kernel"]) + w["value/bias"]
    rows, cols = np.arange(length)[:, None], np.arange(length)[None]
    bias = np.transpose(
        w["relative_position_bias/embeddings"][_numpy_bucket(cols - rows, False)], (2, 0, 1)
    )
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0 + bias[None]
    logits = np.where(positional(rows[:, 0], cols[0], True, None), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", probs, v)
    expected = np.einsum("bqhd,hdo->bqo", context, w["attention_output/kernel"])
    np.testing.assert_allclose(out, expected + w["attention_output/bias"], atol=1e-5)
    # The table's gradient: the same from the blockwise kernel's hand-written
    # backward as from autodiff through the dense kernel.
    dense = make(memory_efficient=False)
    dense.set_weights(layer.get_weights())
    _, _, dense_grads = layer_gradients(dense, [x], cotangent, use_causal_mask=True)
    names = [v.path for v in layer.trainable_variables]
    found = [i for i, name in enumerate(names) if name.endswith("embeddings")]
    assert len(found) == 1 and np.abs(dense_grads[found[0]]).max() > 1e-3
    for got, want in zip(weight_grads, dense_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_saves_with_the_attention_layer(tmp_path):
    layer = MultiHeadAttention(HEADS, 4, score_mod=RelativePositionBias(HEADS, max_distance=16))
    inputs = keras.Input((9, 8))
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    layer.set_weights([w + 0.2 for w in layer.get_weights()])
    path = str(tmp_path / "t5.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = np.random.default_rng(0).normal(size=(1, 9, 8)).astype("float32")
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-6)
    bias = loaded.layers[-1].score_mod
    assert isinstance(bias, RelativePositionBias) and bias.max_distance == 16


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_heads=0), ValueError, "num_heads=0"),
        (dict(num_heads=2, num_buckets=2), ValueError, "num_buckets=2"),
        (dict(num_heads=2, max_distance=4), ValueError, "max_distance=4"),
        (dict(num_heads=2, bidirectional="yes"), TypeError, "bidirectional='yes'"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=f"^RelativePositionBias.*{message}"):
        RelativePositionBias(**kwargs)


def test_the_attention_layer_refuses_a_bias_of_other_heads():
    with pytest.raises(ValueError, match="`score_mod` has 3 heads, the layer 2"):
        MultiHeadAttention(2, 4, score_mod=RelativePositionBias(3))
