import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops.memory_efficient import memory_efficient_attention
from tests.gradients import input_gradients


def _reference(q, k, v, mask, d_out):
    """Plain NumPy float64 attention, its output and its gradients.

    `mask` is `(B, Tq, Tk)` boolean; rows with no allowed key give zeros.
    """
    q, k, v, d_out = (np.asarray(a, np.float64) for a in (q, k, v, d_out))
    groups = q.shape[2] // k.shape[2]
    k_rep, v_rep = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = 1.0 / np.sqrt(q.shape[-1])
    logits = np.einsum("bqhd,bkhd->bhqk", q, k_rep) * scale
    allowed = mask[:, None]
    logits = np.where(allowed, logits, -np.inf)
    row_max = np.max(logits, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(logits - row_max) * allowed
    sums = weights.sum(-1, keepdims=True)
    probs = np.where(sums > 0, weights / np.where(sums > 0, sums, 1.0), 0.0)
    out = np.einsum("bhqk,bkhd->bqhd", probs, v_rep)
    d_probs = np.einsum("bqhd,bkhd->bhqk", d_out, v_rep)
    d_logits = probs * (d_probs - (d_probs * probs).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", d_logits, k_rep) * scale
    dk_rep = np.einsum("bhqk,bqhd->bkhd", d_logits, q) * scale
    dv_rep = np.einsum("bhqk,bqhd->bkhd", probs, d_out)
    shape = k.shape[:3] + (groups,)
    dk = dk_rep.reshape(shape + k.shape[3:]).sum(3)
    dv = dv_rep.reshape(shape + v.shape[3:]).sum(3)
    return out, [dq, dk, dv]


def _inputs(batch, q_len, k_len, heads, kv_heads, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_len, heads, 8)).astype("float32")
    k = rng.standard_normal((batch, k_len, kv_heads, 8)).astype("float32")
    v = rng.standard_normal((batch, k_len, kv_heads, 6)).astype("float32")
    d_out = rng.standard_normal((batch, q_len, heads, 6)).astype("float32")
    return q, k, v, d_out


_CASES = [
    ("plain", 4),
    ("plain", 64),  # a single tile
    ("key_padding", 4),
    ("query_mask", 4),
    ("attention_mask", 4),
    ("causal", 4),
    ("causal_cross_lengths", 4),
    ("causal_padding_grouped", 4),
    ("causal_padding_grouped", 64),
]


# The kernel takes one of two paths per query block: rows whose logits are
# bounded (|q| max|k| <= FIXED_SHIFT_MAX; these inputs' bound is ~4) skip the
# running maximum; others keep it. "large" scales the queries 40x (bound
# ~160: a fixed shift would underflow every weight to 0), "mixed" does so for
# the first query block only, so one call takes both paths.
@pytest.mark.parametrize(
    "case, block_size, logits",
    [case + ("bounded",) for case in _CASES]
    + [
        (case, 4, logits)
        for case in ("plain", "attention_mask", "causal_padding_grouped")
        for logits in ("large", "mixed")
    ],
)
def test_matches_numpy_reference_values_and_gradients(case, block_size, logits):
    q_len, k_len = (7, 13) if case == "causal_cross_lengths" else (11, 11)
    kv_heads = 2 if case.endswith("grouped") else 4
    q, k, v, d_out = _inputs(2, q_len, k_len, 4, kv_heads)
    if logits == "large":
        q = q * 40
    elif logits == "mixed":
        q[:, :4] *= 40
    rng = np.random.default_rng(1)
    kwargs = {}
    mask = np.ones((2, q_len, k_len), bool)
    if "padding" in case:
        key_mask = np.arange(k_len)[None] < np.array([[k_len], [5]])
        kwargs["key_mask"] = key_mask
        mask &= key_mask[:, None, :]
    if case == "query_mask":
        query_mask = rng.random((2, q_len)) > 0.3
        kwargs["query_mask"] = query_mask
        mask &= query_mask[:, :, None]
    if case == "attention_mask":
        kwargs["attention_mask"] = rng.random((2, q_len, k_len)) > 0.5
        mask &= kwargs["attention_mask"]
    if case.startswith("causal"):
        kwargs["use_causal_mask"] = True
        mask &= np.tril(np.ones((q_len, k_len), bool))[None]
    expected, expected_grads = _reference(q, k, v, mask, d_out)

    def attend(q, k, v):
        return memory_efficient_attention(q, k, v, block_size=block_size, **kwargs)

    out = ops.convert_to_numpy(attend(q, k, v))
    np.testing.assert_allclose(out, expected, atol=1e-5)
    grads = input_gradients(attend, [q, k, v], d_out)
    # float32 logits 40x larger lose ~40x the absolute precision in exp().
    atol = 1e-5 if logits == "bounded" else 4e-4
    for got, want in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=atol)


def test_rows_without_keys_give_zero_output_and_zero_gradient():
    q, k, v, d_out = _inputs(2, 5, 6, 2, 2)
    key_mask = np.ones((2, 6), bool)
    key_mask[1] = False

    def attend(q, k, v):
        return memory_efficient_attention(q, k, v, key_mask=key_mask, block_size=4)

    out = ops.convert_to_numpy(attend(q, k, v))
    np.testing.assert_array_equal(out[1], 0.0)
    grads = input_gradients(attend, [q, k, v], d_out)
    for grad in grads:
        assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grads[0][1], 0.0)
    np.testing.assert_array_equal(grads[1][1], 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_are_computed_in_float32(dtype):
    q, k, v, _ = _inputs(1, 9, 9, 2, 2)
    # Large logits: exp() would overflow in float16 without the float32 softmax.
    q = q * 30
    mask = np.tril(np.ones((9, 9), bool))[None]
    expected, _ = _reference(
        *(
            np.asarray(ops.convert_to_numpy(ops.cast(ops.cast(a, dtype), "float32")))
            for a in (q, k, v)
        ),
        mask,
        np.zeros((1, 9, 2, 6), "float32"),
    )
    out = memory_efficient_attention(
        *(ops.cast(a, dtype) for a in (q, k, v)), use_causal_mask=True, block_size=4
    )
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = ops.convert_to_numpy(ops.cast(out, "float32"))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, atol=5e-2, rtol=2e-2)


def test_key_value_heads_must_divide_query_heads():
    q, k, v, _ = _inputs(1, 4, 4, 3, 2)
    with pytest.raises(ValueError, match="must divide"):
        memory_efficient_attention(q, k, v)


@pytest.mark.tf_only
def test_tf_graph_runs_one_query_block_at_a_time():
    # In TF graph mode `tf.while_loop` defaults to 10 iterations in flight,
    # each holding its own (block, block) tiles; the query loops (forward
    # and backward) must be serial for memory to stay linear in practice.
    from tests.graph_loops import while_loop_parallelism

    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(1, 16, 2, 4)).astype("float32") for _ in range(3)]
    loops = while_loop_parallelism(
        lambda q, k, v: memory_efficient_attention(q, k, v, block_size=4), arrays
    )
    # Forward and backward: one query loop and one key loop each.
    assert len(loops) >= 4, loops
    assert max(loops) <= 2, loops
    assert loops.count(1) >= 2, loops
