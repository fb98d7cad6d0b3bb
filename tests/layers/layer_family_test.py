"""The layer families: one base each, Keras' call forms, independent weights."""

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention import layers as ka
from keras_attention.layers.machinery import kernel_selector
from keras_attention.layers.machinery.kernel_selector import Kernel
from tests.kernel_spy import spy_kernels
from tests.reference import combined_mask
from tests.reference import softmax_with_mask
from tests.testing import NOT_LAYERS
from tests.testing import PUBLIC_LAYERS
from tests.testing import random_inputs
from tests.testing import to_numpy

# --------------------------------------------------- independent initial weights
# Every public layer, built on inputs it accepts. Weights that are constant by
# design (zero biases, unit LayerNorm scales) are skipped: only random ones count.
BUILDS = {
    "AdditiveAttention": (lambda: ka.AdditiveAttention(units=6), [(2, 3, 6), (2, 5, 6)]),
    "LuongAttention": (
        lambda: ka.LuongAttention(score_mode="concat", units=6),
        [(2, 3, 6), (2, 5, 6)],
    ),
    "LowRankAttention": (lambda: ka.LowRankAttention(rank=6), [(2, 3, 6), (2, 5, 6)]),
    "AttentionPooling": (lambda: ka.AttentionPooling("additive", units=6), [(2, 5, 6)]),
    "MultiHeadAttention": (lambda: ka.MultiHeadAttention(2, 3, use_gate=True), [(2, 5, 6)]),
    "SparseAttention": (lambda: ka.SparseAttention(2, 3, block_size=2, seed=0), [(2, 8, 6)]),
    "PerformerAttention": (
        lambda: ka.PerformerAttention(2, 3, num_features=6, seed=0),
        [(2, 5, 6)],
    ),
    "LinformerAttention": (lambda: ka.LinformerAttention(2, 3, 4, 8), [(2, 8, 6)]),
    "SqueezeExcitation": (lambda: ka.SqueezeExcitation(ratio=1), [(2, 4, 4, 6)]),
    "CBAM": (lambda: ka.CBAM(ratio=1), [(2, 4, 4, 6)]),
    "PositionEmbedding": (lambda: ka.PositionEmbedding(8), [(2, 5, 6)]),
    "TransformerEncoderBlock": (lambda: ka.TransformerEncoderBlock(2, 3, 6), [(2, 5, 6)]),
    "TransformerDecoderBlock": (
        lambda: ka.TransformerDecoderBlock(2, 3, 6),
        [(2, 5, 6), (2, 4, 6)],
    ),
}
WEIGHTLESS = {"SinusoidalPositionEncoding", "RotaryEmbedding"}  # nothing to initialise


def test_every_public_layer_is_covered():
    assert set(BUILDS) | WEIGHTLESS == set(PUBLIC_LAYERS)
    assert set(PUBLIC_LAYERS) | NOT_LAYERS == set(keras_attention.layers.__all__)


def _random_weights(layer):
    weights = []
    for w in layer.weights:
        value = to_numpy(w.value) if w.dtype != "int32" else None
        if value is None or not w.trainable:
            continue
        if np.all(value == value.flat[0]):  # zeros/ones by design
            continue
        weights.append((w.path, value))
    return weights


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_freshly_built_weights_are_independent(name):
    make, shapes = BUILDS[name]
    layer = make()
    layer(*[random_inputs(s, seed=i) for i, s in enumerate(shapes)])
    weights = _random_weights(layer)
    assert weights, f"{name} has no random weights to compare"
    for i, (path_a, a) in enumerate(weights):
        for path_b, b in weights[i + 1 :]:
            flat_a, flat_b = np.sort(np.abs(a.ravel())), np.sort(np.abs(b.ravel()))
            # Equal, a reshape, or a row repeated: the same draw twice.
            same = flat_a.size == flat_b.size and np.allclose(flat_a, flat_b)
            prefix = flat_a.size != flat_b.size and (
                np.isin(np.round(a.ravel(), 6), np.round(b.ravel(), 6)).all()
                or np.isin(np.round(b.ravel(), 6), np.round(a.ravel(), 6)).all()
            )
            assert not same and not prefix, f"{path_a} repeats {path_b}"


