"""KerasHub's per-family attention layers reproduced by ours, weight for weight (#37).

For each family KerasHub 0.32 ships, its attention layer is built from a small
configuration with every weight random (biases, norm scales and sinks too),
`MultiHeadAttention.from_keras_hub` builds ours from it, and both are called
as the family's decoder calls its layer: a prefill with a causal and padding
mask, then cached decoding steps, the caches compared in each other's layout.
Then the stronger check: Llama, Gemma 3 and GPT-OSS backbones with every
attention layer replaced by ours give the same hidden states, uncached and
through their causal LM's cached decoding.
"""

import keras
import numpy as np
import pytest

from keras_attention import MultiHeadAttention
from keras_attention.interchange import keras_hub_models as conversion

keras_hub = pytest.importorskip("keras_hub")
BACKEND = keras.backend.backend()
TOLERANCE = 1e-5
B, T, T_MAX, HIDDEN = 2, 5, 8, 32


def _families():
    """name -> (constructor, call style). Windows of 3 keys bite at 5 tokens;
    KerasHub's Qwen layers skip their window on JAX's fused path (its bug),
    so theirs are windowless there."""
    from keras_hub.src.models.bloom.bloom_attention import BloomAttention
    from keras_hub.src.models.falcon.falcon_attention import FalconAttention
    from keras_hub.src.models.gemma.gemma_attention import CachedGemmaAttention
    from keras_hub.src.models.gemma3.gemma3_attention import CachedGemma3Attention
    from keras_hub.src.models.gpt_oss.gpt_oss_attention import GptOssAttention
    from keras_hub.src.models.llama.llama_attention import LlamaAttention
    from keras_hub.src.models.mistral.mistral_attention import CachedMistralAttention
    from keras_hub.src.models.qwen.qwen_attention import QwenAttention
    from keras_hub.src.models.qwen3.qwen3_attention import Qwen3Attention

    qwen_window = BACKEND == "tensorflow"
    return {
        "llama": (lambda: LlamaAttention(4, 2, rope_max_wavelength=100), "hidden_states"),
        "llama3": (
            lambda: LlamaAttention(
                4,
                2,
                rope_max_wavelength=500,
                rope_frequency_adjustment_factor=8.0,
                rope_low_freq_factor=1.0,
                rope_high_freq_factor=4.0,
                rope_pretraining_sequence_length=16,
            ),
            "hidden_states",
        ),
        "mistral": (
            lambda: CachedMistralAttention(4, 2, rope_max_wavelength=100, rope_scaling_factor=2.0),
            "hidden_states",
        ),
        "gemma": (
            lambda: CachedGemmaAttention(
                head_dim=8,
                num_query_heads=4,
                num_key_value_heads=2,
                logit_soft_cap=1.5,
                use_sliding_window_attention=True,
                sliding_window_size=3,
            ),
            "x",
        ),
        "gemma3": (
            lambda: CachedGemma3Attention(
                head_dim=8,
                num_query_heads=4,
                num_key_value_heads=2,
                logit_soft_cap=1.5,
                use_sliding_window_attention=True,
                sliding_window_size=3,
                use_query_key_norm=True,
                rope_wavelength=1000.0,
                rope_scaling_factor=4.0,
                query_head_dim_normalize=False,
            ),
            "x",
        ),
        "gpt_oss": (
            lambda: GptOssAttention(
                4, 2, head_dim=8, sliding_window=2, rope_max_wavelength=100, rope_scaling_factor=4.0
            ),
            "hidden_states",
        ),
        "falcon": (lambda: FalconAttention(4, 0.0), "falcon"),
        "bloom": (lambda: BloomAttention(4), "hidden_states"),
        "qwen": (
            lambda: QwenAttention(
                4,
                2,
                rope_max_wavelength=100,
                use_sliding_window_attention=qwen_window,
                sliding_window_size=3,
            ),
            "hidden_states",
        ),
        "qwen3": (
            lambda: Qwen3Attention(
                4,
                2,
                head_dim=8,
                rope_max_wavelength=100,
                sliding_window_size=3 if qwen_window else None,
            ),
            "hidden_states",
        ),
    }


