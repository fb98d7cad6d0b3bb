import keras
import numpy as np
import pytest
from keras import ops

import keras_attention
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import capture_attention
from keras_attention.layers import multi_head_attention as mha_module
from keras_attention.layers.machinery import kernel_selector
from keras_attention.layers.machinery.kernel_selector import Kernel
from tests.gradients import layer_gradients
from tests.kernel_spy import spy_kernels
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test
from tests.testing import to_numpy


def _keras_and_ours(num_heads=2, key_dim=4, query_features=8, value_features=6, **kwargs):
    """A built Keras MHA and ours with the same weights (via from_keras)."""
    reference = keras.layers.MultiHeadAttention(num_heads, key_dim, **kwargs)
    reference.build((None, None, query_features), (None, None, value_features))
    return reference, MultiHeadAttention.from_keras(reference)


def _padding_mask(batch, length, valid):
    return np.arange(length)[None, :] < np.asarray(valid)[:, None]


# ------------------------------------------------------------ against Keras
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
@pytest.mark.parametrize("masks", ["none", "padding", "attention", "causal"])
def test_outputs_and_scores_match_keras_with_same_weights(cross, masks):
    query = random_inputs((2, 6, 8), seed=1)
    value = random_inputs((2, 9, 6), seed=2) if cross else None
    reference, ours = _keras_and_ours(value_features=6 if cross else 8)
    key_length = 9 if cross else 6
    kwargs = {}
    if masks == "padding":
        kwargs["value_mask"] = _padding_mask(2, key_length, [key_length, 3])
    elif masks == "attention":
        allowed = np.random.default_rng(3).random((2, 6, key_length)) > 0.4
        allowed[:, :, 0] = True  # no fully masked row: Keras makes those uniform
        kwargs["attention_mask"] = allowed
    elif masks == "causal":
        kwargs["use_causal_mask"] = True
    args = (query, value) if cross else (query, query)
    ref_out, ref_scores = reference(*args, return_attention_scores=True, **kwargs)
    our_args = (query, value) if cross else (query,)
    out, scores = ours(*our_args, return_attention_scores=True, **kwargs)
    np.testing.assert_allclose(to_numpy(out), to_numpy(ref_out), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(ref_scores), atol=1e-5, rtol=1e-5)
    if masks in ("padding", "causal"):
        # The memory-efficient kernel gives the same outputs.
        fast = MultiHeadAttention.from_keras(reference, memory_efficient=True, block_size=4)
        np.testing.assert_allclose(
            to_numpy(fast(*our_args, **kwargs)), to_numpy(ref_out), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize(
    "options",
    [
        dict(use_gate=True),
        dict(output_shape=(3, 2)),
        dict(value_dim=5, use_bias=False),
    ],
    ids=["gate", "output_shape", "value_dim_no_bias"],
)
def test_from_keras_copies_configuration_and_weights(options):
    reference, ours = _keras_and_ours(**options)
    assert ours.num_heads == 2 and ours.key_dim == 4

    # Keras' sublayer names and order (query, key, gate, value, output).
    def sublayer_paths(layer):
        return [(w.path.split("/", 1)[1], tuple(w.shape)) for w in layer.weights]

    assert sublayer_paths(ours) == sublayer_paths(reference)
    query = random_inputs((2, 5, 8), seed=4)
    value = random_inputs((2, 7, 6), seed=5)
    # Scores requested: Keras' fused path rejects value_dim != key_dim on JAX.
    expected, _ = reference(query, value, return_attention_scores=True)
    np.testing.assert_allclose(
        to_numpy(ours(query, value)), to_numpy(expected), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("use_gate", [False, True], ids=["plain", "gated"])
def test_keras_weights_file_and_set_weights_give_identical_outputs(tmp_path, use_gate):
    # A user switching from Keras: same config, Keras' checkpoint, same outputs.
    query = random_inputs((2, 5, 8), seed=4)
    value = random_inputs((2, 7, 6), seed=5)

    def model_of(layer):
        q, v = keras.Input((5, 8)), keras.Input((7, 6))
        return keras.Model([q, v], layer(q, v))

    reference = keras.layers.MultiHeadAttention(2, 4, use_gate=use_gate, name="mha")
    keras_model = model_of(reference)
    path = str(tmp_path / "keras.weights.h5")
    keras_model.save_weights(path)
    expected = to_numpy(keras_model([query, value]))

    ours = MultiHeadAttention.from_config(reference.get_config())
    our_model = model_of(ours)
    our_model.load_weights(path)
    np.testing.assert_allclose(to_numpy(our_model([query, value])), expected, atol=1e-5)
    ours_again = MultiHeadAttention(2, 4, use_gate=use_gate)
    model_of(ours_again).set_weights(keras_model.get_weights())
    np.testing.assert_allclose(to_numpy(ours_again(query, value)), expected, atol=1e-5)


def test_from_keras_takes_group_query_attention():
    reference = keras.layers.GroupQueryAttention(
        head_dim=4, num_query_heads=4, num_key_value_heads=2, use_gate=True
    )
    query, value = random_inputs((2, 5, 8), seed=6), random_inputs((2, 7, 8), seed=7)
    expected = to_numpy(reference(query, value))
    ours = MultiHeadAttention.from_keras(reference)
    assert (ours.num_heads, ours.num_key_value_heads, ours.key_dim) == (4, 2, 4)
    np.testing.assert_allclose(to_numpy(ours(query, value)), expected, atol=1e-5)


def test_keras_positional_order_and_extras_keyword_only():
    layer = MultiHeadAttention(2, 4, 8, 0.1, False, 6, 2, 3, False)
    assert (layer.value_dim, layer.dropout, layer.use_bias) == (8, 0.1, False)
    assert layer._output_shape == (6,) and layer.attention_axes == (2,)
    assert layer.sliding_window == 3 and layer.flash_attention is False
    with pytest.raises(TypeError):
        MultiHeadAttention(
            2,
            4,
            None,
            0.0,
            True,
            None,
            None,
            None,
            None,
            "glorot_uniform",
            "zeros",
            None,
            None,
            None,
            None,
            None,
            False,
            None,
            2,
        )  # num_key_value_heads is keyword-only


def test_from_keras_rejects_other_layers_and_unbuilt_layers():
    with pytest.raises(TypeError, match="keras.layers.MultiHeadAttention"):
        MultiHeadAttention.from_keras(keras.layers.Dense(3))
    with pytest.raises(ValueError, match="built"):
        MultiHeadAttention.from_keras(keras.layers.MultiHeadAttention(2, 4))


def test_grouped_query_matches_keras_group_query_attention():
    reference = keras.layers.GroupQueryAttention(
        head_dim=4, num_query_heads=4, num_key_value_heads=2
    )
    query = random_inputs((2, 5, 8), seed=6)
    value = random_inputs((2, 7, 6), seed=7)
    ref_out, ref_scores = reference(query, value, return_attention_scores=True)
    ours = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2)
    ours.build(query.shape, value.shape)
    for mine, theirs in [
        (ours.query_dense, reference._query_dense),
        (ours.key_dense, reference._key_dense),
        (ours.value_dense, reference._value_dense),
        (ours.output_dense, reference._output_dense),
    ]:
        mine.set_weights(theirs.get_weights())
    out, scores = ours(query, value, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(out), to_numpy(ref_out), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(ref_scores), atol=1e-5, rtol=1e-5)
    fast = MultiHeadAttention(
        num_heads=4,
        key_dim=4,
        num_key_value_heads=2,
        memory_efficient=True,
        block_size=3,
    )
    fast.build(query.shape, value.shape)
    fast.set_weights(ours.get_weights())
    np.testing.assert_allclose(to_numpy(fast(query, value)), to_numpy(ref_out), atol=1e-5)


# ---------------------------------------------------------- shapes and masks
def test_scores_have_cross_attention_symbolic_shape():
    query = keras.Input((5, 8))
    value = keras.Input((7, 6))
    out, scores = MultiHeadAttention(num_heads=3, key_dim=4)(
        query, value, return_attention_scores=True
    )
    assert tuple(out.shape) == (None, 5, 8)
    assert tuple(scores.shape) == (None, 3, 5, 7)
    model = keras.Model([query, value], [out, scores])
    eager_out, eager_scores = model([random_inputs((2, 5, 8)), random_inputs((2, 7, 6))])
    assert tuple(eager_scores.shape) == (2, 3, 5, 7)


def test_masked_query_rows_are_zero_and_other_rows_match_keras():
    reference, ours = _keras_and_ours(value_features=8)
    query = random_inputs((2, 6, 8), seed=8)
    query_mask = _padding_mask(2, 6, [6, 4])
    out = to_numpy(ours(query, query_mask=query_mask))
    ref = to_numpy(reference(query, query, query_mask=query_mask, value_mask=query_mask))
    np.testing.assert_array_equal(out[1, 4:], 0.0)
    np.testing.assert_allclose(out[query_mask], ref[query_mask], atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_fully_masked_rows_give_zeros_not_nan(dtype, memory_efficient):
    layer = MultiHeadAttention(
        num_heads=2,
        key_dim=4,
        dtype=dtype,
        use_bias=False,
        memory_efficient=memory_efficient,
        block_size=2,
    )
    query = random_inputs((2, 5, 8), seed=9)
    value_mask = _padding_mask(2, 5, [5, 0])  # second sequence: no key at all
    attention_mask = np.ones((2, 5, 5), bool)
    attention_mask[0, 2] = False  # one fully masked row in the first sequence
    out = to_numpy(layer(query, value_mask=value_mask, attention_mask=attention_mask))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0, 2], 0.0)
    assert np.any(out[0, 0] != 0.0)


