import numpy as np
import pytest
from keras import ops

from keras_attention.layers import LowRankAttention
from tests import reference
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test


def test_matches_low_rank_bilinear_form_in_numpy():
    rng = np.random.default_rng(0)
    query = random_inputs((2, 4, 6), seed=1)
    value = random_inputs((2, 5, 3), seed=2)
    query_mask = reference.random_mask(rng, 2, 4)
    layer = LowRankAttention(rank=2)
    out = layer(query, value, query_mask=query_mask, use_causal_mask=True)
    u = ops.convert_to_numpy(layer.query_kernel)
    v = ops.convert_to_numpy(layer.key_kernel)
    # q^T W k with W = U V^T of rank 2, built explicitly.
    w = u @ v.T
    assert np.linalg.matrix_rank(w) == 2
    scores = np.einsum("bqd,de,bke->bqk", query, w, value)
    mask = reference.combined_mask(2, 4, 5, query_mask=query_mask, causal=True)
    expected, _ = reference.attend(scores, value, mask)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-5)


def test_layer_contract(tmp_path):
    run_layer_contract_test(lambda **kwargs: LowRankAttention(3, **kwargs), tmp_path)


@pytest.mark.parametrize("rank", [0, None, "4"])
def test_bad_rank_is_rejected(rank):
    with pytest.raises(ValueError, match=r"LowRankAttention: `rank` must be a positive integer"):
        LowRankAttention(rank=rank)