FAMILIES = (
    "llama",
    "llama3",
    "mistral",
    "gemma",
    "gemma3",
    "gpt_oss",
    "falcon",
    "bloom",
    "qwen",
    "qwen3",
)


def _randomise(layer, rng, scale=0.3):
    layer.set_weights([rng.normal(scale=scale, size=w.shape) for w in layer.get_weights()])


def _masks(rng):
    """Right padding (generation's), causal: `(B, T, T)` and, for the cache,
    `(B, T_MAX, T_MAX)` rows (row `t` for query position `t`)."""
    valid = np.ones((B, T_MAX), "int32")
    valid[1, 3:] = 0
    if rng.random() < 0.5:  # a padded row in the prefill too
        valid[0, 4:] = 0
    causal = np.tril(np.ones((T_MAX, T_MAX), "int32"))
    full = np.minimum(valid[:, None, :], causal[None])
    return full[:, :T, :T], full


def _theirs(layer, style, x, mask, cache=None, index=None, family=""):
    kwargs = dict(attention_mask=keras.ops.convert_to_tensor(mask))
    if cache is not None:
        kwargs.update(cache=cache, cache_update_index=index)
    if style == "falcon":
        from keras_hub.src.models.falcon.falcon_transformer_decoder import FalconTransformerDecoder

        ones = np.ones((B, mask.shape[-1]), "int32")
        alibi = FalconTransformerDecoder(num_attention_heads=4, intermediate_dim=8)
        return layer(
            inputs=x,
            alibi=alibi._build_alibi_tensor(4, keras.ops.convert_to_tensor(ones)),
            **kwargs,
        )
    if style == "x":
        return layer(x, **kwargs)
    return layer(hidden_states=x, **kwargs)


def _empty_cache(family, kv_heads, head_dim):
    zeros = keras.ops.zeros((B, 2, T_MAX, kv_heads, head_dim))
    if family == "gemma3":
        return zeros[:, 0], zeros[:, 1]
    return zeros


def _numpy(x):
    return keras.ops.convert_to_numpy(x).astype("float64")


@pytest.mark.parametrize("family", FAMILIES)
def test_family_prefill_and_cached_steps_match_keras_hub(family):
    """Theirs and ours on one input: the uncached call, a prefill of 3
    tokens at index 0 and single steps after it, every output and the cache
    after each step (ours converted to theirs) to 1e-5 in float32."""
    rng = np.random.default_rng(FAMILIES.index(family))
    make, style = _families()[family]
    theirs = make()
    theirs.build((B, T_MAX, HIDDEN))
    _randomise(theirs, rng)
    ours = MultiHeadAttention.from_keras_hub(theirs)
    x = rng.normal(size=(B, T_MAX, HIDDEN)).astype("float32")
    uncached_mask, rows = _masks(rng)

    want = _numpy(_theirs(theirs, style, x[:, :T], uncached_mask))
    got = _numpy(ours(x[:, :T], attention_mask=uncached_mask))
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)

    kv_heads, head_dim = ours.num_key_value_heads, ours.key_dim
    their_cache = _empty_cache(family, kv_heads, head_dim)
    our_cache = keras.ops.zeros((B, 2, T_MAX, kv_heads, head_dim))
    for start, stop in ((0, 3), (3, 4), (4, 5)):
        mask = rows[:, start:stop]
        want, their_cache = _theirs(theirs, style, x[:, start:stop], mask, their_cache, start)
        got, our_cache = ours(
            x[:, start:stop], attention_mask=mask, cache=our_cache, cache_update_index=start
        )
        np.testing.assert_allclose(_numpy(got), _numpy(want), atol=TOLERANCE, rtol=TOLERANCE)
        converted = conversion.to_keras_hub_cache(our_cache, theirs)
        for a, b in zip(
            converted if isinstance(converted, tuple) else (converted,),
            their_cache if isinstance(their_cache, tuple) else (their_cache,),
            strict=True,
        ):
            np.testing.assert_allclose(_numpy(a), _numpy(b), atol=TOLERANCE, rtol=TOLERANCE)
    # And back: their cache in our layout is ours.
    np.testing.assert_allclose(
        _numpy(conversion.from_keras_hub_cache(their_cache, theirs)),
        _numpy(our_cache),
        atol=TOLERANCE,
        rtol=TOLERANCE,
    )