def test_keras_mask_propagates_and_masks_keys():
    tokens = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]])
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    embedded = embedding(tokens)
    out = layer(embedded)
    np.testing.assert_array_equal(to_numpy(out._keras_mask), tokens != 0)
    explicit = layer(ops.convert_to_tensor(to_numpy(embedded)), query_mask=tokens != 0)
    np.testing.assert_allclose(to_numpy(out), to_numpy(explicit), atol=1e-6)
    inputs = keras.Input((5,), dtype="int32")
    model_out = MultiHeadAttention(num_heads=2, key_dim=4)(
        keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    )
    pooled = keras.layers.GlobalAveragePooling1D()(model_out)
    assert tuple(keras.Model(inputs, pooled)(tokens).shape) == (2, 8)


def test_dropout_is_seeded_and_only_active_in_training():
    query = random_inputs((2, 6, 8), seed=10)
    first = MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5, seed=7)
    second = MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5, seed=7)
    first.build(query.shape)
    second.build(query.shape)
    second.set_weights(first.get_weights())
    inference = to_numpy(first(query))
    np.testing.assert_allclose(to_numpy(first(query, training=False)), inference)
    trained = to_numpy(first(query, training=True))
    assert not np.allclose(trained, inference)
    np.testing.assert_allclose(to_numpy(second(query, training=True)), trained, atol=1e-6)


