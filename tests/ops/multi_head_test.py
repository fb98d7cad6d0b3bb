import numpy as np
import pytest
from keras import ops

from keras_attention.ops import multi_head


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_grouped_logits_and_weighted_sum_match_repeated_heads_in_numpy(kv_heads):
    rng = np.random.default_rng(0)
    query = rng.standard_normal((2, 3, 4, 5)).astype("float32")
    key = rng.standard_normal((2, 6, kv_heads, 5)).astype("float32")
    value = rng.standard_normal((2, 6, kv_heads, 7)).astype("float32")
    groups = 4 // kv_heads
    key_rep = np.repeat(key, groups, axis=2)  # head h uses kv head h // groups
    value_rep = np.repeat(value, groups, axis=2)
    expected_logits = np.einsum("bqhd,bkhd->bhqk", query, key_rep)
    logits = ops.convert_to_numpy(multi_head.multi_head_logits(query, key))
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
    weights = rng.random((2, 4, 3, 6)).astype("float32")
    expected_out = np.einsum("bhqk,bkhd->bqhd", weights, value_rep)
    out = ops.convert_to_numpy(multi_head.multi_head_weighted_sum(weights, value))
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    repeated = multi_head.repeat_key_value_heads(key, 4)
    np.testing.assert_array_equal(ops.convert_to_numpy(repeated), key_rep)