def _backbones():
    models = keras_hub.models
    common = dict(
        vocabulary_size=50,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=32,
    )
    return {
        "llama": (lambda: models.LlamaBackbone(**common), models.LlamaCausalLM),
        "gemma3": (
            lambda: models.Gemma3Backbone(
                image_size=16,
                head_dim=8,
                use_sliding_window_attention=True,
                sliding_window_size=3,
                vision_encoder=None,
                **common,
            ),
            models.Gemma3CausalLM,
        ),
        "gpt_oss": (
            lambda: models.GptOssBackbone(
                num_experts=2, top_k=2, head_dim=8, sliding_window=2, **common
            ),
            models.GptOssCausalLM,
        ),
    }


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt_oss"])
def test_backbone_with_our_attention_matches_keras_hub(family):
    """Every attention layer of a small backbone replaced by ours: the same
    hidden states, uncached (with padding) and through cached decoding."""
    rng = np.random.default_rng(11)
    make, causal_lm = _backbones()[family]
    backbone = make()
    _randomise(backbone, rng, scale=0.2)
    ids = rng.integers(1, 50, size=(B, 6)).astype("int32")
    padding = np.ones((B, 6), "int32")
    padding[1, 4:] = 0
    inputs = {"token_ids": ids, "padding_mask": padding}
    lm = causal_lm(backbone=backbone, preprocessor=None)
    want = _numpy(backbone(inputs))
    want_steps = _cached_steps(lm, family, ids)

    replaced = conversion.replace_keras_hub_attention(lm)
    assert replaced == 2
    blocks = backbone.transformer_layers
    assert all(
        any(
            isinstance(getattr(b, a, None), conversion.KerasHubAttention)
            for a in conversion.ATTENTION_ATTRIBUTES
        )
        for b in blocks
    )
    got = _numpy(backbone(inputs))
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(
        _cached_steps(lm, family, ids), want_steps, atol=TOLERANCE, rtol=TOLERANCE
    )


def _cached_steps(lm, family, ids):
    """Logits of a cached prefill (at `T_MAX`) then single steps."""
    padding = np.ones(ids.shape, "int32")
    if family == "gemma3":
        # Prompts of 3 tokens: the swap cuts Gemma 3's local caches to rings
        # where its sampler starts (position 3), so the steps begin there.
        padding[:, 3:] = 0
        hidden, cache = lm._build_cache(ids, None, None, padding, None)
    else:
        hidden, cache = lm._build_cache(ids)
    outputs = [_numpy(hidden)]
    for t in (3, 4):  # rewrite positions 3 and 4 from the cache
        if family == "gemma3":
            logits, _, cache = lm.call_with_cache(
                ids[:, t : t + 1], cache, t, cache_update_mask=keras.ops.ones((B, 1), "bool")
            )
        else:
            logits, _, cache = lm.call_with_cache(ids[:, t : t + 1], cache, t)
        outputs.append(_numpy(logits))
    return np.concatenate([o.reshape(B, -1) for o in outputs], axis=1)


def _gemma_lm(weights=None, seed=0):
    """A one-block Gemma causal LM with greedy sampling, its weights random
    (from `seed`) or `weights`."""
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=40,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
    )
    lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    if weights is None:
        _randomise(lm, np.random.default_rng(seed), scale=0.5)
    else:
        lm.set_weights(weights)
    return lm


def _prompt():
    ids = np.zeros((B, 8), "int32")
    ids[:, :3] = [[1, 5, 7], [2, 9, 4]]
    return {"token_ids": ids, "padding_mask": ids > 0}