def test_dropout_runs_inside_the_blockwise_kernel_with_a_new_seed_per_call(monkeypatch):
    """Training with dropout on the blockwise kernel (#50): it runs (spied),
    its output is the float64 reference with the keep mask of the seed the
    layer drew (`ops.dropout_keep_mask`), each call draws another seed, a
    layer with the same seed draws the same ones."""
    from keras_attention.layers import multi_head_attention as mha_module
    from keras_attention.ops import dropout_keep_mask
    from tests.attention_reference import reference
    from tests.kernel_spy import spy_kernels

    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 7, 6)).astype("float32")
    options = dict(num_heads=4, key_dim=3, num_key_value_heads=2, dropout=0.3, seed=11)
    layers = [MultiHeadAttention(**options, memory_efficient=True, block_size=3) for _ in "ab"]
    for layer in layers:
        layer.build(x.shape, x.shape)
    layers[0].set_weights([rng.normal(scale=0.6, size=w.shape) for w in layers[0].get_weights()])
    layers[1].set_weights(layers[0].get_weights())
    weights = {w.path.split("/", 1)[1]: to_numpy(w.value) for w in layers[0].weights}
    ran = spy_kernels(monkeypatch)
    seeds = []
    kernel = mha_module.memory_efficient_attention

    def recording(*args, **kwargs):
        seeds.append(kwargs["dropout_seed"])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(mha_module, "memory_efficient_attention", recording)
    first, second = (to_numpy(layers[0](x, training=True)) for _ in range(2))
    again = to_numpy(layers[1](x, training=True))
    seeds = [int(to_numpy(seed)) for seed in seeds]
    assert ran == [Kernel.BLOCKWISE] * 3 and seeds[0] != seeds[1] and seeds[2] == seeds[0]
    allowed = np.ones((2, 4, 7, 7), bool)
    for got, seed in ((first, seeds[0]), (second, seeds[1])):
        dropped = to_numpy(dropout_keep_mask(seed, 2, 4, 7, 7, 0.3)) / 0.7
        expected, _ = reference(weights, x, x, allowed, 4, 2, False, dropped=dropped)
        np.testing.assert_allclose(got, expected, atol=2e-5)
    np.testing.assert_array_equal(again, first)
    inference, _ = reference(weights, x, x, allowed, 4, 2, False)
    assert not np.allclose(first, inference, atol=1e-2)


# ------------------------------------------------------- memory-efficient path
@pytest.mark.parametrize(
    "case",
    ["plain", "padding", "causal", "causal_padding_grouped"],
)
def test_memory_efficient_path_matches_exact_values_and_gradients(case):
    query = random_inputs((2, 11, 8), seed=11)
    kwargs = {}
    heads = dict(num_heads=4, key_dim=4)
    if case in ("padding", "causal_padding_grouped"):
        kwargs["value_mask"] = _padding_mask(2, 11, [11, 6])
        kwargs["query_mask"] = _padding_mask(2, 11, [11, 6])
    if case.startswith("causal"):
        kwargs["use_causal_mask"] = True
    if case.endswith("grouped"):
        heads["num_key_value_heads"] = 2
    exact = MultiHeadAttention(**heads, memory_efficient=False)
    fast = MultiHeadAttention(**heads, memory_efficient=True, block_size=4)
    exact.build(query.shape)
    fast.build(query.shape)
    fast.set_weights(exact.get_weights())
    cotangent = random_inputs((2, 11, 8), seed=12)
    out_a, din_a, dw_a = layer_gradients(exact, [query], cotangent, **kwargs)
    out_b, din_b, dw_b = layer_gradients(fast, [query], cotangent, **kwargs)
    np.testing.assert_allclose(out_b, out_a, atol=1e-5)
    for a, b in zip(din_a + dw_a, din_b + dw_b, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)


@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_fused_kernel_path_matches_exact_path(monkeypatch, grouped):
    # The fused path runs on GPU only; force it to check its masking on CPU.
    monkeypatch.setattr(kernel_selector, "fused_kernel_available", lambda: True)
    ran = spy_kernels(monkeypatch)
    heads = dict(num_heads=4, key_dim=4, num_key_value_heads=2 if grouped else None)
    exact = MultiHeadAttention(**heads, memory_efficient=False)
    fused = MultiHeadAttention(**heads)
    query = random_inputs((2, 7, 8), seed=19)
    exact.build(query.shape)
    fused.build(query.shape)
    fused.set_weights(exact.get_weights())
    value_mask = _padding_mask(2, 7, [7, 3])
    value_mask[1] = False  # no key at all: zeros, not the fused kernel's mean
    for kwargs in (dict(), dict(value_mask=value_mask, use_causal_mask=True)):
        # The reference asks for weights, so it runs our own softmax path.
        ran.clear()
        reference, _ = exact(query, return_attention_scores=True, **kwargs)
        assert ran == [Kernel.DENSE]
        output = fused(query, **kwargs)
        assert ran == [Kernel.DENSE, Kernel.FUSED]
        np.testing.assert_allclose(to_numpy(output), to_numpy(reference), atol=1e-5)


def _spy_memory_efficient(monkeypatch):
    calls = []
    original = mha_module.memory_efficient_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(mha_module, "memory_efficient_attention", spy)
    return calls


