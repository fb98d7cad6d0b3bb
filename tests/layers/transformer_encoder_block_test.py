import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import TransformerEncoderBlock
from keras_attention.layers import capture_attention
from tests import transformer_reference as reference
from tests.testing import assert_config_covers_init
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test


@keras.saving.register_keras_serializable(package="keras_attention_tests")
class GroupedAttentionForTests(MultiHeadAttention):
    """A MultiHeadAttention subclass, standing in for the other variants."""


def make_block(**kwargs):
    defaults = dict(num_heads=2, key_dim=4, intermediate_dim=12, bias_initializer="random_normal")
    return TransformerEncoderBlock(**{**defaults, **kwargs})


@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_numpy_forward_pass_with_the_block_weights(norm_first):
    block = make_block(norm_first=norm_first, layer_norm_epsilon=1e-3)
    inputs = random_inputs((2, 5, 8))
    padding = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    outputs, scores = block(inputs, padding_mask=padding, return_attention_scores=True)
    expected, expected_scores = reference.encoder_block(block, inputs, padding)
    assert tuple(scores.shape) == (2, 2, 5, 5)
    np.testing.assert_allclose(ops.convert_to_numpy(scores), expected_scores, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(outputs), expected, atol=1e-5)
    # Without scores (the memory-efficient path may be chosen) the output agrees.
    np.testing.assert_allclose(
        ops.convert_to_numpy(block(inputs, padding_mask=padding)), expected, atol=1e-5
    )


def test_keras_mask_from_embedding_is_used_and_propagated():
    tokens = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(20, 8, mask_zero=True)
    x = embedding(tokens)
    x, first_scores = make_block(name="first")(x, return_attention_scores=True)
    x, second_scores = make_block(name="second")(x, return_attention_scores=True)
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, [x, first_scores, second_scores, pooled])

    ids = np.array([[4, 7, 2, 0, 0]])
    outputs, first, second, pooled_value = [ops.convert_to_numpy(t) for t in model(ids)]
    # Padded keys get no weight in either block: the mask reached both.
    np.testing.assert_array_equal(first[..., 3:], 0.0)
    np.testing.assert_array_equal(second[..., 3:], 0.0)
    # The mask leaves the second block too: pooling averages real steps only.
    np.testing.assert_allclose(pooled_value[0], outputs[0, :3].mean(0), atol=1e-5)
    # Real positions do not depend on what the padding id embeds to.
    table = ops.convert_to_numpy(embedding.embeddings).copy()
    table[0] = 100.0
    embedding.embeddings.assign(table)
    changed = ops.convert_to_numpy(model(ids)[0])
    np.testing.assert_allclose(changed[0, :3], outputs[0, :3], atol=1e-5)


def test_attention_mask_combines_with_padding():
    block = make_block()
    inputs = random_inputs((1, 4, 8))
    allowed = np.tril(np.ones((1, 4, 4), bool))
    padding = np.array([[1, 1, 1, 0]], bool)
    _, scores = block(
        inputs, padding_mask=padding, attention_mask=allowed, return_attention_scores=True
    )
    scores = ops.convert_to_numpy(scores)
    np.testing.assert_array_equal(
        scores[..., ~(allowed[0] & padding[0][None] & padding[0][:, None])], 0.0
    )
    np.testing.assert_allclose(scores[0, :, :3].sum(-1), 1.0, atol=1e-6)


def test_attention_prototype_gives_class_and_config_not_weights(tmp_path):
    prototype = GroupedAttentionForTests(num_heads=2, key_dim=4, num_key_value_heads=1)
    prototype.build((None, 3, 8))
    block = make_block(attention=prototype)
    inputs = random_inputs((2, 3, 8))
    block(inputs)
    assert type(block.self_attention) is GroupedAttentionForTests
    assert block.self_attention.num_key_value_heads == 1
    assert block.self_attention is not prototype
    assert tuple(block.self_attention.key_dense.kernel.shape) == (8, 1, 4)
    expected, _ = reference.encoder_block(block, inputs)
    np.testing.assert_allclose(ops.convert_to_numpy(block(inputs)), expected, atol=1e-5)

    config = block.get_config()
    assert config["attention"]["class_name"] == "GroupedAttentionForTests"
    clone = TransformerEncoderBlock.from_config(config)
    clone(inputs)
    assert type(clone.self_attention) is GroupedAttentionForTests
    assert clone.self_attention.num_key_value_heads == 1

    model = keras.Sequential([keras.Input((3, 8)), make_block(attention=prototype)])
    path = os.path.join(str(tmp_path), "grouped.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert type(loaded.layers[0].self_attention) is GroupedAttentionForTests
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(inputs)), ops.convert_to_numpy(model(inputs)), atol=0
    )


def test_attention_given_as_serialized_dict():
    prototype = MultiHeadAttention(num_heads=2, key_dim=4, use_bias=False)
    block = make_block(attention=keras.saving.serialize_keras_object(prototype))
    block(random_inputs((1, 3, 8)))
    assert block.self_attention.use_bias is False


