import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import PerformerAttention
from keras_attention.layers import TransformerDecoderBlock
from tests import transformer_reference as reference
from tests.testing import assert_config_covers_init
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test


def make_block(**kwargs):
    defaults = dict(num_heads=2, key_dim=4, intermediate_dim=12, bias_initializer="random_normal")
    return TransformerDecoderBlock(**{**defaults, **kwargs})


def numpy_list(values):
    return [ops.convert_to_numpy(v) for v in values]


@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_numpy_forward_pass_with_the_block_weights(norm_first):
    block = make_block(norm_first=norm_first)
    target, source = random_inputs((2, 4, 8), seed=1), random_inputs((2, 6, 10), seed=2)
    target_padding = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
    source_padding = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    outputs, self_scores, cross_scores = numpy_list(
        block(
            target,
            source,
            decoder_padding_mask=target_padding,
            encoder_padding_mask=source_padding,
            return_attention_scores=True,
        )
    )
    expected, expected_self, expected_cross = reference.decoder_block(
        block, target, source, target_padding, source_padding
    )
    assert self_scores.shape == (2, 2, 4, 4) and cross_scores.shape == (2, 2, 4, 6)
    np.testing.assert_allclose(self_scores, expected_self, atol=1e-5)
    np.testing.assert_allclose(cross_scores, expected_cross, atol=1e-5)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)
    # Causal: no weight on later steps.
    assert np.all(self_scores[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cross_attention_logits_are_the_scores_before_softmax(norm_first):
    block = make_block(
        norm_first=norm_first,
        attention=MultiHeadAttention(num_heads=2, key_dim=4, num_key_value_heads=1),
    )
    target, source = random_inputs((2, 4, 8), seed=1), random_inputs((2, 6, 10), seed=2)
    source_padding = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    outputs, _, cross_scores, cross_logits = numpy_list(
        block(
            target,
            source,
            encoder_padding_mask=source_padding,
            return_attention_scores=True,
            return_cross_attention_logits=True,
        )
    )
    expected_logits = []
    expected, _, expected_cross = reference.decoder_block(
        block, target, source, None, source_padding, cross_logits_out=expected_logits
    )
    assert cross_logits.shape == (2, 2, 4, 6)
    np.testing.assert_allclose(cross_logits, expected_logits[0], atol=1e-5)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)
    # Their softmax over the unmasked encoder positions is the cross-attention.
    masked = np.where(source_padding[:, None, None], cross_logits, -np.inf)
    softmax = np.exp(masked - masked.max(-1, keepdims=True))
    np.testing.assert_allclose(softmax / softmax.sum(-1, keepdims=True), cross_scores, atol=1e-5)
    # A cached decoding step returns the same row, before its cache.
    cache = block.initial_self_attention_cache(batch_size=2, max_length=4)
    _, _, _, step_logits, _ = block(
        target[:, :1],
        self_attention_cache=cache,
        cache_update_index=0,
        cross_attention_cache=block.precompute_cross_attention_cache(source),
        encoder_padding_mask=source_padding,
        return_attention_scores=True,
        return_cross_attention_logits=True,
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(step_logits)[:, :, 0], cross_logits[:, :, 0], atol=1e-5
    )


def test_cross_attention_logits_need_a_dot_product_cross_attention():
    block = make_block()
    with pytest.raises(
        ValueError, match="return_cross_attention_logits=True.*cross_attention=None"
    ):
        block(random_inputs((1, 3, 8)), return_cross_attention_logits=True)


def test_decoder_only_block_without_encoder():
    block = make_block()
    target = random_inputs((2, 5, 8))
    outputs, self_scores = numpy_list(block(target, return_attention_scores=True))
    assert not block.has_cross_attention
    expected, expected_self, _ = reference.decoder_block(block, target)
    np.testing.assert_allclose(self_scores, expected_self, atol=1e-5)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)
    full = ops.convert_to_numpy(block(target, use_causal_mask=False))
    expected_full, _, _ = reference.decoder_block(block, target, causal=False)
    np.testing.assert_allclose(full, expected_full, atol=1e-5)


@pytest.mark.parametrize("cached", [False, True])
def test_packed_documents_decode_as_separate_sequences(cached):
    """Two documents packed into one row (decoder and encoder side): with
    `segment_ids`/`encoder_segment_ids` each token sees its own document only,
    so the packed row equals the float64 NumPy block run on each document
    alone; through the cache too, where the ids cover every cache slot."""
    block = make_block(attention=MultiHeadAttention(num_heads=2, key_dim=4, num_key_value_heads=1))
    lengths, source_lengths = (3, 4), (2, 5)
    target, source = random_inputs((1, 7, 8), seed=1), random_inputs((1, 7, 10), seed=2)
    ids = np.repeat([0, 1], lengths)[None].astype("int32")
    source_ids = np.repeat([0, 1], source_lengths)[None].astype("int32")
    block(target, source)  # built on the whole row
    expected = np.concatenate(
        [
            reference.decoder_block(block, target[:, a:b], source[:, c:d])[0]
            for (a, b), (c, d) in [((0, 3), (0, 2)), ((3, 7), (2, 7))]
        ],
        axis=1,
    )
    if not cached:
        got = block(target, source, segment_ids=ids, encoder_segment_ids=source_ids)
    else:
        cache = block.initial_self_attention_cache(batch_size=1, max_length=7)
        cross_cache = block.precompute_cross_attention_cache(source)
        steps = []
        for start, stop in [(0, 2), (2, 3), (3, 6), (6, 7)]:  # a prefill, then chunks
            step, cache = block(
                target[:, start:stop],
                self_attention_cache=cache,
                cache_update_index=start,
                cross_attention_cache=cross_cache,
                segment_ids=ids,
                encoder_segment_ids=source_ids,
            )
            steps.append(ops.convert_to_numpy(step))
        got = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(ops.convert_to_numpy(got), expected, atol=1e-5)