def test_auto_switches_to_memory_efficient_only_for_long_keys(monkeypatch):
    calls = _spy_memory_efficient(monkeypatch)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, memory_efficient_threshold=8)
    layer(random_inputs((1, 7, 8)))
    assert not calls
    layer(random_inputs((1, 8, 8)))
    assert len(calls) == 1
    # Weights requested or captured: the exact kernel runs and records them.
    _, scores = layer(random_inputs((1, 8, 8)), return_attention_scores=True)
    assert len(calls) == 1 and tuple(scores.shape) == (1, 2, 8, 8)
    with capture_attention(layer) as captured:
        layer(random_inputs((1, 9, 8)))
    assert len(calls) == 1
    assert captured.scores[layer.name][0].shape == (1, 2, 9, 9)
    never = MultiHeadAttention(
        num_heads=2, key_dim=4, memory_efficient=False, memory_efficient_threshold=1
    )
    never(random_inputs((1, 9, 8)))
    assert len(calls) == 1
    # The default decides by the memory budget, not by a length.
    assert MultiHeadAttention(2, 4).memory_efficient_threshold is None


def test_memory_efficient_path_trains_in_fit_with_jit_compile():
    query = random_inputs((4, 10, 8), seed=13)
    target = random_inputs((4, 10, 8), seed=14)

    def make(memory_efficient):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((10, 8)),
                MultiHeadAttention(
                    num_heads=2,
                    key_dim=4,
                    memory_efficient=memory_efficient,
                    block_size=3,
                ),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
        return model

    exact, fast = make(False), make(True)
    fast.set_weights(exact.get_weights())
    exact.fit(query, target, epochs=2, batch_size=2, verbose=0, shuffle=False)
    history = fast.fit(query, target, epochs=2, batch_size=2, verbose=0, shuffle=False)
    assert np.all(np.isfinite(history.history["loss"]))
    for a, b in zip(exact.get_weights(), fast.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)


# ------------------------------------------------------------------- caching
def _decode_with_cache(layer, sequence, compiled, slots=None, pair=False):
    """Feeds `sequence` one step at a time through a self-attention cache (of
    `slots` slots; one per token by default), one tensor or, with `pair`, a
    `(keys, values)` pair that each step must return as a pair."""
    batch, length, _ = sequence.shape
    cache = ops.zeros((batch, 2, slots or length, layer.num_key_value_heads, layer.key_dim))
    if pair:
        cache = (cache[:, 0], cache[:, 1])
    outputs = ops.zeros((batch, length, 8))

    def step(index, state):
        cache, outputs = state
        token = ops.slice(sequence, (0, index, 0), (batch, 1, sequence.shape[-1]))
        out, cache = layer(token, cache=cache, cache_update_index=index, use_causal_mask=True)
        assert isinstance(cache, tuple) == pair  # the form given
        if compiled == "graph":  # Keras' slice_update is an XLA op on TensorFlow
            import tensorflow as tf

            rows = tf.tensor_scatter_nd_update(
                tf.transpose(outputs, (1, 0, 2)), [[index]], tf.transpose(out, (1, 0, 2))
            )
            return cache, tf.transpose(rows, (1, 0, 2))
        outputs = ops.slice_update(outputs, (0, index, 0), out)
        return cache, outputs

    def loop():
        return ops.fori_loop(0, length, step, (cache, outputs))[1]

    if not compiled:
        state = (cache, outputs)
        for index in range(length):
            state = step(index, state)
        return state[1]
    if keras.backend.backend() == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]

        @jax.jit
        def run(weights):
            def step_fn(index, state):
                cache, outputs = state
                token = jax.lax.dynamic_slice(
                    sequence, (0, index, 0), (batch, 1, sequence.shape[-1])
                )
                (out, cache), _ = layer.stateless_call(
                    weights,
                    [],
                    token,
                    cache=cache,
                    cache_update_index=index,
                    use_causal_mask=True,
                )
                assert isinstance(cache, tuple) == pair
                return cache, jax.lax.dynamic_update_slice(outputs, out, (0, index, 0))

            return jax.lax.fori_loop(0, length, step_fn, (cache, outputs))[1]

        return run(trainable)
    import tensorflow as tf

    if compiled == "graph":  # TF Serving's loop: a tf.while_loop with no XLA op
        function = tf.function(loop, jit_compile=False).get_concrete_function()
        definition = function.graph.as_graph_def()
        kinds = {node.op for node in definition.node}
        for library_function in definition.library.function:
            kinds |= {node.op for node in library_function.node_def}
        assert "While" in kinds or "StatelessWhile" in kinds
        assert not [kind for kind in kinds if kind.startswith("Xla")], kinds
        return function()
    return tf.function(loop, jit_compile=True)()


GRAPH = pytest.param(
    "graph",
    marks=pytest.mark.skipif(
        keras.backend.backend() != "tensorflow", reason="TensorFlow's graph without XLA"
    ),
)


@pytest.mark.both_backends
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_self_attention_cache_decoding_matches_full_causal_call(compiled, grouped):
    sequence = ops.convert_to_tensor(random_inputs((2, 6, 8), seed=15))
    layer = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2 if grouped else None)
    full = to_numpy(layer(sequence, use_causal_mask=True))
    decoded = to_numpy(_decode_with_cache(layer, sequence, compiled))
    np.testing.assert_allclose(decoded, full, atol=1e-5)


def _random_weights(layer, x, seed=3):
    """Builds `layer` on `x` and gives every weight (the biases too) random values."""
    layer(x[:, :1])
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(scale=0.5, size=w.shape) for w in layer.get_weights()])


