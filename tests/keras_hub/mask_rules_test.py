"""Swapped KerasHub backbones build no dense mask (#51 item 3).

After `replace_keras_hub_attention` each decoder block hands its causal and
padding mask to ours as rules (`DecoderMaskRules`: `use_causal_mask` and a
key mask), so no `(B, L, L)` tensor is built and long sequences stay linear
in memory. For every family the swap covers, a small backbone with every
weight random gives KerasHub's own hidden states with padded rows (left and
right padding in one batch), and its causal LM KerasHub's logits through a
cached prefill and single steps, while KerasHub's `compute_causal_mask` and
`merge_padding_and_attention_mask` raise and our `AttentionMask.dense` is
never asked for more than one query row.
"""

import sys

import keras
import numpy as np
import pytest

from keras_attention.interchange import keras_hub_models as conversion
from keras_attention.ops import attention_mask as attention_masks

keras_hub = pytest.importorskip("keras_hub")
BACKEND = keras.backend.backend()
TOLERANCE = 1e-5
B, T = 2, 7


def _models(family):
    """`(backbone, causal LM class)` of a 2-block configuration whose
    windows (3 keys) bite at 7 tokens; KerasHub's Qwen layers skip their
    window on JAX's fused path (its bug), so theirs are windowless there."""
    models = keras_hub.models
    common = dict(
        vocabulary_size=50,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=32,
    )
    window = BACKEND == "tensorflow"
    make = {
        "llama": lambda: (models.LlamaBackbone(**common), models.LlamaCausalLM),
        "mistral": lambda: (
            models.MistralBackbone(sliding_window=3, **common),
            models.MistralCausalLM,
        ),
        "qwen": lambda: (
            models.QwenBackbone(
                use_sliding_window_attention=window, sliding_window_size=3, **common
            ),
            models.QwenCausalLM,
        ),
        "qwen3": lambda: (
            models.Qwen3Backbone(head_dim=8, sliding_window_size=3 if window else None, **common),
            models.Qwen3CausalLM,
        ),
        "gemma": lambda: (
            models.GemmaBackbone(
                head_dim=8,
                use_sliding_window_attention=True,
                sliding_window_size=3,
                attention_logit_soft_cap=1.5,
                **common,
            ),
            models.GemmaCausalLM,
        ),
        "gemma3": lambda: (
            models.Gemma3Backbone(
                image_size=16,
                head_dim=8,
                use_sliding_window_attention=True,
                sliding_window_size=3,
                vision_encoder=None,
                **common,
            ),
            models.Gemma3CausalLM,
        ),
        "gpt_oss": lambda: (
            models.GptOssBackbone(num_experts=2, top_k=2, head_dim=8, sliding_window=2, **common),
            models.GptOssCausalLM,
        ),
        "bloom": lambda: (
            models.BloomBackbone(
                vocabulary_size=50, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=32
            ),
            models.BloomCausalLM,
        ),
    }
    return make[family]()


FAMILIES = ("llama", "mistral", "qwen", "qwen3", "gemma", "gemma3", "gpt_oss", "bloom")


def _numpy(x):
    return keras.ops.convert_to_numpy(x).astype("float64")


def _cached_logits(lm, family, ids, padding):
    """Hidden states of a cached prefill over the whole cache at real
    tokens, then the logits of a single step. Gemma 3's prefill is its
    `_build_cache` with the padding mask (its keys span the cache), and its
    step the sampler's first (`min(prompt lengths) - 1`), where the swap
    cuts its local caches to rings; the others' cached calls take no
    padding and rewrite position 5."""
    if family == "gemma3":
        prefill, cache = lm._build_cache(ids, None, None, padding, None)
        at = int(padding.sum(axis=-1).min()) - 1
        step = {"cache_update_mask": keras.ops.ones((B, 1), "bool")}
    else:
        _, cache = lm._build_cache(ids)
        _, prefill, cache = lm.call_with_cache(ids, cache, 0)
        at, step = 5, {}
    prefill = _numpy(prefill)[padding.astype(bool)]
    logits, _, cache = lm.call_with_cache(ids[:, at : at + 1], cache, at, **step)
    return prefill, _numpy(logits)


