"""NaN/Inf at a key hidden only by a per-query mask (issue 11).

A key that `attention_mask` or the causal mask hides from some queries, whose
value or key is NaN or Inf, must reach exactly the queries that see it: their
outputs are NaN (a diverging model stays visible), every other output is
finite and the same as with any finite number in that position. Which
queries see the key is computed here in NumPy from the masks (and, for
SparseAttention, from `sparse_reference.reference_pattern`), independently of
the kernels. Every layer and kernel that takes per-query masks, in float32,
float16 and bfloat16, on whichever backend runs the suite.
"""

import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from tests.sparse_reference import reference_pattern
from tests.testing import to_numpy

BATCH, LENGTH, FEATURES = 2, 6, 8
SPARSE_BLOCK, SPARSE_WINDOW = 2, 1

# name -> (factory(dtype), call options). Every kernel that takes a
# per-query mask; Linformer takes none (it rejects them), its key-mask case
# is in hostile_inputs_test.
LAYERS = {
    "additive": (lambda d: ka.AdditiveAttention(dtype=d), {}),
    "luong_dot": (lambda d: ka.LuongAttention(score_mode="dot", dtype=d), {}),
    "luong_general": (lambda d: ka.LuongAttention(score_mode="general", dtype=d), {}),
    "low_rank": (lambda d: ka.LowRankAttention(rank=2, dtype=d), {}),
    # Keras' composite kernel (no weights asked for) and our dense softmax.
    "mha_composite": (lambda d: ka.MultiHeadAttention(2, 4, dtype=d), {}),
    "mha_dense": (
        lambda d: ka.MultiHeadAttention(2, 4, dtype=d),
        {"return_attention_scores": True},
    ),
    "mha_blockwise": (
        lambda d: ka.MultiHeadAttention(2, 4, memory_efficient=True, block_size=2, dtype=d),
        {},
    ),
    "mha_grouped_blockwise": (
        lambda d: ka.MultiHeadAttention(
            2, 4, num_key_value_heads=1, memory_efficient=True, block_size=4, dtype=d
        ),
        {},
    ),
    "mha_sliding_window": (lambda d: ka.MultiHeadAttention(2, 4, sliding_window=2, dtype=d), {}),
    "sparse": (
        lambda d: ka.SparseAttention(
            2,
            4,
            block_size=SPARSE_BLOCK,
            window_blocks=SPARSE_WINDOW,
            global_blocks=0,
            random_blocks=0,
            dtype=d,
        ),
        {},
    ),
    "performer": (lambda d: ka.PerformerAttention(2, 4, num_features=8, seed=0, dtype=d), {}),
    "performer_relu": (
        lambda d: ka.PerformerAttention(2, 4, num_features=8, kernel="relu", seed=0, dtype=d),
        {},
    ),
}
DTYPES = ["float32", "float16", "bfloat16"]


def _structural_pattern(name, causal):
    """`(Tq, Tv)`: which keys a layer's own structure lets each query see."""
    allowed = np.ones((LENGTH, LENGTH), bool)
    if name == "sparse":
        allowed = reference_pattern(LENGTH, LENGTH, SPARSE_BLOCK, SPARSE_WINDOW, causal=causal)
    if name == "mha_sliding_window":
        rows, cols = np.indices((LENGTH, LENGTH))
        allowed = np.abs(rows - cols) < 2
    if causal:
        allowed &= np.tril(np.ones((LENGTH, LENGTH), bool))
    return allowed


def _check(name, dtype, poisoned, replaced, call, sees):
    """`sees` (B, Tq): which queries see a non-finite position (NumPy)."""
    factory, options = LAYERS[name]
    layer = factory(dtype)
    result = call(layer, poisoned, options)
    output = to_numpy(result[0] if isinstance(result, tuple) else result)
    clean = call(layer, replaced, options)
    clean = to_numpy(clean[0] if isinstance(clean, tuple) else clean)
    assert sees.any() and (~sees).any()  # both kinds of query are tested
    assert np.all(np.isnan(output[sees])), f"a query that sees NaN is finite: {name}"
    hidden = output[~sees]
    assert np.all(np.isfinite(hidden)), f"NaN reached a query that cannot see it: {name}"
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    if name.startswith("performer"):
        # Approximate: the key stabiliser (one constant over all keys) and
        # the features' epsilon let any key's value move other rows a little
        # (at most 6e-4 in float32 and 2e-3 in bfloat16 over 300 weight
        # draws, with the drawn key as the finite stand-in; see _stand_in).
        tolerance = max(tolerance, 5e-3)
    np.testing.assert_allclose(hidden, clean[~sees], atol=tolerance, rtol=tolerance)
    if isinstance(result, tuple):  # returned weights: NaN in exactly those rows
        rows = to_numpy(result[1]).transpose(0, 2, 1, 3)  # (B, Tq, H, Tv)
        assert np.all(np.isnan(rows[sees]).any(axis=-1))
        assert np.all(np.isfinite(rows[~sees]))