@pytest.mark.both_backends
@pytest.mark.parametrize("pair", [False, True], ids=["stacked", "pair"])
@pytest.mark.parametrize("compiled", [False, True, GRAPH], ids=["eager", "xla", "graph"])
def test_a_window_cache_shorter_than_the_sequence_wraps_and_decodes_exactly(compiled, pair):
    """#51 where it meets the engine: a layer with a sliding window and sink
    tokens decodes 14 tokens through a cache of 6 slots (2 sinks + the
    window of 4): the slots wrap as a ring buffer, the keys keep their
    absolute positions (rotary, ALiBi, the window and the sinks read them)
    and every step equals the full causal call. Written by position, as
    before, the 6 slots would have lost the keys the later steps need. The
    cache as one tensor or as KerasHub's Gemma 3 `(keys, values)` pair;
    eager, compiled (XLA, `jax.jit`), and in a `tf.while_loop` with no XLA
    op (`graph`), as a SavedModel's step runs under TF Serving."""
    sequence = ops.convert_to_tensor(random_inputs((2, 14, 8), seed=16))
    layer = MultiHeadAttention(
        num_heads=4,
        key_dim=4,
        num_key_value_heads=2,
        sliding_window=4,
        sink_tokens=2,
        rotary=True,
        alibi=True,
    )
    _random_weights(layer, sequence)  # biases too: the cache holds projected keys
    full = to_numpy(layer(sequence, use_causal_mask=True))
    decoded = to_numpy(_decode_with_cache(layer, sequence, compiled, slots=6, pair=pair))
    np.testing.assert_allclose(decoded, full, atol=1e-5)


def test_a_cache_pair_is_written_in_place_as_the_stacked_cache():
    """#51: a `(keys, values)` pair written by position holds what the
    stacked cache holds, and gives the same output; symbolic calls give a
    pair of the same shapes; a pair of mismatched shapes is refused."""
    layer = MultiHeadAttention(num_heads=4, key_dim=4, num_key_value_heads=2, rotary=True)
    tokens = random_inputs((2, 3, 8), seed=19)
    _random_weights(layer, tokens)
    stacked = ops.zeros((2, 2, 5, 2, 4))
    pair = (stacked[:, 0], stacked[:, 1])
    for start, stop in ((0, 2), (2, 3)):
        want, stacked = layer(tokens[:, start:stop], cache=stacked, cache_update_index=start)
        got, pair = layer(tokens[:, start:stop], cache=pair, cache_update_index=start)
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-6)
    assert isinstance(pair, tuple)
    for part, index in zip(pair, (0, 1), strict=True):
        np.testing.assert_allclose(to_numpy(part), to_numpy(stacked)[:, index], atol=1e-6)
    symbolic = layer.compute_output_spec(
        keras.KerasTensor((2, 1, 8)), cache=pair, cache_update_index=3
    )
    assert [tuple(p.shape) for p in symbolic[1]] == [(2, 5, 2, 4)] * 2
    with pytest.raises(ValueError, match=r"a `cache` pair must be \(keys, values\) of one shape"):
        layer(tokens[:, :1], cache=(pair[0], pair[1][:, :4]), cache_update_index=0)


@pytest.mark.both_backends
def test_endless_generation_from_a_64_slot_cache():
    """StreamingLLM (#51 item 2): 10,000 tokens through 64 slots (4 sinks and
    a window of 60) in one compiled loop: every output finite and equal to
    the full causal call's, which attends over exactly the sinks and the
    window at every position."""
    sequence = ops.convert_to_tensor(random_inputs((1, 10_000, 8), seed=18))
    layer = MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=60, sink_tokens=4)
    full = to_numpy(layer(sequence, use_causal_mask=True))
    decoded = to_numpy(_decode_with_cache(layer, sequence, True, slots=64))
    assert np.all(np.isfinite(decoded))
    np.testing.assert_allclose(decoded, full, atol=1e-5)


def test_a_ring_cache_takes_chunks_of_new_tokens():
    """Chunks of 3 new tokens into 2 sinks + 6 ring slots (the window of 4
    plus the chunk, less one): the chunk's writes wrap round the ring."""
    sequence = random_inputs((1, 15, 8), seed=17)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=4, sink_tokens=2)
    _random_weights(layer, sequence)
    full = to_numpy(layer(sequence, use_causal_mask=True))
    cache = ops.zeros((1, 2, 8, 2, 4))
    outputs = []
    for index in range(0, 15, 3):
        out, cache = layer(
            sequence[:, index : index + 3],
            cache=cache,
            cache_update_index=ops.convert_to_tensor(index),
            use_causal_mask=True,
        )
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_cache_update_returns_new_cache_without_mutating_input():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    cache = np.zeros((1, 2, 4, 2, 4), "float32")
    token = random_inputs((1, 1, 8), seed=16)
    out, scores, new_cache = layer(
        token, cache=cache, cache_update_index=2, return_attention_scores=True
    )
    np.testing.assert_array_equal(cache, 0.0)
    new_cache = to_numpy(new_cache)
    np.testing.assert_allclose(new_cache[:, 0, 2], to_numpy(layer.key_dense(token))[:, 0])
    np.testing.assert_allclose(new_cache[:, 1, 2], to_numpy(layer.value_dense(token))[:, 0])
    np.testing.assert_array_equal(np.delete(new_cache, 2, axis=2), 0.0)
    assert tuple(scores.shape) == (1, 2, 1, 4)
    # Positions not yet written are never attended.
    np.testing.assert_array_equal(to_numpy(scores)[..., 3], 0.0)


