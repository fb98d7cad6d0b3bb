import keras
import numpy as np
import pytest

from keras_attention.ops import loops


def test_sequential_fori_loop_matches_fori_loop():
    def body(i, state):
        total, history = state
        total = total + keras.ops.cast(i, "float32") ** 2
        return total, keras.ops.slice_update(history, (i,), total[None])

    init = (keras.ops.zeros(()), keras.ops.zeros((5,)))
    expected = keras.ops.fori_loop(0, 5, body, init)
    result = loops.sequential_fori_loop(0, 5, body, init)
    for want, got in zip(expected, result, strict=True):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want)
        )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(result[1]), [0, 1, 5, 14, 30])


@pytest.mark.tf_only
def test_tf_graph_runs_one_iteration_at_a_time():
    from tests.graph_loops import while_loop_parallelism

    def fn(x):
        return loops.sequential_fori_loop(0, 3, lambda i, y: y * x, x)

    found = while_loop_parallelism(fn, [np.ones((2,), "float32")])
    assert found and set(found) == {1}, found
