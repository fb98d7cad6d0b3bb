import numpy as np
import pytest
from keras import ops

from keras_attention.layers import AdditiveAttention
from tests import reference
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test


@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_bahdanau_formula_in_numpy(use_bias):
    rng = np.random.default_rng(0)
    query = random_inputs((2, 3, 5), seed=1)
    value = random_inputs((2, 6, 4), seed=2)
    key = random_inputs((2, 6, 7), seed=3)
    value_mask = reference.random_mask(rng, 2, 6)
    layer = AdditiveAttention(units=9, use_bias=use_bias, bias_initializer="random_normal")
    out, weights = layer(query, value, key, value_mask=value_mask, return_attention_scores=True)
    w_q, w_k = ops.convert_to_numpy(layer.query_kernel), ops.convert_to_numpy(layer.key_kernel)
    v = ops.convert_to_numpy(layer.scale)
    bias = ops.convert_to_numpy(layer.bias) if use_bias else 0.0
    # score[b, i, j] = v . tanh(Wq q_i + Wk k_j + b), one pair at a time.
    scores = np.zeros((2, 3, 6))
    for b in range(2):
        for i in range(3):
            for j in range(6):
                scores[b, i, j] = v @ np.tanh(query[b, i] @ w_q + key[b, j] @ w_k + bias)
    mask = reference.combined_mask(2, 3, 6, value_mask=value_mask)
    expected, expected_weights = reference.attend(scores, value, mask)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    assert layer.bias is None if not use_bias else layer.bias.shape == (9,)


def test_without_units_the_score_is_keras_and_has_no_projections():
    layer = AdditiveAttention(name="att")
    query, value = random_inputs((2, 3, 4), seed=1), random_inputs((2, 5, 4), seed=2)
    out = layer(query, value)
    assert [w.path.split("/")[-1] for w in layer.weights] == ["scale"]
    scale = ops.convert_to_numpy(layer.scale)
    scores = (scale * np.tanh(query[:, :, None] + value[:, None])).sum(-1)
    expected, _ = reference.attend(scores, value, reference.combined_mask(2, 3, 5))
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"AdditiveAttention \(layer 'att_2'\).*units="):
        AdditiveAttention(name="att_2")(query, random_inputs((2, 5, 6)))


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: AdditiveAttention(units=4, dropout=0.2, seed=1, **kwargs),
        tmp_path,
    )


@pytest.mark.parametrize("units", [0, -3, 2.5])
def test_bad_units_are_rejected(units):
    with pytest.raises(ValueError, match=rf"AdditiveAttention: `units`.*units={units!r}"):
        AdditiveAttention(units=units)