def test_cross_attention_cache_matches_full_call_step_by_step():
    query = random_inputs((2, 5, 8), seed=17)
    value = random_inputs((2, 7, 6), seed=18)
    value_mask = _padding_mask(2, 7, [7, 4])
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    full, full_scores = layer(query, value, value_mask=value_mask, return_attention_scores=True)
    cache = layer.precompute_key_value(value)
    assert tuple(cache.shape) == (2, 2, 7, 2, 4)
    for t in range(5):
        out, scores, same_cache = layer(
            query[:, t : t + 1],
            cache=cache,
            value_mask=value_mask,
            return_attention_scores=True,
        )
        np.testing.assert_allclose(to_numpy(out)[:, 0], to_numpy(full)[:, t], atol=1e-5)
        np.testing.assert_allclose(
            to_numpy(scores)[:, :, 0], to_numpy(full_scores)[:, :, t], atol=1e-5
        )
    assert same_cache is cache


def test_cache_symbolic_shapes():
    token = keras.Input((1, 8), batch_size=2)
    cache = keras.Input((2, 10, 2, 4), batch_size=2)
    out, scores, new_cache = MultiHeadAttention(num_heads=2, key_dim=4)(
        token, cache=cache, cache_update_index=3, return_attention_scores=True
    )
    assert tuple(out.shape) == (2, 1, 8)
    assert tuple(scores.shape) == (2, 2, 1, 10)
    assert tuple(new_cache.shape) == (2, 2, 10, 2, 4)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=0, key_dim=4), "num_heads=0"),
        (dict(num_heads=2.5, key_dim=4), "num_heads=2.5"),
        (dict(num_heads=2, key_dim=0), "key_dim=0"),
        (dict(num_heads=2, key_dim=-3), "key_dim=-3"),
        (dict(num_heads=2, key_dim=4, value_dim=0), "value_dim=0"),
        (dict(num_heads=4, key_dim=4, num_key_value_heads=3), "num_key_value_heads=3"),
        (dict(num_heads=2, key_dim=4, memory_efficient="yes"), "memory_efficient='yes'"),
        (dict(num_heads=2, key_dim=4, block_size=0), "block_size=0"),
        (
            dict(num_heads=2, key_dim=4, memory_efficient_threshold=-1),
            "memory_efficient_threshold=-1",
        ),
        (dict(num_heads=2, key_dim=4, output_shape=(3, 0)), r"output_shape=\(3, 0\)"),
    ],
)
def test_invalid_constructor_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_key_and_value_length_mismatch_is_rejected():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(
        ValueError, match="All dimensions of `value` and `key`, except the last one, must be equal"
    ):
        layer(random_inputs((1, 3, 8)), random_inputs((1, 5, 8)), random_inputs((1, 4, 8)))


def test_bad_cache_shape_and_index_are_rejected():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    token = random_inputs((1, 1, 8))
    with pytest.raises(ValueError, match=r"Received: cache with shape \(1, 2, 5, 3, 4\)"):
        layer(token, cache=np.zeros((1, 2, 5, 3, 4), "float32"), cache_update_index=0)
    with pytest.raises(ValueError, match=r"Received: cache with shape \(1, 5, 2, 4\)"):
        layer(token, cache=np.zeros((1, 5, 2, 4), "float32"), cache_update_index=0)
    cache = np.zeros((1, 2, 5, 2, 4), "float32")
    with pytest.raises(ValueError, match="cache_update_index=5"):
        layer(token, cache=cache, cache_update_index=5)
    with pytest.raises(ValueError, match="cache_update_index=-1"):
        layer(token, cache=cache, cache_update_index=-1)
    with pytest.raises(ValueError, match="needs a `cache`"):
        layer(token, cache_update_index=0)
    with pytest.raises(ValueError, match="read-only `cache`"):
        layer(token, token, cache=cache)
    uneven = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3)
    uneven(token)
    with pytest.raises(ValueError, match="value_dim=3"):
        uneven(token, cache=cache, cache_update_index=0)


@pytest.mark.parametrize("slots", [6, 3], ids=["by-position", "ring"])
def test_cache_update_mask_leaves_the_slots_of_false_rows_as_they_were(slots):
    """Row 0 written, row 1 not: row 1's slot keeps its old entry bit for
    bit (by position, and in a window's ring after it wrapped), row 0's
    slot takes what the unmasked call writes. (That the step attends over
    the cache as written is checked against KerasHub's Gemma 3 layer in
    tests/keras_hub/family_parity_test.py.)"""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, num_key_value_heads=1, sliding_window=3)
    token = random_inputs((2, 1, 8))
    old = np.random.default_rng(0).normal(size=(2, 2, slots, 1, 4)).astype("float32")
    index = 4  # slot 4, or slot 1 of the 3-slot ring
    written = 4 % slots
    _, full = layer(token, cache=old, cache_update_index=index)
    update = np.array([[True], [False]])
    _, kept = layer(token, cache=old, cache_update_index=index, cache_update_mask=update)
    full, kept = keras.ops.convert_to_numpy(full), keras.ops.convert_to_numpy(kept)
    np.testing.assert_array_equal(kept[1], old[1])
    np.testing.assert_array_equal(kept[0], full[0])
    assert not np.array_equal(full[1, :, written], old[1, :, written])  # the write would change it


def test_cache_update_mask_is_checked():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    token = random_inputs((1, 1, 8))
    cache = np.zeros((1, 2, 5, 2, 4), "float32")
    with pytest.raises(ValueError, match=r"`cache_update_mask` needs a `cache`"):
        layer(token, cache_update_mask=np.ones((1, 1), bool))
    with pytest.raises(ValueError, match=r"pass `cache_update_index` too"):
        layer(token, cache=cache, cache_update_mask=np.ones((1, 1), bool))
    with pytest.raises(ValueError, match=r"`cache_update_mask` must have shape.*\(1, 2\)"):
        layer(token, cache=cache, cache_update_index=0, cache_update_mask=np.ones((1, 2), bool))