# ------------------------------------------------------------------ one base each
def test_families_are_siblings_not_subclasses():
    score_layers = (ka.AdditiveAttention(), ka.LuongAttention(), ka.LowRankAttention(rank=2))
    multi_head = (
        ka.MultiHeadAttention(2, 4),
        ka.SparseAttention(2, 4),
        ka.PerformerAttention(2, 4),
        ka.LinformerAttention(2, 4, 2, 8),
    )
    for layer in score_layers:
        assert isinstance(layer, ka.ScoreAttention)
        assert not isinstance(layer, ka.BaseMultiHeadAttention)
    for layer in multi_head:
        assert isinstance(layer, ka.BaseMultiHeadAttention)
        assert not isinstance(layer, ka.ScoreAttention)
        assert not hasattr(layer, "score")
    for variant in multi_head[1:]:
        assert not isinstance(variant, ka.MultiHeadAttention)
        assert "memory_efficient" not in variant.get_config()
    assert "block_size" not in ka.LinformerAttention(2, 4, 2, 8).get_config()


@pytest.mark.tf_only
def test_seq2seq_translator_rejects_a_multi_head_layer():
    from keras_attention.models.seq2seq_translator import Seq2SeqTranslator

    vocabulary = ["<pad>", "<unk>", "<start>", "<end>", "a", "b"]
    with pytest.raises(ValueError, match="single-head"):
        Seq2SeqTranslator(vocabulary, vocabulary, attention=ka.MultiHeadAttention(2, 4))


def test_no_helper_module_leaks_to_the_top_level():
    exported = set(keras_attention.__all__)
    for leaked in ("cbam", "kernel_variant", "base_attention", "utils"):
        assert leaked not in exported
    namespace = {}
    exec("from keras_attention import *", namespace)
    assert "cbam" not in namespace and "MultiHeadAttention" in namespace


# ------------------------------------------------ keras.layers.Attention's list call
@pytest.mark.parametrize(
    "make", [ka.AdditiveAttention, ka.LuongAttention, lambda: ka.LowRankAttention(rank=2)]
)
def test_single_head_layers_take_the_list_call(make):
    layer = make()
    query, value, key = (
        random_inputs((2, 3, 4), 0),
        random_inputs((2, 5, 4), 1),
        random_inputs((2, 5, 4), 2),
    )
    np.testing.assert_allclose(
        to_numpy(layer([query, value])), to_numpy(layer(query, value)), atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(layer([query, value, key])), to_numpy(layer(query, value, key)), atol=1e-6
    )
    # In a functional model, Keras masks of the list's tensors apply.
    q_in, v_in = keras.Input((3,), dtype="int32"), keras.Input((5,), dtype="int32")
    embed = keras.layers.Embedding(10, 4, mask_zero=True)
    model = keras.Model([q_in, v_in], layer([embed(q_in), embed(v_in)]))
    tokens_v = np.array([[1, 2, 0, 0, 0], [3, 4, 5, 6, 7]])
    tokens_q = np.array([[1, 2, 3], [4, 5, 6]])
    expected = layer(embed(tokens_q), embed(tokens_v), value_mask=tokens_v != 0)
    np.testing.assert_allclose(to_numpy(model([tokens_q, tokens_v])), to_numpy(expected), atol=1e-6)


# ------------------------------------------------------------ which kernel ran
def _numpy_mha(layer, query, value_mask=None, causal=False):
    """Independent reference: NumPy attention over our projections' weights."""
    wq, bq, wk, bk, wv, bv, wo, bo = [to_numpy(w) for w in layer.weights]
    q = np.einsum("btf,fhd->bthd", query, wq) + bq
    k = np.einsum("btf,fhd->bthd", query, wk) + bk
    v = np.einsum("btf,fhd->bthd", query, wv) + bv
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    mask = combined_mask(q.shape[0], q.shape[1], k.shape[1], value_mask=value_mask, causal=causal)[
        :, None
    ]
    heads = np.einsum("bhqk,bkhd->bqhd", softmax_with_mask(scores, mask), v)
    return np.einsum("bthd,hdo->bto", heads, wo) + bo


