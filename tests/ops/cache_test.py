import keras
import numpy as np
import pytest

from keras_attention.ops.cache import update_cache


def _expected(cache, update, index):
    index = min(max(index, 0), cache.shape[2] - update.shape[2])
    out = cache.copy()
    out[:, :, index : index + update.shape[2]] = update
    return out


@pytest.mark.parametrize("index,steps", [(0, 1), (3, 1), (2, 3), (5, 1), (9, 2)])
def test_update_writes_the_new_steps_and_clamps_like_slice_update(index, steps):
    rng = np.random.default_rng(index)
    cache = rng.standard_normal((2, 2, 6, 3, 4)).astype("float32")
    update = rng.standard_normal((2, 2, steps, 3, 4)).astype("float32")
    result = keras.ops.convert_to_numpy(update_cache(cache, update, index))
    np.testing.assert_array_equal(result, _expected(cache, update, index))


def _graph_ops(jit_compile):
    import tensorflow as tf

    @tf.function(jit_compile=jit_compile, autograph=False)
    def write(cache, update, index):
        return update_cache(cache, update, index)

    graph = write.get_concrete_function(
        tf.TensorSpec([None, 2, 6, 3, 4]),
        tf.TensorSpec([None, 2, 1, 3, 4]),
        tf.TensorSpec([], tf.int32),
    ).graph
    return {op.type for op in graph.get_operations()}, write


@pytest.mark.tf_only
def test_tf_graph_writes_with_core_ops_and_jit_keeps_xla():
    import tensorflow as tf

    ops, write = _graph_ops(jit_compile=False)
    assert "TensorScatterUpdate" in ops
    assert not any(op.startswith("Xla") for op in ops), ops
    xla_ops, xla_write = _graph_ops(jit_compile=True)
    assert "XlaDynamicUpdateSlice" in xla_ops
    cache = np.zeros((2, 2, 6, 3, 4), "float32")
    update = np.ones((2, 2, 1, 3, 4), "float32")
    for function in (write, xla_write):
        np.testing.assert_array_equal(
            function(cache, update, tf.constant(4)).numpy(),
            _expected(cache, update, 4),
        )
