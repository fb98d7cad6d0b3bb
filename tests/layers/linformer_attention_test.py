import keras
import numpy as np
import pytest

from keras_attention.layers import LinformerAttention
from keras_attention.layers import MultiHeadAttention
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test
from tests.testing import to_numpy


def test_identity_projections_give_exact_attention():
    # With E = F = I (projected_length == length) Linformer is exact attention.
    query, value = random_inputs((2, 6, 8), seed=1), random_inputs((2, 9, 6), seed=2)
    layer = LinformerAttention(2, 4, projected_length=9, max_length=9)
    layer(query, value)
    exact = MultiHeadAttention(2, 4, memory_efficient=False)
    exact(query, value)
    # Keras lists a layer's own weights (E, F) before its sublayers'.
    assert [w.path.split("/", 1)[1] for w in layer.trainable_weights[:2]] == [
        "key_projection",
        "value_projection",
    ]
    for mine, theirs in zip(layer.trainable_weights[2:], exact.trainable_weights, strict=True):
        mine.assign(theirs)
    layer.key_projection.assign(np.eye(9, dtype="float32"))
    layer.value_projection.assign(np.eye(9, dtype="float32"))
    output, scores = layer(query, value, return_attention_scores=True)
    expected, expected_scores = exact(query, value, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(output), to_numpy(expected), atol=1e-5)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected_scores), atol=1e-5)


def test_masked_keys_do_not_change_the_output():
    query = random_inputs((1, 5, 8))
    value = random_inputs((1, 10, 8), seed=2)
    mask = np.arange(10)[None, :] < 6
    changed = value.copy()
    changed[:, 6:] = 100.0
    layer = LinformerAttention(2, 4, projected_length=3, max_length=16)
    np.testing.assert_allclose(
        to_numpy(layer(query, value, value_mask=mask)),
        to_numpy(layer(query, changed, value_mask=mask)),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(projected_length=0, max_length=8), "projected_length=0"),
        (dict(projected_length=2, max_length=None), "max_length=None"),
        (
            dict(projected_length=2, max_length=8, memory_efficient=False),
            "'memory_efficient': False",
        ),
        (dict(projected_length=2, max_length=8, block_size=4), "'block_size': 4"),
    ],
)
def test_invalid_constructor_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=f"LinformerAttention.*{message}"):
        LinformerAttention(2, 4, **kwargs)


def test_unsupported_call_options_and_long_inputs_are_rejected():
    layer = LinformerAttention(2, 4, projected_length=2, max_length=8)
    with pytest.raises(ValueError, match="longer than `max_length` \\(8\\).*9"):
        layer(random_inputs((1, 9, 8)))
    with pytest.raises(ValueError, match="use_causal_mask=True"):
        layer(random_inputs((1, 6, 8)), use_causal_mask=True)
    with pytest.raises(ValueError, match="attention_mask=a tensor"):
        layer(random_inputs((1, 6, 8)), attention_mask=np.ones((1, 6, 6), bool))
    with pytest.raises(ValueError, match="longer than"):
        LinformerAttention(2, 4, projected_length=2, max_length=8)(keras.Input((12, 8)))


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: LinformerAttention(
            2, 4, projected_length=3, max_length=8, dropout=0.1, seed=0, **kwargs
        ),
        tmp_path,
        expected_cross_output_shape=(2, 5, 8),
    )


@pytest.mark.parametrize("length", [1, 5])
def test_lengths_below_the_projection_size_match_numpy(length):
    # 1 and 5 keys, 8 projected positions: the first `length` rows of E, F.
    query = random_inputs((2, length, 8), seed=1)
    layer = LinformerAttention(
        2, 4, projected_length=8, max_length=16, bias_initializer="random_normal"
    )
    output = to_numpy(layer(query))
    e, f, wq, bq, wk, bk, wv, bv, wo, bo = [
        keras.ops.convert_to_numpy(w).astype(np.float64) for w in layer.trainable_weights
    ]
    q, k, v = (np.einsum("btf,fhd->bthd", query, w) + b for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    k = np.einsum("bthd,tk->bkhd", k, e[:length])
    v = np.einsum("bthd,tk->bkhd", v, f[:length])
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0  # sqrt(key_dim = 4)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd,hdo->bqo", weights, v, wo) + bo
    assert output.shape == (2, length, 8)
    np.testing.assert_allclose(output, expected, atol=1e-5)