def test_swap_after_generate_and_predict_reaches_their_compiled_functions():
    """On TensorFlow a traced `generate` / `predict` keeps the layers it
    traced: swapping the causal LM resets them. Our output projections
    zeroed, the LM must generate what KerasHub's own model generates with
    its output projections zeroed (attention adds nothing to the residual)."""
    lm = _gemma_lm(seed=3)
    prompt = _prompt()
    before = _numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"])
    lm.predict(prompt, verbose=0)  # traces `predict_function` with theirs
    reference = _gemma_lm(weights=lm.get_weights())
    reference.run_eagerly = True  # untraced: nothing of `lm` is shared
    for block in reference.backbone.transformer_layers:
        block.attention.output_dense.kernel.assign(
            np.zeros(block.attention.output_dense.kernel.shape)
        )
    want_tokens = _numpy(reference.generate(prompt, stop_token_ids=None)["token_ids"])
    assert (want_tokens != before).any()  # zeroing changes what is generated

    assert conversion.replace_keras_hub_attention(lm) == 1
    for block in lm.backbone.transformer_layers:
        output = block.attention.attention._output_dense
        output.kernel.assign(np.zeros(output.kernel.shape))
    np.testing.assert_array_equal(
        _numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"]), want_tokens
    )
    np.testing.assert_allclose(
        lm.predict(prompt, verbose=0), _numpy(reference(prompt)), atol=TOLERANCE, rtol=TOLERANCE
    )


def test_swap_refuses_a_backbone_another_model_is_built_on():
    """The causal LM's compiled functions are out of the backbone's reach:
    its backbone alone is refused, untouched; swapped through the LM, an
    optimizer built for KerasHub's variables makes `fit` ask for `compile`,
    and a second swap with other overrides is refused."""
    lm = _gemma_lm()
    with pytest.raises(
        ValueError, match=r"^replace_keras_hub_attention: `model` is a backbone .*called in 1 other"
    ):
        conversion.replace_keras_hub_attention(lm.backbone)
    assert not any(
        isinstance(block.attention, conversion.KerasHubAttention)
        for block in lm.backbone.transformer_layers
    )
    lm.optimizer.build(lm.trainable_variables)  # as a `fit` leaves it
    assert conversion.replace_keras_hub_attention(lm) == 1
    with pytest.raises(ValueError, match=r"must call `compile\(\)`"):
        lm.fit(_prompt(), np.zeros((B, 8), "int32"), verbose=0)
    with pytest.raises(ValueError, match=r"already ours.*Received: overrides=\{'memory_efficient'"):
        conversion.replace_keras_hub_attention(lm, memory_efficient=True)


def test_swapped_backbone_and_causal_lm_round_trip_through_keras_files(tmp_path):
    """`.keras` files of a swapped backbone and of its causal LM load (safe
    mode) with our layers, built with the swap's overrides, and the saved
    weights: the same outputs. The weights are drawn after the swap, so
    KerasHub's initial ones copied into a re-swapped model would differ."""
    lm = _gemma_lm()
    conversion.replace_keras_hub_attention(lm, memory_efficient=True)
    _randomise(lm, np.random.default_rng(7), scale=0.5)
    prompt = _prompt()
    for name, model in (("causal_lm", lm), ("backbone", lm.backbone)):
        path = str(tmp_path / f"{name}.keras")
        model.save(path)
        # compile=False: KerasHub's causal LM warns that its `compile` is custom.
        loaded = keras.saving.load_model(path, safe_mode=True, compile=False)
        np.testing.assert_allclose(
            _numpy(loaded(prompt)), _numpy(model(prompt)), atol=TOLERANCE, rtol=TOLERANCE
        )
        backbone = loaded if name == "backbone" else loaded.backbone
        assert isinstance(backbone, keras_hub.models.GemmaBackbone)
        for block in backbone.transformer_layers:
            assert isinstance(block.attention.attention, MultiHeadAttention)
            assert block.attention.attention.memory_efficient
    # A Gemma file of the earlier format (kernels for the half-split rotary)
    # would load those weights under the same names and answer wrongly.
    config = lm.backbone.get_config()
    del config[conversion.SWAP_CONFIG_KEY]["format"]
    with pytest.raises(ValueError, match=r"GemmaBackbone\.from_config: .*earlier keras-attention"):
        type(lm.backbone).from_config(config)