@pytest.mark.parametrize("flash_attention", [True, None])
def test_fused_branch_runs_when_a_fused_kernel_exists(monkeypatch, flash_attention):
    monkeypatch.setattr(kernel_selector, "fused_kernel_available", lambda: True)
    flags = []
    ran = spy_kernels(monkeypatch, flash_flags=flags)
    layer = ka.MultiHeadAttention(
        2, 4, flash_attention=flash_attention, bias_initializer="random_normal"
    )
    query = random_inputs((2, 7, 8), seed=3)
    valid = np.arange(7)[None, :] < np.array([[7], [3]])
    for kwargs in (dict(), dict(value_mask=valid, use_causal_mask=True)):
        out = layer(query, **kwargs)
        np.testing.assert_allclose(
            to_numpy(out),
            _numpy_mha(
                layer, query, kwargs.get("value_mask"), kwargs.get("use_causal_mask", False)
            ),
            atol=1e-5,
        )
    assert ran == [Kernel.FUSED] * 2
    assert flags == [True if flash_attention else None] * 2


def test_flash_attention_true_without_a_fused_kernel_runs_the_blockwise_kernel(monkeypatch):
    monkeypatch.setattr(kernel_selector, "fused_kernel_available", lambda: False)
    ran = spy_kernels(monkeypatch)
    layer = ka.MultiHeadAttention(
        2, 4, flash_attention=True, block_size=3, bias_initializer="random_normal"
    )
    query = random_inputs((2, 7, 8), seed=4)
    np.testing.assert_allclose(to_numpy(layer(query)), _numpy_mha(layer, query), atol=1e-5)
    assert ran == [Kernel.BLOCKWISE]


def test_flash_attention_false_materialises_the_weights(monkeypatch):
    monkeypatch.setattr(kernel_selector, "fused_kernel_available", lambda: True)
    flags = []
    ran = spy_kernels(monkeypatch, flash_flags=flags)
    layer = ka.MultiHeadAttention(
        2, 4, flash_attention=False, memory_efficient_threshold=1, bias_initializer="random_normal"
    )
    query = random_inputs((2, 7, 8), seed=5)
    np.testing.assert_allclose(to_numpy(layer(query)), _numpy_mha(layer, query), atol=1e-5)
    # As Keras: the backend's composite kernel, never the flash one.
    assert ran == [Kernel.COMPOSITE] and flags == [False]
    _, weights = layer(query, return_attention_scores=True)  # weights: our softmax
    assert ran == [Kernel.COMPOSITE, Kernel.DENSE] and tuple(weights.shape) == (2, 2, 7, 7)
    with pytest.raises(ValueError, match="contradicts"):
        ka.MultiHeadAttention(2, 4, flash_attention=False, memory_efficient=True)


# ------------------------------------------------------------ scores on demand
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_selected_scores_match_the_dense_weights_while_the_blockwise_kernel_runs(
    monkeypatch, grouped
):
    ran = spy_kernels(monkeypatch)
    options = dict(num_key_value_heads=2 if grouped else None)
    layer = ka.MultiHeadAttention(4, 4, memory_efficient=True, block_size=4, **options)
    dense = ka.MultiHeadAttention(4, 4, memory_efficient=False, **options)
    query = random_inputs((2, 11, 8), seed=6)
    valid = np.arange(11)[None, :] < np.array([[11], [6]])
    layer.build(query.shape)
    dense.build(query.shape)
    dense.set_weights(layer.get_weights())
    for kwargs in (dict(), dict(value_mask=valid, use_causal_mask=True)):
        full_out, full = dense(query, return_attention_scores=True, **kwargs)
        out, part = layer(
            query,
            return_attention_scores=True,
            attention_scores_heads=[3, 1],
            attention_scores_query_range=(2, 9),
            **kwargs,
        )
        np.testing.assert_allclose(to_numpy(out), to_numpy(full_out), atol=1e-5)
        np.testing.assert_allclose(to_numpy(part), to_numpy(full)[:, [3, 1], 2:9], atol=1e-5)
    # The output never came from a materialised kernel: the selection is
    # computed after the blockwise one.
    assert ran.count(Kernel.BLOCKWISE) == 2 and ran.count(Kernel.DENSE) == 2
    symbolic = layer(
        keras.Input((11, 8)),
        return_attention_scores=True,
        attention_scores_heads=0,
        attention_scores_query_range=(0, 4),
    )
    assert tuple(symbolic[1].shape) == (None, 1, 4, 11)


