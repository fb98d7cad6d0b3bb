"""Every public layer built inside another layer's `call` (#41).

The most common way Keras users write a Transformer block is a
`keras.layers.Layer` whose `call` runs the attention. Keras infers such a
wrapper's output by tracing its `call` on symbolic inputs: on JAX with
symbolic dimensions (`jax.export` shape polymorphism), where a comparison of
the unknown batch in Python raises. Our own tests call the layers directly or
on `keras.Input` (where `compute_output_spec` answers), so this file is the
only one that traces them the wrapper's way. Each case builds a functional
model with an unknown batch (and, where the layer allows it, an unknown
length), runs it on data and compares with the layer called directly.
"""

import keras
import numpy as np
import pytest

import keras_attention as ka
from keras_attention.layers.machinery import kernel_selector
from tests.kernel_spy import spy_kernels
from tests.testing import NOT_LAYERS
from tests.testing import to_numpy

# A wrapper whose `call` cannot be traced is only a UserWarning from Keras
# ("looks like it has unbuilt state"): here it is the failure under test.
pytestmark = pytest.mark.filterwarnings("error:.*unbuilt state:UserWarning")


class Wrapper(keras.layers.Layer):
    """A user's block: runs `inner` with `call_fn` inside its own `call`."""

    def __init__(self, inner, call_fn, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner
        self.call_fn = call_fn

    def call(self, inputs):
        return self.call_fn(self.inner, *inputs)


def _self(layer, x):
    return layer(x, x)


def _pair(layer, q, v):
    return layer([q, v])


def _one(layer, x):
    return layer(x)


def _mha(**kwargs):
    return lambda: ka.MultiHeadAttention(2, 4, **kwargs)


# name: (factory, call_fn, input shapes without batch, whether the length may be None)
CASES = {
    "additive": (lambda: ka.AdditiveAttention(units=6), _pair, [(3, 6), (5, 6)], True),
    "luong_dot": (lambda: ka.LuongAttention(), _pair, [(3, 6), (5, 6)], True),
    "luong_general": (
        lambda: ka.LuongAttention(score_mode="general"),
        _pair,
        [(3, 6), (5, 6)],
        True,
    ),
    "luong_concat": (
        lambda: ka.LuongAttention(score_mode="concat", units=6),
        _pair,
        [(3, 6), (5, 6)],
        True,
    ),
    "low_rank": (lambda: ka.LowRankAttention(rank=4), _pair, [(3, 6), (5, 6)], True),
    "pooling": (lambda: ka.AttentionPooling("additive", units=6), _one, [(5, 6)], True),
    "mha": (_mha(), _self, [(6, 8)], True),
    "mha_budget": (_mha(memory_budget=1, block_size=4), _self, [(6, 8)], True),
    "mha_memory_efficient": (_mha(memory_efficient=True, block_size=4), _self, [(6, 8)], True),
    "mha_threshold": (_mha(memory_efficient_threshold=4, block_size=4), _self, [(6, 8)], True),
    "mha_sliding_window": (_mha(sliding_window=2), _self, [(6, 8)], True),
    "mha_gqa": (lambda: ka.MultiHeadAttention(4, 4, num_key_value_heads=2), _self, [(6, 8)], True),
    "mha_gate_axes": (_mha(use_gate=True, attention_axes=(1, 2)), _self, [(2, 3, 8)], False),
    "mha_scores": (
        _mha(),
        lambda layer, x: layer(x, x, return_attention_scores=True),
        [(6, 8)],
        True,
    ),
    "mha_scores_on_demand": (
        _mha(memory_efficient=True, block_size=4),
        lambda layer, x: layer(
            x,
            x,
            return_attention_scores=True,
            attention_scores_heads=[1],
            attention_scores_query_range=(1, 3),
        ),
        [(6, 8)],
        False,
    ),
    "mha_cache": (
        _mha(),
        lambda layer, x, cache: layer(x, cache=cache, cache_update_index=2),
        [(1, 8), (2, 6, 2, 4)],
        False,
    ),
    "sparse": (lambda: ka.SparseAttention(2, 4, block_size=2, seed=0), _self, [(8, 8)], False),
    "sparse_exact": (lambda: ka.SparseAttention(2, 4, block_size=4, seed=0), _self, [(8, 8)], True),
    "performer": (
        lambda: ka.PerformerAttention(2, 4, num_features=6, seed=0),
        _self,
        [(6, 8)],
        True,
    ),
    "performer_causal": (
        lambda: ka.PerformerAttention(2, 4, num_features=6, seed=0),
        lambda layer, x: layer(x, use_causal_mask=True),
        [(6, 8)],
        True,
    ),
    "linformer": (lambda: ka.LinformerAttention(2, 4, 4, 8), _self, [(8, 8)], False),
    "squeeze_excitation": (lambda: ka.SqueezeExcitation(ratio=1), _one, [(4, 4, 6)], False),
    "cbam": (lambda: ka.CBAM(ratio=1), _one, [(4, 4, 6)], False),
    "position_embedding": (lambda: ka.PositionEmbedding(8), _one, [(5, 6)], False),
    "sinusoidal": (lambda: ka.SinusoidalPositionEncoding(), _one, [(5, 6)], True),
    "rotary": (lambda: ka.RotaryEmbedding(max_wavelength=100.0), _one, [(5, 6)], True),
    "encoder_block": (lambda: ka.TransformerEncoderBlock(2, 4, 8), _one, [(6, 8)], True),
    "decoder_block": (
        lambda: ka.TransformerDecoderBlock(2, 4, 8),
        lambda layer, x, encoded: layer(x, encoded),
        [(5, 8), (6, 8)],
        True,
    ),
}


def _build_and_compare(factory, call_fn, shapes, unknown_length):
    layer = factory()
    shapes = [(None,) + s[1:] if unknown_length and len(s) == 2 else s for s in shapes]
    inputs = [keras.Input(shape) for shape in shapes]
    outputs = Wrapper(layer, call_fn)(inputs)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(0)
    concrete = [s if s[0] is not None else (5,) + s[1:] for s in shapes]
    data = [rng.normal(size=(3,) + s).astype("float32") for s in concrete]
    got = keras.tree.flatten(model(data))
    expected = keras.tree.flatten(call_fn(layer, *data))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-5, atol=1e-6)
    return model