def test_from_keras_hub_refuses_what_it_cannot_compute():
    from keras_hub.src.models.gemma3.gemma3_attention import CachedGemma3Attention
    from keras_hub.src.models.llama.llama_attention import LlamaAttention

    with pytest.raises(TypeError, match=r"from_keras_hub: `layer` must be one of KerasHub"):
        MultiHeadAttention.from_keras_hub(keras.layers.MultiHeadAttention(2, 4))
    unbuilt = LlamaAttention(4, 2)
    with pytest.raises(ValueError, match=r"must be built"):
        MultiHeadAttention.from_keras_hub(unbuilt)
    dropping = LlamaAttention(4, 2, dropout=0.1)
    dropping.build((B, T, HIDDEN))
    with pytest.raises(ValueError, match=r"LlamaAttention\.dropout=0\.1"):
        MultiHeadAttention.from_keras_hub(dropping)
    centred = CachedGemma3Attention(
        head_dim=8, num_query_heads=4, num_key_value_heads=2, use_bidirectional_attention=True
    )
    centred.build((B, T, HIDDEN))
    with pytest.raises(ValueError, match=r"CachedGemma3Attention\.use_bidirectional_attention"):
        MultiHeadAttention.from_keras_hub(centred)


def _cached_step_ops(layer, x, mask, cache, index, **kwargs):
    """`(op or primitive name, largest output size)` of each op of one
    traced cached call of `layer`."""

    def step(cache):
        return layer(x, attention_mask=mask, cache=cache, cache_update_index=index, **kwargs)

    if BACKEND == "jax":
        import jax
        from jax.extend.core import jaxprs_in_params

        def ops_of(jaxpr):
            for equation in jaxpr.eqns:
                sizes = [int(np.prod(v.aval.shape)) for v in equation.outvars]
                yield equation.primitive.name, max(sizes, default=0)
                for inner in jaxprs_in_params(equation.params):
                    yield from ops_of(inner)

        return list(ops_of(jax.make_jaxpr(step)(cache).jaxpr))
    import tensorflow as tf

    graph = tf.function(step).get_concrete_function(cache).graph
    return [
        (op.type, max((o.shape.num_elements() or 0 for o in op.outputs), default=0))
        for op in graph.get_operations()
    ]


def _copies_of_the_cache(ops_and_sizes, key_cache_size):
    """The gathers, stacks and concatenations that output at least a whole
    key cache: a per-step conversion of the cache."""
    copying = ("gather", "pack", "concat", "stack")
    return [
        (name, size)
        for name, size in ops_and_sizes
        if any(word in name.lower() for word in copying) and size >= key_cache_size
    ]


def test_swapped_gemma_reads_and_writes_keras_hubs_cache_as_it_is():
    """#51: ours permutes Gemma's query and key features and turns pairs
    (2i, 2i + 1), so the cache it writes is KerasHub's bit for bit, and the
    swapped layer passes the cache it is given straight to ours: a cached
    step traces no gather (it took two of the whole key cache per step)."""
    make, _ = _families()["gemma"]
    theirs = make()
    theirs.build((B, T_MAX, HIDDEN))
    rng = np.random.default_rng(5)
    _randomise(theirs, rng)
    swapped = conversion.KerasHubAttention(
        MultiHeadAttention.from_keras_hub(theirs), "CachedGemmaAttention"
    )
    assert swapped.attention.rotary.interleaved
    x = rng.normal(size=(B, T_MAX, HIDDEN)).astype("float32")
    _, rows = _masks(rng)
    their_cache = our_cache = _empty_cache("gemma", 2, 8)
    for start, stop in ((0, 3), (3, 4), (4, 5)):
        mask = rows[:, start:stop]
        want, their_cache = theirs(
            x[:, start:stop], attention_mask=mask, cache=their_cache, cache_update_index=start
        )
        got, our_cache = swapped(
            x[:, start:stop], attention_mask=mask, cache=our_cache, cache_update_index=start
        )
        np.testing.assert_allclose(_numpy(got), _numpy(want), atol=TOLERANCE, rtol=TOLERANCE)
        np.testing.assert_array_equal(_numpy(our_cache), _numpy(their_cache))
    assert conversion.to_keras_hub_cache(our_cache, theirs) is our_cache
    assert conversion.from_keras_hub_cache(their_cache, theirs) is their_cache
    traced = _cached_step_ops(swapped, x[:, 5:6], rows[:, 5:6], our_cache, 5)
    assert traced and not [name for name, _ in traced if "gather" in name.lower()], traced
    assert not _copies_of_the_cache(traced, B * T_MAX * 2 * 8)