def test_packed_rules_are_checked():
    block = make_block()
    target, source = random_inputs((1, 4, 8), seed=1), random_inputs((1, 5, 10), seed=2)
    ids = np.zeros((1, 4), "int32")
    with pytest.raises(ValueError, match="`encoder_segment_ids` needs `segment_ids`"):
        block(target, source, encoder_segment_ids=np.zeros((1, 5), "int32"))
    cache = block.initial_self_attention_cache(batch_size=1, max_length=6)
    with pytest.raises(ValueError, match=r"one id per cache slot, shape \(batch, 6\)"):
        block(
            target[:, :1], source, self_attention_cache=cache, cache_update_index=0, segment_ids=ids
        )
    performer = make_block(attention=PerformerAttention(num_heads=2, key_dim=4))
    with pytest.raises(ValueError, match="`segment_ids` need a self_attention of the Multi"):
        performer(target, source, segment_ids=ids)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_step_by_step_decoding_equals_the_full_causal_call(norm_first):
    block = make_block(
        norm_first=norm_first,
        attention=MultiHeadAttention(num_heads=2, key_dim=4, num_key_value_heads=1),
    )
    length = 5
    target, source = random_inputs((2, length, 8), seed=1), random_inputs((2, 6, 8), seed=2)
    source_padding = np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], bool)
    full, full_self, full_cross = numpy_list(
        block(target, source, encoder_padding_mask=source_padding, return_attention_scores=True)
    )
    cache = block.initial_self_attention_cache(batch_size=2, max_length=length)
    assert tuple(cache.shape) == (2, 2, length, 1, 4)
    cross_cache = block.precompute_cross_attention_cache(source)
    steps = []
    for t in range(length):
        step, self_scores, cross_scores, cache = block(
            target[:, t : t + 1],
            self_attention_cache=cache,
            cache_update_index=t,
            cross_attention_cache=cross_cache,
            encoder_padding_mask=source_padding,
            return_attention_scores=True,
        )
        steps.append(ops.convert_to_numpy(step))
        np.testing.assert_allclose(
            ops.convert_to_numpy(self_scores)[:, :, 0], full_self[:, :, t], atol=1e-5
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(cross_scores)[:, :, 0], full_cross[:, :, t], atol=1e-5
        )
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.both_backends
def test_cached_decoding_runs_in_a_compiled_loop():
    block = make_block()
    length = 4
    target, source = random_inputs((1, length, 8), seed=1), random_inputs((1, 3, 8), seed=2)
    full = ops.convert_to_numpy(block(target, source))
    cross_cache = block.precompute_cross_attention_cache(source)
    target_tensor = ops.convert_to_tensor(target)

    def decode(cache, cross_cache):
        def body(t, carry):
            cache, outputs = carry
            step_input = ops.slice(target_tensor, (0, t, 0), (1, 1, 8))
            step, cache = block(
                step_input,
                self_attention_cache=cache,
                cache_update_index=t,
                cross_attention_cache=cross_cache,
            )
            outputs = ops.slice_update(outputs, (0, t, 0), step)
            return cache, outputs

        initial = (cache, ops.zeros((1, length, 8)))
        return ops.fori_loop(0, length, body, initial)[1]

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        compiled = tf.function(decode, jit_compile=True)
    else:
        import jax

        compiled = jax.jit(decode)
    cache = block.initial_self_attention_cache(1, length)
    outputs = ops.convert_to_numpy(compiled(cache, cross_cache))
    np.testing.assert_allclose(outputs, full, atol=1e-5)