def _cross_without_key_positions(layer, x, y, pos, ids):
    return layer(x, y, position_ids=pos)


def _symbolic_cross_without_key_positions(layer, x, y, pos, ids):
    tokens, memory = keras.Input((4, 8)), keras.Input((3, 8))
    return layer(tokens, memory, position_ids=keras.Input((4,), dtype="int32"))


def _cached_step(layer, x, y, pos, ids):
    cache = np.zeros((1, 2, 6, 2, 4), "float32")
    return layer(x, cache=cache, cache_update_index=0, key_position_ids=pos)


def _read_only_cache(layer, x, y, pos, ids):
    cache = layer.precompute_key_value(y)
    return layer(x, cache=cache, position_ids=pos, key_position_ids=pos[:, :3])


# #49: one rule for "the keys are the queries" (one input, or the same
# tensor as query and value); otherwise the keys' ids are the caller's.
@pytest.mark.parametrize(
    "call, message",
    [
        (_cross_without_key_positions, r"`key_position_ids` are needed.*shape \(1, 4\)"),
        (_symbolic_cross_without_key_positions, r"`key_position_ids` are needed"),
        # Equal values in another array are cross-attention, for both rules.
        (
            lambda layer, x, y, p, i: layer(x, x.copy(), position_ids=p),
            "`key_position_ids` are needed",
        ),
        (
            lambda layer, x, y, p, i: layer(x, x.copy(), segment_ids=i),
            "`key_segment_ids` are needed",
        ),
        (
            lambda layer, x, y, p, i: layer(x, y, position_ids=p, key_position_ids=p),
            r"`key_position_ids` must be integers shaped.*\(1, 3\).*shape \(1, 4\)",
        ),
        (
            lambda layer, x, y, p, i: layer(x, y, key_position_ids=np.zeros((1, 3), "float32")),
            "`key_position_ids` must be integers.*dtype float32",
        ),
        (
            lambda layer, x, y, p, i: MultiHeadAttention(2, 4)(x, y, key_position_ids=p[:, :3]),
            "`key_position_ids` are the rotary embedding's.*rotary=None",
        ),
        (_cached_step, "`key_position_ids` are not taken with a `cache`.*`position_ids` rotate"),
        (_read_only_cache, "`key_position_ids` are not taken with a `cache`.*precompute_key_value"),
        (
            lambda layer, x, y, p, i: layer.precompute_key_value(y, key_position_ids=p),
            r"`key_position_ids` must be integers shaped.*\(1, 3\)",
        ),
    ],
    ids=[
        "cross_without_key_positions",
        "symbolic_cross_without_key_positions",
        "copy_is_cross_attention_for_positions",
        "copy_is_cross_attention_for_segments",
        "key_positions_of_the_wrong_length",
        "float_key_positions",
        "key_positions_without_rotary",
        "key_positions_with_a_cache_update",
        "key_positions_with_a_read_only_cache",
        "precompute_with_key_positions_of_the_wrong_length",
    ],
)
def test_key_side_ids_are_refused_by_name_when_they_cannot_apply(call, message):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, rotary=True)
    x, y = random_inputs((1, 4, 8)), random_inputs((1, 3, 8), seed=1)
    layer(x, y)  # built
    pos, ids = np.array([[0, 1, 0, 1]], "int32"), np.array([[0, 0, 1, 1]], "int32")
    # Raised in `call`: Keras' eager wrapper adds a line before our message.
    with pytest.raises(ValueError, match=f"MultiHeadAttention \\(layer '\\w+'\\): {message}"):
        call(layer, x, y, pos, ids)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: MultiHeadAttention(2, 7, rotary=True), r"int\(7 \* rotary_fraction\) = 7 is odd"),
        (
            lambda: MultiHeadAttention(2, 8, rotary={"rotary_fraction": 0.375}),
            r"int\(8 \* rotary_fraction\) = 3 is odd.*rotary_fraction=0.375",
        ),
        (
            lambda: MultiHeadAttention(2, 5, rotary=keras_attention.RotaryEmbedding()),
            r"= 5 is odd.*key_dim=5",
        ),
    ],
    ids=["key_dim_7", "fraction_0.375_of_8", "a_rotary_embedding_on_5"],
)
def test_odd_rotated_feature_counts_are_refused_at_construction(make, message):
    """#49: the features turn in pairs; an odd count was rounded down."""
    with pytest.raises(ValueError, match=f"^MultiHeadAttention: `rotary`.*{message}"):
        make()


# ------------------------------------------------------------------ contract
@pytest.mark.parametrize(
    "options",
    [
        dict(dropout=0.1, seed=3),
        dict(num_key_value_heads=1, use_gate=True, memory_efficient=True, block_size=3),
        dict(
            rotary={
                "max_wavelength": 100.0,
                "scaling": "yarn",
                "scaling_factor": 2.0,
                "original_max_length": 8,
            },
            qk_norm=True,
            query_scale=0.4,
            use_bias=("query", "key", "value"),
        ),
    ],
    ids=["dropout", "grouped_gate_memory_efficient", "rotary_qk_norm_scale_biases"],
)
def test_layer_contract(tmp_path, options):
    run_layer_contract_test(
        lambda **kwargs: MultiHeadAttention(num_heads=2, key_dim=4, **options, **kwargs),
        tmp_path,
        expected_cross_output_shape=(2, 5, 8),
    )


