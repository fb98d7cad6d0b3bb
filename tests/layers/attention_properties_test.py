"""Properties every score-function attention layer must have, checked by hypothesis."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention.layers import AdditiveAttention
from keras_attention.layers import LowRankAttention
from keras_attention.layers import LuongAttention

FACTORIES = {
    "additive": lambda: AdditiveAttention(units=5),
    "dot": lambda: LuongAttention(score="dot", divide_by_sqrt_dim=True),
    "general": lambda: LuongAttention(score="general"),
    "concat": lambda: LuongAttention(score="concat", units=3),
    "low_rank": lambda: LowRankAttention(rank=2),
}
LAYERS = {name: make() for name, make in FACTORIES.items()}
DIM = 4


@st.composite
def attention_problems(draw):
    # Few distinct shapes: JAX compiles each op once per shape, and the
    # properties are about values and masks, which hypothesis varies freely.
    batch = 2
    tq = draw(st.sampled_from([1, 4]))
    tv = draw(st.sampled_from([1, 5, 7]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((batch, tq, DIM)).astype("float32")
    value = rng.standard_normal((batch, tv, DIM)).astype("float32")
    value_mask = rng.random((batch, tv)) > draw(st.floats(0.0, 0.9))
    return query, value, value_mask, rng


_settings = settings(max_examples=15, deadline=None, derandomize=True)


@pytest.mark.parametrize("name", sorted(LAYERS))
@_settings
@given(problem=attention_problems())
def test_weights_sum_to_one_over_unmasked_keys(name, problem):
    query, value, value_mask, _ = problem
    _, weights = LAYERS[name](query, value, value_mask=value_mask, return_attention_scores=True)
    weights = ops.convert_to_numpy(weights)
    assert np.all(weights >= 0)
    assert np.all(weights[np.broadcast_to(~value_mask[:, None, :], weights.shape)] == 0)
    has_key = value_mask.any(-1)
    np.testing.assert_allclose(weights[has_key].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(weights[~has_key], 0.0)


@pytest.mark.parametrize("name", sorted(LAYERS))
@_settings
@given(problem=attention_problems())
def test_values_at_masked_positions_do_not_matter(name, problem):
    query, value, value_mask, rng = problem
    changed = np.where(
        value_mask[:, :, None], value, rng.standard_normal(value.shape) * 1e3
    ).astype("float32")
    layer = LAYERS[name]
    before = layer(query, value, value_mask=value_mask)
    after = layer(query, changed, value_mask=value_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(before), ops.convert_to_numpy(after), atol=1e-5)


@pytest.mark.parametrize("name", sorted(LAYERS))
@_settings
@given(problem=attention_problems())
def test_self_attention_is_permutation_equivariant(name, problem):
    _, sequence, mask, rng = problem
    permutation = rng.permutation(sequence.shape[1])
    layer = LAYERS[name]
    out = ops.convert_to_numpy(layer(sequence, query_mask=mask))
    permuted = ops.convert_to_numpy(
        layer(sequence[:, permutation], query_mask=mask[:, permutation])
    )
    np.testing.assert_allclose(permuted, out[:, permutation], atol=1e-5)
