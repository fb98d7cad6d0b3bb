"""The public kernels confine NaN/Inf themselves (issue 11), called directly.

A NaN value at key `j` under the causal mask: queries before `j` must give
what NumPy attention (`sparse_reference.reference_attention`) gives with any
finite number there, queries from `j` on are NaN.
"""

import numpy as np
import pytest
from keras import ops

from keras_attention.ops import block_sparse
from keras_attention.ops import favor
from keras_attention.ops.attention_mask import AttentionMask
from keras_attention.ops.memory_efficient import memory_efficient_attention
from tests.sparse_reference import reference_attention

LENGTH, HIDDEN = 6, 3


def _inputs():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, LENGTH, 2, 4)).astype("float32") for _ in range(3))
    poisoned = v.copy()
    poisoned[0, HIDDEN, 1, 2] = np.nan
    return q, k, v, poisoned


KERNELS = {
    "memory_efficient": lambda q, k, v: memory_efficient_attention(
        q, k, v, mask=AttentionMask(causal=True), block_size=LENGTH
    ),
    "block_sparse": lambda q, k, v: block_sparse.block_sparse_attention(
        q, k, v, block_size=LENGTH, window_blocks=1, mask=AttentionMask(causal=True)
    ),
    "favor": lambda q, k, v: favor.favor_attention(
        q,
        k,
        v,
        favor.random_projection(8, 4, seed=0),
        causal=True,
        chunk_size=LENGTH,
    ),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_kernel_called_directly_confines_a_hidden_nan(name):
    q, k, v, poisoned = _inputs()
    out = np.asarray(ops.convert_to_numpy(KERNELS[name](q, k, poisoned)), "float64")
    # (B, T, H, D): head 1 of the queries that see key HIDDEN is NaN; the
    # other head, and every query before it, is untouched.
    assert np.all(np.isnan(out[0, HIDDEN:, 1]))
    seen = np.zeros(out.shape, bool)
    seen[0, HIDDEN:, 1] = True
    assert np.all(np.isfinite(out[~seen]))
    if name == "favor":  # approximate: same as the kernel with finite values
        clean = np.asarray(ops.convert_to_numpy(KERNELS[name](q, k, v)), "float64")
        np.testing.assert_allclose(out[~seen], clean[~seen], atol=5e-2)
        return
    causal = np.tril(np.ones((LENGTH, LENGTH), bool))[None]
    expected, _ = reference_attention(q, k, v, causal)
    np.testing.assert_allclose(out[~seen], expected[~seen], atol=1e-5)