def test_keras_masks_from_both_embeddings_are_used(tmp_path):
    source_ids = keras.Input((None,), dtype="int32")
    target_ids = keras.Input((None,), dtype="int32")
    source = keras.layers.Embedding(20, 8, mask_zero=True)(source_ids)
    target = keras.layers.Embedding(20, 8, mask_zero=True)(target_ids)
    outputs, self_scores, cross_scores = make_block(name="decoder")(
        target, source, return_attention_scores=True
    )
    assert tuple(self_scores.shape) == (None, 2, None, None)
    assert tuple(cross_scores.shape) == (None, 2, None, None)
    pooled = keras.layers.GlobalAveragePooling1D()(outputs)
    model = keras.Model([source_ids, target_ids], [outputs, self_scores, cross_scores, pooled])
    source_value, target_value = np.array([[3, 4, 5, 0]]), np.array([[6, 7, 0]])
    out, self_w, cross_w, pooled_value = numpy_list(model([source_value, target_value]))
    np.testing.assert_array_equal(cross_w[..., 3:], 0.0)
    np.testing.assert_array_equal(self_w[..., 2:], 0.0)
    np.testing.assert_allclose(pooled_value[0], out[0, :2].mean(0), atol=1e-5)

    path = os.path.join(str(tmp_path), "decoder.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.get_layer("decoder").has_cross_attention
    for a, b in zip(
        numpy_list(loaded([source_value, target_value])),
        [out, self_w, cross_w, pooled_value],
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_functional_cross_attention_fits_with_xla():
    target_input, source_input = keras.Input((4, 8)), keras.Input((6, 8))
    outputs = make_block(dropout=0.1, seed=2)(target_input, source_input)
    model = keras.Model([target_input, source_input], keras.layers.Dense(3)(outputs))
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    history = model.fit(
        [random_inputs((4, 4, 8)), random_inputs((4, 6, 8))],
        random_inputs((4, 4, 3)),
        epochs=2,
        batch_size=2,
        verbose=0,
    )
    assert np.all(np.isfinite(history.history["loss"]))


def test_layer_contract_and_separate_cross_attention_prototype(tmp_path):
    run_layer_contract_test(
        lambda **kwargs: make_block(dropout=0.1, seed=3, **kwargs),
        tmp_path,
        cross_attention=False,
    )
    block = make_block(cross_attention=MultiHeadAttention(num_heads=2, key_dim=4, use_bias=False))
    assert_config_covers_init(block)
    block(random_inputs((1, 3, 8)), random_inputs((1, 2, 8)))
    assert block.self_attention.use_bias and not block.cross_attention.use_bias
    clone = TransformerDecoderBlock.from_config(block.get_config())
    clone(random_inputs((1, 3, 8)), random_inputs((1, 2, 8)))
    assert not clone.cross_attention.use_bias


def test_mixed_precision_cross_attention():
    block = make_block(dtype="mixed_float16")
    outputs, self_scores, cross_scores = block(
        random_inputs((2, 3, 8)), random_inputs((2, 4, 8)), return_attention_scores=True
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == "float16"
    cache = block.initial_self_attention_cache(2, 3)
    assert keras.backend.standardize_dtype(cache.dtype) == "float16"
    sums = ops.convert_to_numpy(ops.sum(ops.cast(cross_scores, "float32"), -1))
    np.testing.assert_allclose(sums, 1.0, atol=1e-2)


def test_rejects_inconsistent_decoding_arguments():
    block = make_block(name="dec")
    target, source = random_inputs((1, 3, 8)), random_inputs((1, 4, 8))
    with pytest.raises(ValueError, match="precompute_cross_attention_cache.*built=False"):
        block.precompute_cross_attention_cache(source)
    block(target, source)
    cache = block.initial_self_attention_cache(1, 3)
    cross_cache = block.precompute_cross_attention_cache(source)
    with pytest.raises(ValueError, match=r"'dec'.*with cross-attention.*encoder_outputs=None"):
        block(target)
    with pytest.raises(ValueError, match="not both"):
        block(target, source, cross_attention_cache=cross_cache)
    with pytest.raises(ValueError, match=r"go together.*cache_update_index=None"):
        block(target[:, :1], self_attention_cache=cache, cross_attention_cache=cross_cache)
    with pytest.raises(ValueError, match=r"go together.*cache_update_index=0"):
        block(target[:, :1], source, cache_update_index=0)
    with pytest.raises(ValueError, match=r"`encoder_padding_mask` must have shape.*\(1, 5\)"):
        block(target, source, encoder_padding_mask=np.ones((1, 5), bool))
    with pytest.raises(ValueError, match=r"`decoder_padding_mask` must have shape.*\(1, 2\)"):
        block(target, source, decoder_padding_mask=np.ones((1, 2), bool))
    with pytest.raises(ValueError, match=r"`decoder_attention_mask` must have shape.*\(1, 1, 1\)"):
        block(
            target[:, :1],
            self_attention_cache=cache,
            cache_update_index=0,
            cross_attention_cache=cross_cache,
            decoder_attention_mask=np.ones((1, 1, 1), bool),
        )
    with pytest.raises(ValueError, match="cache_update_index"):
        block(
            target[:, :1],
            self_attention_cache=cache,
            cache_update_index=3,
            cross_attention_cache=cross_cache,
        )
    decoder_only = make_block()
    decoder_only(target)
    with pytest.raises(ValueError, match="without cross-attention"):
        decoder_only(target, source)
    with pytest.raises(ValueError, match="`encoder_padding_mask` needs"):
        decoder_only(target, encoder_padding_mask=np.ones((1, 4), bool))
    with pytest.raises(ValueError, match=r"prototype has num_heads=3"):
        make_block(cross_attention=MultiHeadAttention(num_heads=3, key_dim=4))