@pytest.mark.parametrize("argument", ["use_gate", "use_bias"])
@pytest.mark.parametrize("value", ["no", "yes", 1, None])
def test_boolean_arguments_take_bools_only(argument, value):
    with pytest.raises(TypeError, match=rf"MultiHeadAttention: `{argument}` must be True or False"):
        MultiHeadAttention(2, 4, **{argument: value})
    # NumPy bools are bools; a config written with a string fails to load
    # with our message, not Keras' "expected 2 variables".
    assert MultiHeadAttention(2, 4, **{argument: np.bool_(False)}).get_config()[argument] is False
    config = MultiHeadAttention(2, 4).get_config()
    config[argument] = value
    with pytest.raises(TypeError, match=argument):
        MultiHeadAttention.from_config(config)


def test_from_keras_takes_layers_built_on_images():
    images = random_inputs((2, 3, 4, 6), seed=21)
    keras_layer = keras.layers.MultiHeadAttention(
        2, 4, attention_axes=(1, 2), bias_initializer="random_normal"
    )
    expected, scores = keras_layer(images, images, return_attention_scores=True)
    ours = MultiHeadAttention.from_keras(keras_layer)
    got, got_scores = ours(images, images, return_attention_scores=True)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(expected), atol=1e-5
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got_scores), keras.ops.convert_to_numpy(scores), atol=1e-6
    )


@pytest.mark.parametrize("axes", [(1, 1), [2, 2, 1]])
def test_repeated_attention_axes_are_refused_by_name(axes):
    with pytest.raises(ValueError, match=r"MultiHeadAttention: `attention_axes` must not repeat"):
        MultiHeadAttention(2, 4, attention_axes=axes)


def test_attention_axes_naming_one_axis_two_ways_are_refused_at_build():
    layer = MultiHeadAttention(2, 4, attention_axes=(1, -2))
    with pytest.raises(ValueError, match=r"names one axis twice.*attention_axes=\(1, -2\)"):
        layer(random_inputs((1, 3, 8)))
    with pytest.raises(ValueError, match=r"attention_axes.*rank 3.*attention_axes=\(2,\)"):
        MultiHeadAttention(2, 4, attention_axes=2)(random_inputs((1, 3, 8)))


def test_numpy_scalars_select_heads_and_rows():
    layer = MultiHeadAttention(4, 2, bias_initializer="random_normal")
    x = random_inputs((1, 6, 8), seed=22)
    _, full = layer(x, return_attention_scores=True)
    _, part = layer(
        x,
        return_attention_scores=True,
        attention_scores_heads=np.int64(2),
        attention_scores_query_range=(np.int64(1), np.int64(4)),
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(part), keras.ops.convert_to_numpy(full)[:, 2:3, 1:4], atol=1e-6
    )


def test_attention_mask_given_as_a_list_is_named():
    layer = MultiHeadAttention(2, 4)
    with pytest.raises(TypeError, match=r"`attention_mask` must be a boolean tensor.*np.asarray"):
        layer(random_inputs((1, 2, 8)), attention_mask=[[True, False], [True, True]])


@pytest.mark.both_backends
def test_one_tile_plan_per_batch_serves_every_layer_and_new_packings_do_not_retrace(
    monkeypatch,
):
    """#50: a model builds `ops.tile_plan` once per batch and passes it to
    every layer (forward and backward); no kernel builds its own (counted in
    the trace), and 10 batches packed differently trace the compiled step
    once (`tf.function` / `jax.jit`). The result is the layers' own. (The
    4-layer count is benchmarks/tile_plan.py's.)"""
    from keras_attention.ops import tiling

    builds = []
    build = tiling.build
    monkeypatch.setattr(tiling, "build", lambda *a, **k: builds.append(1) or build(*a, **k))
    layers = [MultiHeadAttention(2, 4, memory_efficient=True, block_size=4) for _ in range(2)]
    traces = []

    def forward(x, ids, planned):
        plan = None
        if planned:
            mask = keras_attention.ops.AttentionMask(
                causal=True, query_segment_ids=ids, key_segment_ids=ids
            )
            plan = keras_attention.ops.tile_plan(mask, 16, block_size=4)
        for layer in layers:
            x = x + layer(x, x, use_causal_mask=True, segment_ids=ids, tile_plan=plan)
        return x

    def step(x, ids):
        traces.append(1)
        if keras.backend.backend() == "jax":
            import jax

            def loss(x):
                out = forward(x, ids, True)
                return ops.sum(out**2), out

            (_, out), grad = jax.value_and_grad(loss, has_aux=True)(x)
            return out, grad
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(x)
            out = forward(x, ids, True)
            loss = tf.reduce_sum(out**2)
        return out, tape.gradient(loss, x)

    if keras.backend.backend() == "jax":
        import jax

        compiled = jax.jit(step)
    else:
        import tensorflow as tf

        compiled = tf.function(step)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 16, 8)).astype("float32")
    for layer in layers:
        layer(x, x)  # built outside the compiled step
    for batch in range(10):
        ids = np.sort(rng.integers(0, 8, size=(2, 16)), axis=1).astype("int32")
        builds.clear()
        out, grad = compiled(x, ids)
        if batch == 0:
            assert len(builds) == 1, builds  # traced: the model's plan, no layer's
            builds.clear()
            np.testing.assert_allclose(
                to_numpy(out), to_numpy(forward(x, ids, False)), atol=1e-5, rtol=1e-5
            )
            assert len(builds) == 2  # without one, each layer builds its own
            assert np.all(np.isfinite(to_numpy(grad)))
    assert len(traces) == 1, len(traces)