def _forbid_dense_masks(monkeypatch, backbone):
    """KerasHub's mask builders raise in the decoder's module; our dense
    mask records the query rows it is asked for."""
    module = sys.modules[type(backbone.transformer_layers[0]).__module__]

    def refuse(*args, **kwargs):
        raise AssertionError("a dense decoder mask was built")

    for name in ("compute_causal_mask", "merge_padding_and_attention_mask"):
        monkeypatch.setattr(module, name, refuse)
    rows = []
    dense = attention_masks.AttentionMask.dense

    def spy(self, query_length, key_length, *args, **kwargs):
        rows.append(query_length)
        return dense(self, query_length, key_length, *args, **kwargs)

    monkeypatch.setattr(attention_masks.AttentionMask, "dense", spy)
    return rows


def _padded_inputs(rng):
    """Row 0 left-padded, row 1 right-padded."""
    ids = rng.integers(1, 50, size=(B, T)).astype("int32")
    padding = np.ones((B, T), "int32")
    padding[0, :2] = 0
    padding[1, 5:] = 0
    return ids, padding


def _random_lm(family, rng):
    backbone, causal_lm = _models(family)
    backbone.set_weights([rng.normal(scale=0.2, size=w.shape) for w in backbone.get_weights()])
    return causal_lm(backbone=backbone, preprocessor=None)


# KerasHub's eager JAX model costs ~10 s of CPU each: JAX runs one family of
# each kind (rotary with GQA, Gemma's cache layout, sinks, ALiBi); Gemma 3
# runs below.
ON_BACKEND = FAMILIES if BACKEND == "tensorflow" else ("llama", "gemma", "gpt_oss", "bloom")


@pytest.mark.parametrize("family", ON_BACKEND)
def test_swapped_model_matches_keras_hub_without_a_dense_mask(family, monkeypatch):
    """The swapped backbone's hidden states at real tokens (rows with
    nothing to see, the left padding, are zero in ours, and KerasHub's
    fused JAX path disagrees with its own TF path there) and its causal
    LM's cached logits equal KerasHub's, with KerasHub's mask builders
    raising."""
    rng = np.random.default_rng(FAMILIES.index(family))
    lm = _random_lm(family, rng)
    ids, padding = _padded_inputs(rng)
    real = padding.astype(bool)
    inputs = {"token_ids": ids, "padding_mask": padding}
    want = _numpy(lm.backbone(inputs))[real]
    want_cached = _cached_logits(lm, family, ids, np.ones_like(padding))

    assert conversion.replace_keras_hub_attention(lm) == 2
    _forbid_dense_masks(monkeypatch, lm.backbone)
    got = _numpy(lm.backbone(inputs))[real]
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)
    got_cached = _cached_logits(lm, family, ids, np.ones_like(padding))
    for got, expected in zip(got_cached, want_cached, strict=True):
        np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_blockwise_kernel_sees_no_dense_mask_in_gemma3():
    """With the blockwise kernel nothing builds a `(Tq, Tk)` mask for more
    than one query row: the padded batch uncached, and the cached prefill
    with Gemma 3's padding mask (its generate's: right padding spanning the
    cache, read as a key mask), then a step, all KerasHub's."""
    rng = np.random.default_rng(5)
    lm = _random_lm("gemma3", rng)
    ids, padding = _padded_inputs(rng)
    real = padding.astype(bool)
    right = np.ones_like(padding)
    right[1, 4:] = 0
    inputs = {"token_ids": ids, "padding_mask": padding}
    want = _numpy(lm.backbone(inputs))[real]
    want_cached = _cached_logits(lm, "gemma3", ids, right)

    conversion.replace_keras_hub_attention(lm, memory_efficient=True)
    with pytest.MonkeyPatch.context() as monkeypatch:
        rows = _forbid_dense_masks(monkeypatch, lm.backbone)
        got = _numpy(lm.backbone(inputs))[real]
        got_cached = _cached_logits(lm, "gemma3", ids, right)
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=TOLERANCE)
    for got, expected in zip(got_cached, want_cached, strict=True):
        np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=TOLERANCE)
    assert set(rows) <= {1}, rows