def test_every_public_layer_is_wrapped():
    covered = {type(f()).__name__ for f, *_ in CASES.values()}
    assert covered | NOT_LAYERS == set(ka.layers.__all__)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_builds_inside_a_wrapper_with_an_unknown_batch(name):
    factory, call_fn, shapes, unknown_length = CASES[name]
    _build_and_compare(factory, call_fn, shapes, unknown_length=False)
    if unknown_length:
        _build_and_compare(factory, call_fn, shapes, unknown_length=True)


def test_the_selector_treats_a_symbolic_dimension_as_unknown(monkeypatch):
    """The issue's reproducer: the memory-aware rule multiplies the batch into
    the working set; with the batch symbolic it must not compare in Python,
    and the traced call still runs the kernel the table gives an unknown batch."""
    ran = spy_kernels(monkeypatch)
    _build_and_compare(_mha(memory_budget=1, block_size=4), _self, [(6, 8)], False)
    assert kernel_selector.Kernel.BLOCKWISE in ran


def test_keras_text_classification_transformer_trains_one_epoch():
    """keras.io's "Text classification with Transformer", our layer swapped in,
    on a small synthetic dataset of the same shapes."""
    maxlen, vocab, embed_dim = 20, 50, 8

    class TransformerBlock(keras.layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
            super().__init__()
            self.att = ka.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = keras.Sequential(
                [keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)]
            )
            self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = keras.layers.Dropout(rate)
            self.dropout2 = keras.layers.Dropout(rate)

        def call(self, inputs, training=None):
            attn_output = self.att(inputs, inputs)
            attn_output = self.dropout1(attn_output, training=training)
            out1 = self.layernorm1(inputs + attn_output)
            ffn_output = self.dropout2(self.ffn(out1), training=training)
            return self.layernorm2(out1 + ffn_output)

    class TokenAndPositionEmbedding(keras.layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim):
            super().__init__()
            self.token_emb = keras.layers.Embedding(vocab_size, embed_dim)
            self.pos_emb = keras.layers.Embedding(maxlen, embed_dim)

        def call(self, x):
            positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
            return self.token_emb(x) + self.pos_emb(positions)

    inputs = keras.layers.Input(shape=(maxlen,))
    x = TokenAndPositionEmbedding(maxlen, vocab, embed_dim)(inputs)
    x = TransformerBlock(embed_dim, 2, 16)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    assert model.output_shape == (None, 2)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, vocab, size=(32, maxlen))
    y_train = (x_train[:, 0] < vocab // 2).astype("int32")
    history = model.fit(x_train, y_train, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
