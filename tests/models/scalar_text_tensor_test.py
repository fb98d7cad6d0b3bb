"""A scalar string tensor is one text, as a Python string is (issue 39).

`translate(tf.constant("5/3/19"))` crashed with `'bytes' object has no
attribute 'tolist'`: a scalar tensor's `numpy()` is bytes, not an array.
"""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only


def test_texts_as_tensors_and_arrays_are_read_like_python_strings():
    import tensorflow as tf

    from keras_attention.models import text_processing

    def read(texts):
        return text_processing.as_string_array(texts).tolist()

    assert read(tf.constant("5/3/19")) == read("5/3/19") == [b"5/3/19"]
    assert read(tf.constant(["a", "b"])) == read(np.array(["a", "b"])) == [b"a", b"b"]
    assert read(np.array("x")) == [b"x"]
    with pytest.raises(TypeError, match=r"`texts` must be strings\. Received"):
        read(tf.constant([["a"]]))


def test_translate_takes_a_scalar_string_tensor():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    import tensorflow as tf

    from keras_attention.models import Seq2SeqTranslator

    translator = Seq2SeqTranslator.from_texts(
        ["5/3/19", "1/2/20"],
        ["2019-03-05", "2020-02-01"],
        max_source_length=8,
        max_target_length=4,
        embedding_dim=4,
        units=4,
        seed=0,
    )
    (from_tensor,) = translator.translate(tf.constant("5/3/19"), max_length=3)
    (from_string,) = translator.translate("5/3/19", max_length=3)
    assert from_tensor.tokens == from_string.tokens
    np.testing.assert_array_equal(from_tensor.alignment, from_string.alignment)
