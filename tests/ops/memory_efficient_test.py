"""What is the blockwise kernel's own: its argument checks and its TF graph
loops. Its values, gradients, masks, rules and modifiers are the kernel
contract's (tests/ops/kernel_contract_test.py), shared with every kernel."""

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
