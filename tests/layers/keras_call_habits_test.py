"""Keras' call habits work on our drop-ins (issue 39).

- NumPy-scalar call flags: Keras turns a NumPy scalar given to a layer into
  a tensor before `call`, so `use_causal_mask=np.bool_(True)` arrives as an
  eager 0-d tensor; it counts as the Python value it holds, as on Keras' own
  layers. Strings and tensors whose value is unknown (a trace) stay refused.
- Keras' positional mask, `layer([q, v], [qm, vm])` (`keras.layers.
  Attention.call(inputs, mask=None)`), works on the single-head drop-ins.
"""

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention import validation

QUERY = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
VALUE = np.random.default_rng(1).normal(size=(2, 5, 4)).astype("float32")
QUERY_MASK = np.array([[True, True, False], [True, True, True]])
VALUE_MASK = np.array([[True, False, True, True, False], [True, True, True, True, True]])

SINGLE_HEAD = {
    "LuongAttention": lambda: ka.LuongAttention(),
    "AdditiveAttention": lambda: ka.AdditiveAttention(),
    "LowRankAttention": lambda: ka.LowRankAttention(rank=2),
}


# (flag, the Python value it holds); Keras' own tests pass `use_causal_mask=0`.
FLAGS = [(np.bool_(True), True), (np.int64(1), True), (np.bool_(False), False), (np.int32(0), 0)]


@pytest.mark.parametrize("name", sorted(SINGLE_HEAD))
def test_numpy_scalar_flags_are_their_python_values(name):
    layer = SINGLE_HEAD[name]()
    for flag, python in FLAGS:
        expected = layer([QUERY, QUERY], use_causal_mask=python)
        np.testing.assert_allclose(layer([QUERY, QUERY], use_causal_mask=flag), expected)
    assert not isinstance(layer([QUERY, QUERY], return_attention_scores=np.bool_(False)), tuple)
    output, scores = layer([QUERY, QUERY], return_attention_scores=np.bool_(True))
    assert tuple(scores.shape) == (2, 3, 3)


def test_numpy_scalar_flags_on_multi_head_attention():
    layer = ka.MultiHeadAttention(2, 2)
    expected = layer(QUERY, QUERY, use_causal_mask=True)
    np.testing.assert_allclose(layer(QUERY, QUERY, use_causal_mask=np.bool_(True)), expected)
    output = layer(QUERY, QUERY, return_attention_scores=np.bool_(False))
    assert not isinstance(output, tuple)
    output, scores = layer(QUERY, QUERY, return_attention_scores=np.bool_(True))
    assert tuple(scores.shape) == (2, 2, 3, 3)


def test_other_flags_stay_refused_naming_the_argument():
    layer = ka.LuongAttention()
    # (A NumPy string scalar fails in Keras' own conversion on JAX, before any layer.)
    for flag in ["yes", np.array([True]), 2, None]:
        with pytest.raises(TypeError, match="`use_causal_mask` must be True or False. Received"):
            layer([QUERY, QUERY], use_causal_mask=flag)


@pytest.mark.both_backends
def test_a_flag_whose_value_is_unknown_while_tracing_is_refused():
    """An eager 0-d tensor is read; a traced one has no value yet."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        @tf.function(input_signature=[tf.TensorSpec((), tf.bool)])
        def check(flag):
            return validation.validate_call_flag("Layer.call", "use_causal_mask", flag)

        traced = check
    else:
        import jax

        traced = jax.jit(lambda flag: validation.validate_call_flag("Layer.call", "f", flag))
    with pytest.raises(TypeError, match="must be True or False"):
        traced(np.bool_(True))
    assert validation.validate_call_flag("Layer.call", "f", keras.ops.convert_to_tensor(True))


@pytest.mark.parametrize("name", sorted(SINGLE_HEAD))
def test_positional_mask_list_is_keras_attention_mask(name):
    layer = SINGLE_HEAD[name]()
    keyword = layer([QUERY, VALUE], mask=[QUERY_MASK, VALUE_MASK])
    positional = layer([QUERY, VALUE], [QUERY_MASK, VALUE_MASK])
    np.testing.assert_allclose(positional, keyword, rtol=1e-6, atol=1e-6)
    # The mask acts: without it the outputs differ.
    assert not np.allclose(layer([QUERY, VALUE]), positional)


def test_positional_mask_in_a_functional_model():
    query, value = keras.Input((3, 4)), keras.Input((5, 4))
    query_mask = keras.Input((3,), dtype="bool")
    value_mask = keras.Input((5,), dtype="bool")
    output = ka.AdditiveAttention()([query, value], [query_mask, value_mask])
    model = keras.Model([query, value, query_mask, value_mask], output)
    layer = model.layers[-1]
    expected = layer([QUERY, VALUE], mask=[QUERY_MASK, VALUE_MASK])
    np.testing.assert_allclose(
        model([QUERY, VALUE, QUERY_MASK, VALUE_MASK]), expected, rtol=1e-6, atol=1e-6
    )


def test_keras_attention_positional_mask_matches():
    """The call a `keras.layers.Attention` user writes gives Keras' answer."""
    ours = ka.LuongAttention()
    theirs = keras.layers.Attention()
    np.testing.assert_allclose(
        ours([QUERY, VALUE], [QUERY_MASK, VALUE_MASK]),
        theirs([QUERY, VALUE], [QUERY_MASK, VALUE_MASK]),
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_tensor_where_the_mask_list_goes_names_mask():
    with pytest.raises(ValueError, match=r"mask=\[query_mask, value_mask\].*Received"):
        ka.LuongAttention()([QUERY, VALUE], VALUE)


def test_the_mask_list_given_twice_is_refused():
    with pytest.raises(ValueError, match="given twice.*Received: both"):
        ka.LuongAttention()([QUERY, VALUE], [QUERY_MASK, VALUE_MASK], mask=[None, None])


def test_a_subclass_call_with_its_own_arguments_reaches_ours_through_super():
    # A subclass's `call` with another signature calls ours by keyword: our
    # call binds to its own signature, not the subclass's.
    class Scaled(ka.MultiHeadAttention):
        def call(self, query, value=None, key=None, scale=1.0, **kwargs):
            return super().call(query, value, key, **kwargs) * scale

    layer = Scaled(2, 4)
    x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype("float32")
    ours = ka.MultiHeadAttention(2, 4)
    ours(x, x)
    layer(x, x)
    layer.set_weights(ours.get_weights())
    expected = np.asarray(ours(x, x, use_causal_mask=True)) * 2.0
    got = np.asarray(layer(x, x, scale=2.0, use_causal_mask=True))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
