"""What is the blockwise kernel's own: its argument checks and its TF graph
loops. Its values, gradients, masks, rules and modifiers are the kernel
contract's (tests/ops/kernel_contract_test.py), shared with every kernel."""

import keras
import numpy as np
import pytest

from keras_attention.ops.memory_efficient import memory_efficient_attention


def _inputs(batch, q_len, k_len, heads, kv_heads, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_len, heads, 8)).astype("float32")
    k = rng.standard_normal((batch, k_len, kv_heads, 8)).astype("float32")
    v = rng.standard_normal((batch, k_len, kv_heads, 6)).astype("float32")
    d_out = rng.standard_normal((batch, q_len, heads, 6)).astype("float32")
    return q, k, v, d_out


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


def _causal_attention_gradients(q, k, v, d_out):
    """float64 NumPy: `(dq, dk, dv)` of `sum(softmax(q k^T / sqrt(D)) v * d_out)`, causal."""
    q, k, v, d_out = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k, v, d_out))
    scale = 1.0 / np.sqrt(q.shape[-1])
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    rows, cols = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
    logits = np.where(cols <= rows, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    d_probs = np.einsum("bhqd,bhkd->bhqk", d_out, v)
    d_logits = probs * (d_probs - (d_probs * probs).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bhkd->bhqd", d_logits, k) * scale
    dk = np.einsum("bhqk,bhqd->bhkd", d_logits, q) * scale
    dv = np.einsum("bhqk,bhqd->bhkd", probs, d_out)
    return tuple(g.transpose(0, 2, 1, 3) for g in (dq, dk, dv))


def test_the_gradient_of_a_jitted_call_is_exact_on_jax():
    # `jax.grad(jax.jit(f))` transforms the kernel after tracing it; its
    # custom gradient once closed over tensors of that trace (the plan,
    # the positions) and failed with "No constant handler" (ring attention's
    # `shard_map` body transforms it the same way).
    if keras.backend.backend() != "jax":
        pytest.skip("jax.grad of jax.jit: a JAX transformation order")
    import jax

    from keras_attention.ops.attention_mask import AttentionMask

    q, k, v, _ = _inputs(1, 12, 12, 2, 2)
    d_out = np.random.default_rng(1).standard_normal((1, 12, 2, 8)).astype("float32")
    v = np.random.default_rng(2).standard_normal((1, 12, 2, 8)).astype("float32")

    def loss(q, k, v):
        out = memory_efficient_attention(q, k, v, mask=AttentionMask(causal=True), block_size=4)
        return (out * d_out).sum()

    got = jax.grad(jax.jit(loss), argnums=(0, 1, 2))(q, k, v)
    for mine, want in zip(got, _causal_attention_gradients(q, k, v, d_out), strict=True):
        np.testing.assert_allclose(np.asarray(mine), want, atol=2e-5)