def test_swapped_gemma3_writes_its_cache_pair_without_stacking_it():
    """#51: Gemma 3's `(keys, values)` cache reaches ours as a pair, each
    written in place (stacking the two copied the whole cache per layer per
    step), and comes back as a pair with KerasHub's contents. A row its
    `cache_update_mask` leaves False is not written, and its query attends
    over the cache as written (the slot's old entry, visible to it here),
    as KerasHub's."""
    make, _ = _families()["gemma3"]
    theirs = make()
    theirs.build((B, T_MAX, HIDDEN))
    rng = np.random.default_rng(6)
    _randomise(theirs, rng)
    swapped = conversion.KerasHubAttention(
        MultiHeadAttention.from_keras_hub(theirs), "CachedGemma3Attention"
    )
    x = rng.normal(size=(B, T_MAX, HIDDEN)).astype("float32")
    causal = np.tril(np.ones((T_MAX, T_MAX), "int32"))
    rows = np.broadcast_to(causal, (B, T_MAX, T_MAX))  # no padding: every slot visible
    update = keras.ops.convert_to_tensor(np.array([[True], [False]]))  # row 1 keeps its own
    their_cache = our_cache = _empty_cache("gemma3", 2, 8)
    for start, stop in ((0, 3), (3, 4)):
        mask, kwargs = rows[:, start:stop], {}
        if start:
            kwargs["cache_update_mask"] = update
        want, their_cache = theirs(
            x[:, start:stop], mask, their_cache, cache_update_index=start, **kwargs
        )
        got, our_cache = swapped(
            x[:, start:stop], mask, our_cache, cache_update_index=start, **kwargs
        )
        np.testing.assert_allclose(_numpy(got), _numpy(want), atol=TOLERANCE, rtol=TOLERANCE)
    assert isinstance(our_cache, tuple)
    for ours_part, their_part in zip(our_cache, their_cache, strict=True):
        np.testing.assert_allclose(
            _numpy(ours_part), _numpy(their_part), atol=TOLERANCE, rtol=TOLERANCE
        )
    assert not _numpy(our_cache[0])[1, 3].any()  # the masked row was not written
    traced = _cached_step_ops(
        swapped, x[:, 4:5], rows[:, 4:5], our_cache, 4, cache_update_mask=update
    )
    assert traced and not _copies_of_the_cache(traced, B * T_MAX * 2 * 8), traced


def test_swapped_gemma_generates_keras_hubs_tokens():
    """#51: greedy `generate` of a small Gemma causal LM on our attention
    (interleaved rotary, its cache KerasHub's) gives KerasHub's own tokens,
    with random weights that make them vary."""
    lm = _gemma_lm(seed=9)
    reference = _gemma_lm(weights=lm.get_weights())
    prompt = _prompt()
    want = _numpy(reference.generate(prompt, stop_token_ids=None)["token_ids"])
    assert len(np.unique(want[:, 3:])) > 2  # the generated tokens vary
    assert conversion.replace_keras_hub_attention(lm) == 1
    got = lm.generate(prompt, stop_token_ids=None)["token_ids"]
    np.testing.assert_array_equal(_numpy(got), want)