@pytest.mark.parametrize(
    "arguments",
    [
        dict(decoder_attention_mask=np.ones((B, T, T))),  # a custom mask
        dict(x=np.ones((B, T, 4)), vision_mask=np.ones((B, T))),  # Gemma 3's images
        dict(decoder_sequence=np.ones((B, T, 4)), use_causal_mask=False),  # BLOOM, bidirectional
        dict(padding_mask=np.ones((B, 1)), cache=np.ones((B, 2, T, 2, 8))),  # a step's padding
    ],
    ids=["custom", "vision", "bidirectional", "step-padding"],
)
def test_masks_beyond_causal_and_padding_keep_keras_hubs_dense_mask(arguments):
    assert conversion.mask_rules(arguments) is None


def test_causal_and_padding_become_rules():
    padding = np.ones((B, T))
    rules = conversion.mask_rules(dict(x=np.ones((B, T, 4)), padding_mask=padding, cache=None))
    assert rules.arguments() == {"key_mask": padding, "use_causal_mask": True}
    spanning = dict(padding_mask=padding, cache=(np.ones((B, T, 2, 8)), np.ones((B, T, 2, 8))))
    assert conversion.mask_rules(spanning).key_mask is padding


def _gemma3_lm(seed, window):
    """A 2-block Gemma 3 causal LM (both blocks local, as KerasHub makes the
    first 5 of every 6) with greedy sampling and random weights."""
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=40,
        image_size=16,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
        use_sliding_window_attention=True,
        sliding_window_size=window,
        vision_encoder=None,
    )
    rng = np.random.default_rng(seed)
    backbone.set_weights([rng.normal(scale=0.5, size=w.shape) for w in backbone.get_weights()])
    lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    return lm


def _generate(lm, prompt):
    """Gemma 3's compiled `generate_step` (its `generate` wants images)."""
    lm.make_generate_function()
    return _numpy(lm.generate_function(prompt, stop_token_ids=None)["token_ids"])


def _sampler_steps(lm, ids, padding):
    """The logits of the steps Gemma 3's sampler takes, eagerly: the prefill,
    then from the shortest prompt's end each position with its update
    mask (prompt tokens keep their prefill keys)."""
    _, cache = lm._build_cache(ids, None, None, padding, None)
    logits = []
    for t in range(int(padding.sum(axis=-1).min()), ids.shape[1]):
        step, _, cache = lm.call_with_cache(
            ids[:, t - 1 : t], cache, t - 1, cache_update_mask=~padding[:, t - 1 : t]
        )
        logits.append(_numpy(step))
    return np.concatenate(logits, axis=1)


def test_gemma3_generate_keeps_local_caches_at_window_size():
    """After the swap a Gemma 3 causal LM's local layers decode from rings
    of `sliding_window` slots (4, not the 14 of the sequence) and give
    KerasHub's own logits at every step of its sampler and its tokens:
    prompts of 6 and 9 tokens, right-padded as KerasHub's generate takes
    them, so the rings have wrapped before the first step and the longer
    prompt's tokens are fed again over wrapped slots."""
    lm = _gemma3_lm(seed=2, window=4)
    rng = np.random.default_rng(3)
    ids = np.zeros((B, 14), "int32")
    ids[0, :6] = rng.integers(1, 40, size=6)
    ids[1, :9] = rng.integers(1, 40, size=9)
    padding = ids > 0
    prompt = {"token_ids": ids, "padding_mask": padding}
    want = _generate(lm, prompt)
    want_steps = _sampler_steps(lm, want.astype("int32"), padding)

    conversion.replace_keras_hub_attention(lm)
    _, cache = lm._build_cache(ids, None, None, padding, None)
    assert [tuple(keys.shape) for keys, _ in cache] == [(B, 4, 1, 8)] * 2
    got_steps = _sampler_steps(lm, want.astype("int32"), padding)
    np.testing.assert_allclose(got_steps, want_steps, atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_array_equal(_generate(lm, prompt), want)
