import keras
import numpy as np
import pytest

from keras_attention.layers import LuongAttention
from tests import reference
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test
from tests.testing import to_numpy


def _masked_inputs(tq=4, tv=6, dim=8, batch=3, value_dim=None, seed=0):
    rng = np.random.default_rng(seed)
    query = random_inputs((batch, tq, dim), seed=seed)
    value = random_inputs((batch, tv, value_dim or dim), seed=seed + 1)
    query_mask = reference.random_mask(rng, batch, tq)
    value_mask = reference.random_mask(rng, batch, tv)
    return query, value, query_mask, value_mask


def test_dot_matches_keras_attention():
    query, value, query_mask, value_mask = _masked_inputs()
    ours, our_weights = LuongAttention(score="dot")(
        query,
        value,
        query_mask=query_mask,
        value_mask=value_mask,
        return_attention_scores=True,
    )
    theirs, their_weights = keras.layers.Attention()(
        [query, value], mask=[query_mask, value_mask], return_attention_scores=True
    )
    np.testing.assert_allclose(to_numpy(ours), to_numpy(theirs), atol=1e-5)
    # Keras leaves weights of padded query rows as they are; ours are zero.
    rows = query_mask
    np.testing.assert_allclose(
        to_numpy(our_weights)[rows], to_numpy(their_weights)[rows], atol=1e-5
    )
    np.testing.assert_array_equal(to_numpy(our_weights)[~rows], 0.0)


def test_scaled_dot_matches_the_transformer_formula():
    # softmax(Q K^T / sqrt(d)) V, the scaled dot-product of the seed.
    query, value, query_mask, value_mask = _masked_inputs(dim=16)
    key = random_inputs(value.shape, seed=7)
    ours = LuongAttention(score="dot", divide_by_sqrt_dim=True)(
        query, value, key, query_mask=query_mask, value_mask=value_mask
    )
    scores = np.einsum("bqd,bkd->bqk", query, key) / np.sqrt(16)
    mask = reference.combined_mask(3, 4, 6, query_mask, value_mask)
    expected, _ = reference.attend(scores, value, mask)
    np.testing.assert_allclose(to_numpy(ours), expected, atol=1e-5)


@pytest.mark.parametrize("given", ["key_mask", "both"])
def test_key_mask_hides_keys_as_value_mask_does(given):
    # The single-head family takes Keras' `key_mask` too: a key is seen only
    # where every given key-side mask is True.
    query, value, query_mask, value_mask = _masked_inputs()
    key_mask = reference.random_mask(np.random.default_rng(5), 3, 6)
    masks = dict(key_mask=key_mask)
    if given == "both":
        masks["value_mask"] = value_mask
    ours = LuongAttention(score="dot")(query, value, query_mask=query_mask, **masks)
    keys_seen = key_mask & value_mask if given == "both" else key_mask
    scores = np.einsum("bqd,bkd->bqk", query, value)
    mask = reference.combined_mask(3, 4, 6, query_mask, keys_seen)
    expected, _ = reference.attend(scores, value, mask)
    np.testing.assert_allclose(to_numpy(ours), expected, atol=1e-5)


def test_deprecated_scale_warns_and_divides_by_sqrt_dim():
    # `scale=True` is the old name of `divide_by_sqrt_dim=True`: same layer.
    query, value, query_mask, value_mask = _masked_inputs(dim=16)
    masks = dict(query_mask=query_mask, value_mask=value_mask)
    with pytest.warns(DeprecationWarning, match="divide_by_sqrt_dim"):
        old = LuongAttention(score="general", scale=True)
    new = LuongAttention(score="general", divide_by_sqrt_dim=True)
    new(query, value, **masks)
    old(query, value, **masks)
    old.set_weights(new.get_weights())
    assert old.divide_by_sqrt_dim
    np.testing.assert_array_equal(
        to_numpy(old(query, value, **masks)), to_numpy(new(query, value, **masks))
    )


def test_general_matches_numpy():
    query, value, query_mask, value_mask = _masked_inputs(value_dim=5)
    layer = LuongAttention(score="general")
    ours = layer(query, value, query_mask=query_mask, value_mask=value_mask)
    kernel = to_numpy(layer.kernel)
    assert kernel.shape == (8, 5)
    scores = np.einsum("bqd,de,bke->bqk", query, kernel, value)
    mask = reference.combined_mask(3, 4, 6, query_mask, value_mask)
    expected, _ = reference.attend(scores, value, mask)
    np.testing.assert_allclose(to_numpy(ours), expected, atol=1e-5)


def test_concat_matches_numpy():
    query, value, query_mask, value_mask = _masked_inputs(value_dim=5)
    layer = LuongAttention(score="concat", units=7, divide_by_sqrt_dim=True)
    ours = layer(query, value, query_mask=query_mask, value_mask=value_mask)
    kernel, vector = to_numpy(layer.kernel), to_numpy(layer.score_vector)
    # v^T tanh(W [q; k]) with the concatenation spelled out.
    tq, tv = query.shape[1], value.shape[1]
    pairs = np.concatenate(
        [
            np.repeat(query[:, :, None, :], tv, axis=2),
            np.repeat(value[:, None, :, :], tq, axis=1),
        ],
        axis=-1,
    )
    scores = np.tanh(pairs @ kernel) @ vector / np.sqrt(5)
    mask = reference.combined_mask(3, tq, tv, query_mask, value_mask)
    expected, _ = reference.attend(scores, value, mask)
    np.testing.assert_allclose(to_numpy(ours), expected, atol=1e-5)


@pytest.mark.parametrize("score", ["dot", "general", "concat"])
def test_layer_contract(score, tmp_path):
    run_layer_contract_test(
        lambda **kwargs: LuongAttention(score=score, dropout=0.1, seed=3, **kwargs),
        tmp_path,
        value_shape=(2, 7, 8) if score != "general" else (2, 7, 6),
    )


def test_dot_with_different_dims_names_the_problem():
    layer = LuongAttention(score="dot", name="luong")
    with pytest.raises(
        ValueError, match=r"LuongAttention \(layer 'luong'\).*query features 4, key features 6"
    ):
        layer(np.ones((1, 2, 4), "float32"), np.ones((1, 3, 6), "float32"))


def test_concat_with_units_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: LuongAttention(
            score_mode="concat", units=5, dropout=0.1, seed=3, **kwargs
        ),
        tmp_path,
    )


def test_unknown_score_is_rejected():
    with pytest.raises(ValueError, match=r"argument score\b.* Received: score='cosine'"):
        LuongAttention(score="cosine")


def test_units_without_concat_is_rejected():
    with pytest.raises(ValueError, match=r"Received: units=4 with score_mode='dot'"):
        LuongAttention(score="dot", units=4)


def test_non_positive_units_is_rejected():
    with pytest.raises(ValueError, match=r"`units` must be a positive integer.*units=0"):
        LuongAttention(score="concat", units=0)
