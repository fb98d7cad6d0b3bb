"""`MultiHeadAttention.kernel_for` checks what it is asked, as a call would (issue 39).

A shape a call refuses (rank 2, a negative or fractional size) got an
answer; `None` or a string a raw TypeError / IndexError.
"""

import numpy as np
import pytest

import keras_attention as ka


@pytest.fixture(scope="module")
def layer():
    return ka.MultiHeadAttention(2, 8, name="mha")


def test_valid_shapes_get_an_answer(layer):
    kernel = layer.kernel_for((1, 512, 16))
    assert layer.kernel_for((None, 512, 16)) is not None
    assert layer.kernel_for([np.int64(1), 512, 16]) == kernel
    assert layer.kernel_for((1, 4, 16), (1, 6, 16), training=True) is not None
    assert layer.kernel_for((1, 4, 16), return_attention_scores=np.bool_(True)) is not None


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        # The pins.
        ({"query_shape": (1, 512)}, ValueError, r"`query_shape` must have rank >= 3"),
        ({"query_shape": (1, -5, 16)}, ValueError, r"`query_shape` must hold non-negative"),
        ({"query_shape": (1.5, 512, 16)}, ValueError, r"`query_shape` must hold non-negative"),
        ({"query_shape": None}, TypeError, r"`query_shape` must be a shape"),
        ({"query_shape": "1, 512, 16"}, TypeError, r"`query_shape` must be a shape"),
        ({"query_shape": (1, 4, 16), "key_shape": "k"}, TypeError, r"`key_shape` must be a"),
        ({"query_shape": (1, 4, 16), "key_shape": (1, 4)}, ValueError, r"`key_shape` must have"),
        (
            {"query_shape": (1, 4, 16), "key_shape": (1, 2, 4, 16)},
            ValueError,
            r"`query_shape` and `key_shape` must have the same rank",
        ),
        ({"query_shape": (True, 4, 16)}, ValueError, r"`query_shape` must hold"),
        ({"query_shape": (1, 4, 16), "training": "yes"}, TypeError, r"`training` must be"),
        (
            {"query_shape": (1, 4, 16), "return_attention_scores": 2},
            TypeError,
            r"`return_attention_scores` must be",
        ),
    ],
)
def test_bad_questions_are_refused_naming_kernel_for_and_the_argument(
    layer, kwargs, error, pattern
):
    with pytest.raises(error, match=rf"MultiHeadAttention\.kernel_for \(layer 'mha'\): {pattern}"):
        layer.kernel_for(**kwargs)
