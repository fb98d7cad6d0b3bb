"""Window-sized caches in a swapped causal LM's `generate` (#51 item 1).

Gemma (2), Mistral, GPT-OSS, Qwen and Qwen 3 stack every layer's cache in one
`(B, num_layers, 2, T, Hkv, D)` tensor. After `replace_keras_hub_attention`
their `generate` carries one cache per layer instead: a ring of the window's
slots on local layers, `T` slots on global ones. Each family's greedy tokens
must equal KerasHub's own model with the same random weights, with prompts and
generations longer than the window so the rings wrap before and during
decoding. (Gemma 3's pair per layer is checked in `mask_rules_test.py`.)
"""

import keras
import numpy as np
import pytest

from keras_attention.interchange import keras_hub_models as conversion

keras_hub = pytest.importorskip("keras_hub")
BACKEND = keras.backend.backend()
B, T, VOCAB = 2, 12, 64


def _models(family):
    """`(backbone, causal LM class, slots per layer)`: 2 blocks, windows of
    3 keys; the slots are what KerasHub's configuration says each layer
    reads (Gemma's even layers are local, GPT-OSS's odd ones keep `W + 1`
    keys, Mistral's and Qwen's every layer)."""
    models = keras_hub.models
    common = dict(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
    )
    make = {
        "gemma": lambda: (
            models.GemmaBackbone(
                head_dim=8,
                use_sliding_window_attention=True,
                sliding_window_size=3,
                attention_logit_soft_cap=1.5,
                **common,
            ),
            models.GemmaCausalLM,
            (3, T),
        ),
        "mistral": lambda: (
            models.MistralBackbone(sliding_window=3, **common),
            models.MistralCausalLM,
            (3, 3),
        ),
        "gpt_oss": lambda: (
            models.GptOssBackbone(num_experts=2, top_k=2, head_dim=8, sliding_window=2, **common),
            models.GptOssCausalLM,
            (T, 3),
        ),
        "qwen": lambda: (
            models.QwenBackbone(use_sliding_window_attention=True, sliding_window_size=3, **common),
            models.QwenCausalLM,
            (3, 3),
        ),
        "qwen3": lambda: (
            models.Qwen3Backbone(head_dim=8, sliding_window_size=3, **common),
            models.Qwen3CausalLM,
            (3, 3),
        ),
    }
    return make[family]()


def _lm(family, weights=None):
    """A greedy causal LM with random weights (every weight, scale 0.5, so
    the tokens vary) or `weights`; and its expected slots per layer."""
    backbone, causal_lm, slots = _models(family)
    lm = causal_lm(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    rng = np.random.default_rng(3)
    lm.set_weights(weights or [rng.normal(scale=0.5, size=w.shape) for w in lm.get_weights()])
    return lm, slots


def _prompt():
    """Prompts of 4 and 6 tokens, right-padded to `T`: the rings wrap in
    the prefill, and the longer prompt is fed again over wrapped slots."""
    rng = np.random.default_rng(3)
    ids = np.zeros((B, T), "int32")
    ids[0, :4] = rng.integers(1, VOCAB, size=4)
    ids[1, :6] = rng.integers(1, VOCAB, size=6)
    return {"token_ids": ids, "padding_mask": ids > 0}


def _tokens(lm, prompt):
    return keras.ops.convert_to_numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"])


def _record_caches(lm):
    """Records the shapes of the caches `lm._build_cache` returns."""
    shapes = []
    build_cache = lm._build_cache

    def spy(token_ids):
        hidden, cache = build_cache(token_ids)
        parts = cache if isinstance(cache, tuple) else (cache,)
        shapes.append([tuple(part.shape) for part in parts])
        return hidden, cache

    object.__setattr__(lm, "_build_cache", spy)
    return shapes


# KerasHub's own Qwen layers skip their window on JAX's fused path (its bug):
# their tokens differ from a windowed model's there.
ON_BACKEND = (
    ("gemma", "mistral", "gpt_oss", "qwen", "qwen3")
    if BACKEND == "tensorflow"
    else ("gemma", "mistral", "gpt_oss")
)


@pytest.mark.parametrize("family", ON_BACKEND)
def test_generate_with_window_caches_gives_keras_hubs_tokens(family):
    """The swapped LM's compiled `generate` carries a ring of the window's
    slots per local layer and `T` per global one, and its tokens are
    KerasHub's own; `_build_cache` called as the export calls it (token ids
    alone, no prompt lengths) keeps KerasHub's stacked cache."""
    lm, slots = _lm(family)
    reference, _ = _lm(family, lm.get_weights())
    # Eager on TensorFlow: cheaper than tracing for 6 steps, and KerasHub's
    # compiled Qwen step fails on its own window (a Python `if` on a tensor).
    reference.run_eagerly = BACKEND == "tensorflow"
    prompt = _prompt()
    want = _tokens(reference, prompt)
    assert len(np.unique(want[:, 6:])) > 2  # the generated tokens vary

    conversion.replace_keras_hub_attention(lm)
    shapes = _record_caches(lm)
    got = _tokens(lm, prompt)
    assert shapes == [[(B, 2, s, 1, 8) for s in slots]]
    np.testing.assert_array_equal(got, want)
    _, stacked = lm._build_cache(prompt["token_ids"])
    assert tuple(stacked.shape) == (B, 2, 2, T, 1, 8)


def test_a_loaded_causal_lm_swapped_again_generates_from_window_caches(tmp_path):
    """A `.keras` file restores the swap on the backbone; the causal LM's
    window caches live on the instance, so swapping the loaded LM again
    (nothing left to replace) brings them back, with the same tokens."""
    lm, slots = _lm("mistral")
    conversion.replace_keras_hub_attention(lm)
    prompt = _prompt()
    want = _tokens(lm, prompt)
    path = str(tmp_path / "mistral.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True, compile=False)
    loaded.compile(sampler="greedy")
    assert conversion.replace_keras_hub_attention(loaded) == 0
    shapes = _record_caches(loaded)
    np.testing.assert_array_equal(_tokens(loaded, prompt), want)
    assert shapes == [[(B, 2, s, 1, 8) for s in slots]]