def test_layer_contract(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: make_block(dropout=0.1, seed=3, **kwargs),
        tmp_path,
        cross_attention=False,
    )
    assert_config_covers_init(make_block())


def test_mixed_precision_scores_stay_normalized():
    block = make_block(dtype="mixed_bfloat16")
    outputs, scores = block(random_inputs((2, 5, 8)), return_attention_scores=True)
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    assert block.self_attention.compute_dtype == "bfloat16"
    assert block.feedforward_output_dense.compute_dtype == "bfloat16"
    sums = ops.convert_to_numpy(ops.sum(ops.cast(scores, "float32"), -1))
    np.testing.assert_allclose(sums, 1.0, atol=1e-2)


def test_dropout_is_active_only_in_training():
    block = make_block(dropout=0.5, seed=1)
    inputs = random_inputs((2, 5, 8))
    inference = ops.convert_to_numpy(block(inputs, training=False))
    again = ops.convert_to_numpy(block(inputs))
    trained = ops.convert_to_numpy(block(inputs, training=True))
    np.testing.assert_array_equal(inference, again)
    assert not np.allclose(inference, trained)
    expected, _ = reference.encoder_block(block, inputs)
    np.testing.assert_allclose(inference, expected, atol=1e-5)


def test_capture_attention_sees_the_nested_attention():
    model = keras.Sequential([keras.Input((4, 8)), make_block(name="encoder")])
    with capture_attention(model) as captured:
        model(random_inputs((1, 4, 8)))
    assert list(captured.scores) == ["sequential/encoder/self_attention"]
    assert captured["self_attention"][0].shape == (1, 2, 4, 4)


def test_rejects_bad_constructor_arguments():
    with pytest.raises(ValueError, match="intermediate_dim=0"):
        make_block(intermediate_dim=0)
    with pytest.raises(ValueError, match="num_heads=-1"):
        make_block(num_heads=-1)
    with pytest.raises(ValueError, match="dropout=1.0"):
        make_block(dropout=1.0)
    with pytest.raises(TypeError, match="norm_first='yes'"):
        make_block(norm_first="yes")
    with pytest.raises(ValueError, match="layer_norm_epsilon=0"):
        make_block(layer_norm_epsilon=0)
    with pytest.raises(TypeError, match="`attention` must be"):
        make_block(attention=keras.layers.MultiHeadAttention(num_heads=2, key_dim=4))
    with pytest.raises(
        ValueError, match=r"prototype has num_heads=4 but the block has num_heads=2"
    ):
        make_block(attention=MultiHeadAttention(num_heads=4, key_dim=4))
    with pytest.raises(ValueError, match=r"prototype has key_dim=8"):
        make_block(attention=MultiHeadAttention(num_heads=2, key_dim=8))


def test_rejects_bad_call_inputs():
    block = make_block(name="enc")
    with pytest.raises(ValueError, match=r"'enc'.*`inputs` must have rank 3.*\(4, 8\)"):
        block(np.zeros((4, 8), "float32"))
    inputs = random_inputs((2, 4, 8))
    with pytest.raises(ValueError, match=r"`padding_mask` must have shape.*\(2, 5\)"):
        block(inputs, padding_mask=np.ones((2, 5), bool))
    with pytest.raises(TypeError, match="`padding_mask` must be a boolean"):
        block(inputs, padding_mask=np.ones((2, 4), "float32"))
    with pytest.raises(ValueError, match=r"`attention_mask` must have shape.*\(2, 4\)"):
        block(inputs, attention_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="output_shape"):
        make_block(attention=MultiHeadAttention(num_heads=2, key_dim=4, output_shape=6))(inputs)


def test_packed_documents_equal_each_document_alone_and_prototypes_carry_modifiers():
    """#36: `segment_ids` reach the self-attention, so each packed document's
    tokens get what the block gives that document alone; a prototype's score
    modifiers (here Gemma 2's soft cap) come with the block's attention."""
    block = make_block(attention=MultiHeadAttention(2, 4, logit_soft_cap=5.0))
    inputs = random_inputs((1, 9, 8))
    documents = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1]], "int32")
    packed = ops.convert_to_numpy(block(inputs, segment_ids=documents))
    first = ops.convert_to_numpy(block(inputs[:, :4]))
    second = ops.convert_to_numpy(block(inputs[:, 4:]))
    np.testing.assert_allclose(packed, np.concatenate([first, second], axis=1), atol=1e-5)
    assert not np.allclose(packed, ops.convert_to_numpy(block(inputs)), atol=1e-3)
    assert block.self_attention.logit_soft_cap == 5.0
    rebuilt = TransformerEncoderBlock.from_config(block.get_config())
    rebuilt.build((1, 9, 8))
    assert rebuilt.self_attention.logit_soft_cap == 5.0
