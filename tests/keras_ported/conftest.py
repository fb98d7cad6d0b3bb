"""Keras' own attention tests, run against keras_attention.MultiHeadAttention.

Not applicable here, and why (everything else in these files must pass on
TensorFlow and JAX):
- GroupedQueryAttentionTest.test_shape_mismatch_error_query_value_dim_mismatch
  expects `compute_output_shape((2, 4, 8), (2, 2, 7), 2)` to fail because
  GroupedQueryAttention requires equal query and value feature sizes.
  MultiHeadAttention does not (Keras' own
  MultiHeadAttentionTest.test_compute_output_shape_different_qv_last_dims
  asserts that (.., 8) queries with (.., 7) values work), and one class cannot
  honour both; ours follows MultiHeadAttention. (Its `key_shape=2` is not a
  shape: ours says so in a ValueError.)
- AttentionTest.test_attention_with_mask and
  AdditiveAttentionTest.test_attention_with_mask (LuongAttention,
  AdditiveAttention) expect the weights of a masked query row to stay a
  distribution over the keys (`[1, 0]`); our documented contract gives a
  query with nothing to attend to zero weights and a zero output. The
  outputs they assert (`[[1, 1], [0, 0]]`) are ours too:
  tests/layers/keras_drop_in_test.py checks them with the weights ours gives.
- AttentionTest.test_attention_errors and AdditiveAttentionTest.
  test_attention_errors start with `layer(tensor)` raising "must be called
  on a list"; our layers attend to themselves on one input (`layer(x)`,
  which `model.add(layer)` does). The other three errors of those tests are
  ours, with Keras' wording: tests/layers/keras_drop_in_test.py.
"""

import pytest

NOT_APPLICABLE = {
    "keras_grouped_query_attention_test.py::GroupedQueryAttentionTest::"
    "test_shape_mismatch_error_query_value_dim_mismatch": (
        "GroupedQueryAttention-only rule contradicted by Keras' "
        "MultiHeadAttention test (see tests/keras_ported/conftest.py)"
    ),
    "keras_attention_test.py::AttentionTest::test_attention_with_mask": (
        "zero weights for a masked query row (see tests/keras_ported/conftest.py)"
    ),
    "keras_additive_attention_test.py::AdditiveAttentionTest::test_attention_with_mask": (
        "zero weights for a masked query row (see tests/keras_ported/conftest.py)"
    ),
    "keras_attention_test.py::AttentionTest::test_attention_errors": (
        "one input is self-attention here (see tests/keras_ported/conftest.py)"
    ),
    "keras_additive_attention_test.py::AdditiveAttentionTest::test_attention_errors": (
        "one input is self-attention here (see tests/keras_ported/conftest.py)"
    ),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for node_id, reason in NOT_APPLICABLE.items():
            if item.nodeid.endswith(node_id):
                item.add_marker(pytest.mark.skip(reason=reason))