def _stand_in(name, drawn, finite):
    """The finite number compared with the NaN/Inf at a hidden position.

    Any finite number gives the same hidden outputs on the exact kernels, so
    a large one is used. Performer's positive features subtract one
    stabiliser, the maximum over every key, and a stand-in key that sets that
    maximum (an entry of -7 does, through the projections) shrinks the other
    keys' features towards the epsilon and moves the hidden outputs by up to
    0.1 (measured over 300 weight draws): an approximation effect, with or
    without NaN. Performer is compared with the key as drawn.
    """
    return drawn if name.startswith("performer") else finite


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_nan_value_and_inf_key_behind_an_attention_mask(name, dtype):
    rng = np.random.default_rng(0)
    query = rng.standard_normal((BATCH, LENGTH, FEATURES)).astype("float32")
    value = rng.standard_normal((BATCH, LENGTH, FEATURES)).astype("float32")
    key = rng.standard_normal((BATCH, LENGTH, FEATURES)).astype("float32")
    attention_mask = rng.random((BATCH, LENGTH, LENGTH)) < 0.5
    attention_mask[:, :, 0] = True  # every query sees some key
    # Batch 0: a NaN value at key 3; batch 1: an Inf key at key 4.
    attention_mask[0, :3, 3] = True
    attention_mask[0, 3:, 3] = False
    attention_mask[1, ::2, 4] = False
    attention_mask[1, 1::2, 4] = True
    poisoned_value, poisoned_key = value.copy(), key.copy()
    poisoned_value[0, 3, 1] = np.nan
    poisoned_key[1, 4, 2] = np.inf
    replaced_value, replaced_key = value.copy(), key.copy()
    replaced_value[0, 3, 1] = 1e3
    replaced_key[1, 4, 2] = _stand_in(name, key[1, 4, 2], -7.0)
    allowed = attention_mask & _structural_pattern(name, causal=False)[None]
    sees = np.zeros((BATCH, LENGTH), bool)
    sees[0] = allowed[0, :, 3]
    sees[1] = allowed[1, :, 4]

    def call(layer, inputs, options):
        value, key = inputs
        return layer(query, value, key, attention_mask=attention_mask, **options)

    _check(name, dtype, (poisoned_value, poisoned_key), (replaced_value, replaced_key), call, sees)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_nan_behind_the_causal_mask(name, dtype):
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((BATCH, LENGTH, FEATURES)).astype("float32")
    poisoned, replaced = inputs.copy(), inputs.copy()
    poisoned[0, 2, 0] = np.nan  # self-attention: query, key and value 2
    replaced[0, 2, 0] = _stand_in(name, inputs[0, 2, 0], 5.0)
    allowed = _structural_pattern(name, causal=True)
    sees = np.zeros((BATCH, LENGTH), bool)
    sees[0] = allowed[:, 2]

    def call(layer, x, options):
        return layer(x, use_causal_mask=True, **options)

    _check(name, dtype, poisoned, replaced, call, sees)


def test_nan_in_a_decoding_cache_reaches_only_later_steps():
    """Cache entries are confined when written: a NaN step poisons later steps."""
    layer = ka.MultiHeadAttention(2, 4)
    inputs = np.random.default_rng(2).standard_normal((1, 4, 8)).astype("float32")
    layer(inputs)
    cache = ops.zeros((1, 2, 4, 2, 4))
    outputs = []
    for t in range(4):
        step = inputs[:, t : t + 1].copy()
        if t == 1:
            step[0, 0, 3] = np.nan
        output, cache = layer(step, cache=cache, cache_update_index=t, use_causal_mask=True)
        outputs.append(to_numpy(output))
    assert np.all(np.isfinite(outputs[0]))
    assert all(np.all(np.isnan(o)) for o in outputs[1:])
    # A query decoding before the NaN was written never saw it; nor does a
    # read-only cross-attention cache spread a NaN value beyond its key.
    memory = np.random.default_rng(3).standard_normal((1, 5, 8)).astype("float32")
    memory[0, 4, 0] = np.nan
    cross = ka.MultiHeadAttention(2, 4)
    cross(inputs, memory)
    kv = cross.precompute_key_value(memory)
    mask = np.array([[[True] * 4 + [False]] * 4])
    mask[0, 3, 4] = True  # only the last query sees the NaN memory slot
    out, _ = cross(inputs, cache=kv, attention_mask=mask)
    out = to_numpy(out)
    assert np.all(np.isfinite(out[0, :3])) and np.all(np.isnan(out[0, 3]))