def test_bad_score_selections_are_named():
    layer = ka.MultiHeadAttention(2, 4)
    query = random_inputs((1, 5, 8))
    with pytest.raises(ValueError, match=r"attention_scores_heads.*\[0, 2\).*\[2\]"):
        layer(query, return_attention_scores=True, attention_scores_heads=[2])
    with pytest.raises(ValueError, match=r"attention_scores_heads='a'"):
        layer(query, return_attention_scores=True, attention_scores_heads="a")
    with pytest.raises(ValueError, match=r"attention_scores_query_range.*\(3, 9\)"):
        layer(query, return_attention_scores=True, attention_scores_query_range=(3, 9))
    with pytest.raises(ValueError, match="return_attention_scores=True"):
        layer(query, attention_scores_heads=[0])
    with pytest.raises(ValueError, match="Returning attention scores is not supported"):
        ka.MultiHeadAttention(2, 4, flash_attention=True)(query, return_attention_scores=True)


# ------------------------------------------------------------ masks Keras accepts
def test_keras_mask_shapes_give_the_same_outputs():
    layer = ka.MultiHeadAttention(2, 4)
    query = random_inputs((2, 5, 8), seed=8)
    allowed = np.random.default_rng(0).random((2, 5, 5)) > 0.3
    allowed[..., 0] = True
    reference = to_numpy(layer(query, attention_mask=allowed))
    per_head = np.broadcast_to(allowed[:, None], (2, 2, 5, 5))
    np.testing.assert_allclose(
        to_numpy(layer(query, attention_mask=per_head)), reference, atol=1e-6
    )
    np.testing.assert_allclose(
        to_numpy(layer(query, attention_mask=allowed.astype("float32"))), reference, atol=1e-6
    )
    keys = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_allclose(
        to_numpy(layer(query, attention_mask=keys[:, None, :])),
        to_numpy(layer(query, value_mask=keys)),
        atol=1e-6,
    )
    causal = np.tril(np.ones((5, 5), bool))
    np.testing.assert_allclose(
        to_numpy(layer(query, attention_mask=causal)),
        to_numpy(layer(query, use_causal_mask=True)),
        atol=1e-6,
    )


@pytest.mark.tf_only
def test_tensorflow_graphs_run_the_composite_kernel_and_xla_runs_ours(monkeypatch):
    # Graph mode: Keras' composite kernel (its memory); under XLA our
    # normalise-last kernel (SHIFTED), one exp pass instead of XLA's softmax fusions.
    import tensorflow as tf

    ran = spy_kernels(monkeypatch)
    layer = ka.MultiHeadAttention(2, 4, bias_initializer="random_normal")
    query = tf.constant(random_inputs((2, 7, 8), seed=9))
    layer(query)  # builds
    ran.clear()
    graph = tf.function(lambda x: layer(x))(query)
    assert ran == [Kernel.COMPOSITE]
    compiled = tf.function(lambda x: layer(x), jit_compile=True)(query)
    assert ran == [Kernel.COMPOSITE, Kernel.SHIFTED]
    expected = _numpy_mha(layer, query.numpy())
    np.testing.assert_allclose(to_numpy(graph), expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(compiled), expected, atol=1e-5)
