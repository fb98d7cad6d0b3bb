"""Every public callable refuses bad input with our error (issue 39).

The public surface is what the API site shows: each name of each `__all__`
in the package (the walk of `tests/docs/api_site_test.py`), plus the
callables the guides document by module path (`DOCUMENTED`). For each, at
least one wrong-type and one wrong-value call must raise our ValueError or
TypeError whose message names the callable and the argument, before any
backend or library call. A public callable with no cases and no written
exemption fails `test_every_public_callable_has_cases_or_an_exemption`, so a
new public function cannot ship unchecked.

Shapes are tiny: every case is refused before any computation.
"""

import importlib
import inspect
import os
import pkgutil
import re
import sys

import keras
import numpy as np
import pytest

import keras_attention
import keras_attention as ka
from keras_attention.interchange.keras_hub_models import from_keras_hub_cache
from keras_attention.interchange.keras_hub_models import replace_keras_hub_attention
from keras_attention.interchange.keras_hub_models import to_keras_hub_cache

pytestmark = pytest.mark.tf_only  # the translators and export import TensorFlow

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "widgets"))  # the widgets' fake translator


def _keras_hub_layer():
    """A KerasHub attention layer, or a stand-in of the same class name
    where KerasHub is not installed (the functions read class names only)."""
    try:
        from keras_hub.src.models.llama.llama_attention import LlamaAttention
    except ImportError:  # pragma: no cover - KerasHub is in the dev set
        LlamaAttention = type(
            "LlamaAttention", (keras.layers.Layer,), {"__module__": "keras_hub.x"}
        )
    return LlamaAttention(2, 1)


def public_callables():
    """{"module.name": object} for each callable of each public `__all__`."""
    found = {}
    modules = ["keras_attention"] + [
        info.name for info in pkgutil.walk_packages(keras_attention.__path__, "keras_attention.")
    ]
    for module_name in modules:
        if any(part.startswith("_") for part in module_name.split(".")):
            continue
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if callable(value) and not inspect.ismodule(value):
                found.setdefault(f"{value.__module__}.{value.__qualname__}", value)
    for path in DOCUMENTED:
        module_name, name = path.rsplit(".", 1)
        found[path] = getattr(importlib.import_module(module_name), name)
    return found


VOCABULARY = ["<pad>", "<unk>", "<start>", "<end>"]  # the reserved tokens, first

# Documented in the guides by module path, not in an `__all__` (none now).
DOCUMENTED = []


def x(*shape, dtype="float32"):
    return np.ones(shape, dtype)


def _mesh(size=1, axes=("sequence",)):
    from jax.sharding import AbstractMesh

    return AbstractMesh((size,) * len(axes), axes)


def _translator():
    from fake_translator import FakeTranslator

    return FakeTranslator()


def _causal_session(**kwargs):
    from keras_attention.models import CausalDecodingSession

    ids = keras.Input((None,), dtype="int32")
    hidden = keras.layers.Embedding(4, 4)(ids)
    hidden = ka.MultiHeadAttention(num_heads=1, key_dim=4)(hidden, hidden, use_causal_mask=True)
    arguments = {
        "model": keras.Model(ids, keras.layers.Dense(4)(hidden)),
        "max_length": 4,
        "vocabulary": ["a", "b", "c", "d"],
        **kwargs,
    }
    return CausalDecodingSession(arguments.pop("model"), "a", **arguments)


def _sampling(**kwargs):
    from keras_attention.models import Sampling

    return Sampling(**kwargs)


def _seq2seq(**kwargs):
    from keras_attention.models import Seq2SeqTranslator

    return Seq2SeqTranslator(VOCABULARY + ["one", "two"], VOCABULARY + ["1", "2"], **kwargs)


def _translation(**kwargs):
    from keras_attention.models import Translation

    fields = dict(text="a", tokens=["a"], source_tokens=["b"], score=0.0, alignment=x(1, 1))
    return Translation(**{**fields, **kwargs})


def _figure():
    from keras_attention.widgets import heatmap

    return heatmap(np.eye(2))


def _model():
    inputs = keras.Input((3, 4))
    return keras.Model(inputs, ka.LuongAttention()([inputs, inputs]))


def _mha_model():
    inputs = keras.Input((3, 4))
    return keras.Model(inputs, ka.MultiHeadAttention(2, 2, name="mha")(inputs, inputs))


def _batches():
    return [(x(1, 3, 4), x(1, 3, 4))]


def _mse(y_true, y_pred):
    return keras.ops.mean((y_true - y_pred) ** 2)


def _device_mesh(axis="batch"):
    devices = keras.distribution.list_devices()[:1]
    return keras.distribution.DeviceMesh((1,), (axis,), devices)


def _plan_fields(**changes):
    counts, indices = np.zeros((2,), "int32"), np.zeros((2, 2), "int32")
    fields = dict(query_length=8, key_length=8, query_block=4, key_block=4)
    fields.update(full_counts=counts, partial_counts=counts)
    fields.update(full_indices=indices, partial_indices=indices)
    return {**fields, **changes}


# "module.name" -> [(argument, call)]: each call must raise our ValueError or
# TypeError naming the callable (its `__name__`) and `argument`. The first
# case is the wrong type, the second the wrong value, then the pins.
CASES = {
    # ---------------------------------------------------------------- ops
    "keras_attention.ops.attention_mask.AttentionMask": [
        ("query_mask", lambda: ka.ops.AttentionMask(query_mask="abc")),
        ("key_mask", lambda: ka.ops.AttentionMask(key_mask=x(1, 2, 3))),
        ("causal", lambda: ka.ops.AttentionMask(causal="yes")),
        ("sliding_window", lambda: ka.ops.AttentionMask(sliding_window=0)),
        ("prefix_length", lambda: ka.ops.AttentionMask(prefix_length=3)),
        ("key_segment_ids", lambda: ka.ops.AttentionMask(query_segment_ids=x(1, 2, dtype="int32"))),
        ("mask_mod", lambda: ka.ops.AttentionMask(mask_mod="causal")),
        ("key_positions", lambda: ka.ops.AttentionMask(key_positions=x(1, 3))),
        # #49: the arity at construction, not Python's bare TypeError at the first call.
        ("mask_mod", lambda: ka.ops.AttentionMask(mask_mod=lambda q_idx, k_idx: q_idx >= k_idx)),
    ],
    "keras_attention.interchange.keras_hub_layers.to_keras_hub_cache": [
        ("layer", lambda: to_keras_hub_cache(x(1, 2, 3, 1, 2), keras.layers.Dense(2))),
        ("cache", lambda: to_keras_hub_cache(x(1, 2, 3), _keras_hub_layer())),
    ],
    "keras_attention.interchange.keras_hub_layers.from_keras_hub_cache": [
        ("layer", lambda: from_keras_hub_cache(x(1, 2, 3, 1, 2), "LlamaAttention")),
        ("cache", lambda: from_keras_hub_cache(x(1, 3, 3, 1, 2), _keras_hub_layer())),
    ],
    "keras_attention.interchange.keras_hub_models.replace_keras_hub_attention": [
        ("model", lambda: replace_keras_hub_attention("llama")),
        ("model", lambda: replace_keras_hub_attention(keras.Sequential())),
        # The argument's name before #49, still read as the model.
        ("model=str", lambda: replace_keras_hub_attention(backbone="llama")),
    ],
    "keras_attention.ops.mods.and_masks": [
        ("mask_mods[1]", lambda: ka.ops.and_masks(lambda b, h, q, k: q >= k, "causal")),
        ("mask_mods", lambda: ka.ops.and_masks()),
    ],
    "keras_attention.ops.mods.or_masks": [
        ("mask_mods[0]", lambda: ka.ops.or_masks(lambda q, k: q >= k)),
        ("mask_mods", lambda: ka.ops.or_masks()),
    ],
    "keras_attention.ops.tiling.tile_plan": [
        ("mask", lambda: ka.ops.tile_plan("causal", 8)),
        ("query_length", lambda: ka.ops.tile_plan(None, 0)),
        ("batch_size", lambda: ka.ops.tile_plan(lambda b, h, q, k: q >= k, 8)),
    ],
    "keras_attention.ops.tiling.TilePlan": [
        ("query_block", lambda: ka.ops.TilePlan(**_plan_fields(query_block="4"))),
        ("full_indices", lambda: ka.ops.TilePlan(**_plan_fields(full_indices=x(2, 3)))),
    ],
    "keras_attention.ops.dropout.dropout_keep_mask": [
        ("seed", lambda: ka.ops.dropout_keep_mask("1", 1, 1, 2, 2, 0.1)),
        ("rate", lambda: ka.ops.dropout_keep_mask(1, 1, 1, 2, 2, 1.0)),
        ("query_length", lambda: ka.ops.dropout_keep_mask(1, 1, 1, -2, 2, 0.1)),
        ("seed", lambda: ka.ops.dropout_keep_mask(x(2, dtype="int32"), 1, 1, 2, 2, 0.1)),
    ],
    "keras_attention.ops.online_softmax.merge_attention": [
        ("outputs", lambda: ka.ops.merge_attention(x(1, 2, 1, 2), [])),
        ("statistics", lambda: ka.ops.merge_attention([x(1, 2, 1, 2)], [])),
        ("statistics[0]", lambda: ka.ops.merge_attention([x(1, 2, 1, 2)], [x(1, 1, 2)])),
    ],
    "keras_attention.ops.masking.causal_mask": [
        ("query_length", lambda: ka.ops.causal_mask("3", 3)),
        ("key_length", lambda: ka.ops.causal_mask(3, -1)),
    ],
    "keras_attention.ops.online_softmax.masked_softmax": [
        ("logits", lambda: ka.ops.masked_softmax([[1.0, 2.0]])),
        ("axis", lambda: ka.ops.masked_softmax(x(2, 3), axis=2)),
        ("fused", lambda: ka.ops.masked_softmax(x(2, 3), fused="yes")),
        ("mask", lambda: ka.ops.masked_softmax(x(2, 3), mask=x(2, 4, dtype=bool))),
    ],
    "keras_attention.ops.masking.merge_masks": [
        ("masks[1]", lambda: ka.ops.merge_masks(None, "abc")),
        ("masks[1]", lambda: ka.ops.merge_masks(x(2, 3, dtype=bool), x(2, 4, dtype=bool))),
    ],
    "keras_attention.ops.masking.to_bool_mask": [
        ("mask", lambda: ka.ops.to_bool_mask([1, 0])),
        ("mask", lambda: ka.ops.to_bool_mask(np.array(["yes", "no"]))),
    ],
    "keras_attention.ops.score_functions.additive_score": [
        ("score_vector", lambda: ka.ops.additive_score(x(1, 2, 3), x(1, 2, 3), 3)),
        ("score_vector", lambda: ka.ops.additive_score(x(1, 2, 3), x(1, 2, 3), x(4))),
    ],
    "keras_attention.ops.score_functions.dot_score": [
        ("query", lambda: ka.ops.dot_score("q", x(1, 2, 3))),
        ("key", lambda: ka.ops.dot_score(x(1, 2, 3), x(1, 2, 4))),
        ("scale", lambda: ka.ops.dot_score(x(1, 2, 3), x(1, 2, 3), scale=float("nan"))),
    ],
    "keras_attention.ops.score_functions.general_score": [
        ("kernel", lambda: ka.ops.general_score(x(1, 2, 3), x(1, 2, 3), None)),
        ("kernel", lambda: ka.ops.general_score(x(1, 2, 3), x(1, 2, 3), x(4, 3))),
    ],
    "keras_attention.ops.score_functions.low_rank_score": [
        ("key_kernel", lambda: ka.ops.low_rank_score(x(1, 2, 3), x(1, 2, 3), x(3, 2), "k")),
        ("key_kernel", lambda: ka.ops.low_rank_score(x(1, 2, 3), x(1, 2, 3), x(3, 2), x(3, 5))),
    ],
    "keras_attention.ops.score_functions.weighted_sum": [
        ("value", lambda: ka.ops.weighted_sum(x(1, 2, 3), [[1.0]])),
        ("value", lambda: ka.ops.weighted_sum(x(1, 2, 3), x(1, 4, 5))),
    ],
    "keras_attention.ops.score_modifier.ScoreModifier": [
        ("soft_cap", lambda: ka.ops.ScoreModifier(soft_cap="50")),
        ("soft_cap", lambda: ka.ops.ScoreModifier(soft_cap=-1.0)),
        ("score_mod", lambda: ka.ops.ScoreModifier(score_mod=3)),
        ("score_mod", lambda: ka.ops.ScoreModifier(score_mod=lambda score, head: score)),
        ("sink_logits", lambda: ka.ops.ScoreModifier(sink_logits=x(2, 3))),
    ],
    "keras_attention.ops.score_modifier.alibi_slopes": [
        ("num_heads", lambda: ka.ops.alibi_slopes("8")),
        ("num_heads", lambda: ka.ops.alibi_slopes(0)),
        ("max_bias", lambda: ka.ops.alibi_slopes(8, max_bias=0)),
        ("max_bias", lambda: ka.ops.alibi_slopes(8, max_bias="8")),
    ],
    "keras_attention.ops.block_sparse.sparse_tile_plan": [
        ("mask", lambda: ka.ops.sparse_tile_plan("causal", 8, block_size=4, window_blocks=1)),
        ("window_blocks", lambda: ka.ops.sparse_tile_plan(None, 8, block_size=4, window_blocks=-1)),
        ("block_size", lambda: ka.ops.sparse_tile_plan(None, 8, block_size=0, window_blocks=1)),
    ],
    "keras_attention.ops.block_sparse.block_plan": [
        ("window_blocks", lambda: ka.ops.block_plan(2, 2, window_blocks="3")),
        ("window_blocks", lambda: ka.ops.block_plan(2, 2, window_blocks=-1)),
        ("num_query_blocks", lambda: ka.ops.block_plan(-2, 2, window_blocks=1)),
    ],
    "keras_attention.ops.block_sparse.block_sparse_attention": [
        (
            "block_size",
            lambda: ka.ops.block_sparse_attention(
                x(1, 4, 1, 2), x(1, 4, 1, 2), x(1, 4, 1, 2), block_size="2", window_blocks=1
            ),
        ),
        (
            "block_size",
            lambda: ka.ops.block_sparse_attention(
                x(1, 4, 1, 2), x(1, 4, 1, 2), x(1, 4, 1, 2), block_size=0, window_blocks=1
            ),
        ),
        (
            "value",
            lambda: ka.ops.block_sparse_attention(
                x(1, 4, 1, 2), x(1, 4, 1, 2), x(1, 4, 2), block_size=2, window_blocks=1
            ),
        ),
    ],
    "keras_attention.ops.favor.causal_linear_attention": [
        ("value", lambda: ka.ops.causal_linear_attention(x(1, 1, 2, 3), x(1, 1, 2, 3), None)),
        (
            "chunk_size",
            lambda: ka.ops.causal_linear_attention(
                x(1, 1, 2, 3), x(1, 1, 2, 3), x(1, 1, 2, 3), chunk_size=0
            ),
        ),
    ],
    "keras_attention.ops.favor.favor_attention": [
        (
            "kernel",
            lambda: ka.ops.favor_attention(
                x(1, 2, 1, 3), x(1, 2, 1, 3), x(1, 2, 1, 3), x(4, 3), kernel=None
            ),
        ),
        (
            "kernel",
            lambda: ka.ops.favor_attention(
                x(1, 2, 1, 3), x(1, 2, 1, 3), x(1, 2, 1, 3), x(4, 3), kernel="Softmax"
            ),
        ),
        (
            "projection",
            lambda: ka.ops.favor_attention(x(1, 2, 1, 3), x(1, 2, 1, 3), x(1, 2, 1, 3), x(4, 5)),
        ),
    ],
    "keras_attention.ops.favor.linear_attention": [
        ("query_features", lambda: ka.ops.linear_attention(1.0, x(1, 1, 2, 3), x(1, 1, 2, 3))),
        (
            "key_features",
            lambda: ka.ops.linear_attention(x(1, 1, 2, 3), x(1, 1, 2, 4), x(1, 1, 2, 3)),
        ),
    ],
    "keras_attention.ops.favor.random_projection": [
        ("num_features", lambda: ka.ops.random_projection("4", 3)),
        ("dim", lambda: ka.ops.random_projection(4, 0)),
        ("orthogonal", lambda: ka.ops.random_projection(4, 3, orthogonal="no")),
    ],
    "keras_attention.ops.favor.relu_features": [
        ("projection", lambda: ka.ops.relu_features(x(1, 1, 2, 3), "p")),
        ("epsilon", lambda: ka.ops.relu_features(x(1, 1, 2, 3), x(4, 3), epsilon=-1.0)),
    ],
    "keras_attention.ops.favor.softmax_features": [
        ("is_query", lambda: ka.ops.softmax_features(x(1, 1, 2, 3), x(4, 3), is_query="y")),
        (
            "mask",
            lambda: ka.ops.softmax_features(
                x(1, 1, 2, 3), x(4, 3), is_query=False, mask=x(1, 5, dtype=bool)
            ),
        ),
    ],
    "keras_attention.ops.linformer.linformer_attention": [
        (
            "key_projection",
            lambda: ka.ops.linformer_attention(
                x(1, 2, 1, 3), x(1, 2, 1, 3), x(1, 2, 1, 3), "E", x(4, 2)
            ),
        ),
        (
            "key_projection",
            lambda: ka.ops.linformer_attention(
                x(1, 2, 1, 3), x(1, 2, 1, 3), x(1, 2, 1, 3), x(1, 2), x(4, 2)
            ),
        ),
    ],
    "keras_attention.ops.memory_efficient.memory_efficient_attention": [
        ("query", lambda: ka.ops.memory_efficient_attention("q", x(1, 4, 2, 8), x(1, 4, 2, 8))),
        (
            "key",
            lambda: ka.ops.memory_efficient_attention(x(1, 4, 2, 8), x(4, 2, 8), x(1, 4, 2, 8)),
        ),
        (
            "block_size",
            lambda: ka.ops.memory_efficient_attention(*[x(1, 4, 2, 8)] * 3, block_size=0),
        ),
        ("scale", lambda: ka.ops.memory_efficient_attention(*[x(1, 4, 2, 8)] * 3, scale="a")),
        (
            "dropout_rate",
            lambda: ka.ops.memory_efficient_attention(*[x(1, 4, 2, 8)] * 3, dropout_rate=1.5),
        ),
    ],
    "keras_attention.ops.ring.ring_attention": [
        (
            "mesh",
            lambda: _ring(mesh="mesh"),
        ),
        # The pins: any other `balance` ran contiguous blocks silently.
        ("balance", lambda: _ring(balance="foo")),
        ("balance", lambda: _ring(balance=None)),
        ("balance", lambda: _ring(balance=2)),
        ("balance", lambda: _ring(balance="ZIGZAG")),
        # A length the mesh does not divide: JAX's raw shard_map error before.
        ("sequence_axis", lambda: _ring(mesh=_mesh(2), length=3)),
    ],
    # ------------------------------------------------------ analysis
    "keras_attention.analysis.rollout.attention_rollout": [
        ("weights", lambda: ka.analysis.attention_rollout("weights")),
        ("weights[0]", lambda: ka.analysis.attention_rollout([x(1, 2, 3, 4)])),
        ("heads", lambda: ka.analysis.attention_rollout([x(1, 2, 3, 3)], heads=5)),
        ("all_layers", lambda: ka.analysis.attention_rollout([x(1, 3, 3)], all_layers="yes")),
    ],
    "keras_attention.analysis.rollout.attention_flow": [
        ("heads", lambda: ka.analysis.attention_flow([x(1, 2, 3, 3)], heads="first")),
        ("weights[1]", lambda: ka.analysis.attention_flow([x(1, 3, 3), x(1, 4, 4)])),
        ("residual_weight", lambda: ka.analysis.attention_flow([x(1, 3, 3)], residual_weight=-1)),
    ],
    "keras_attention.analysis.rollout.model_attention_rollout": [
        ("model", lambda: ka.analysis.model_attention_rollout("model", x(1, 3, 4))),
        ("layers", lambda: ka.analysis.model_attention_rollout(_model(), x(1, 3, 4), layers="a")),
        ("layers", lambda: ka.analysis.model_attention_rollout(_model(), x(1, 3, 4), layers=["b"])),
    ],
    "keras_attention.analysis.rollout.model_attention_flow": [
        ("model", lambda: ka.analysis.model_attention_flow(None, x(1, 3, 4))),
        ("model", lambda: ka.analysis.model_attention_flow(keras.layers.Dense(2), x(1, 3, 4))),
    ],
    "keras_attention.analysis.heads.masking_heads": [
        ("head_masks_by_layer", lambda: ka.analysis.masking_heads(_mha_model(), [1.0, 0.0])),
        ("head_masks_by_layer", lambda: ka.analysis.masking_heads(_mha_model(), {"b": [1.0]})),
        ("head_masks_by_layer", lambda: ka.analysis.masking_heads(_mha_model(), {"mha": [1.0]})),
    ],
    "keras_attention.analysis.heads.head_importance": [
        ("loss_fn", lambda: ka.analysis.head_importance(_mha_model(), _batches(), "mse")),
        ("batches", lambda: ka.analysis.head_importance(_mha_model(), [x(1, 3, 4)], _mse)),
        ("model", lambda: ka.analysis.head_importance(_model(), _batches(), _mse)),
    ],
    "keras_attention.analysis.heads.mask_least_important_heads": [
        (
            "importance",
            lambda: ka.analysis.mask_least_important_heads(_mha_model(), [0.1], 1, [], _mse),
        ),
        (
            "k",
            lambda: ka.analysis.mask_least_important_heads(
                _mha_model(), {"mha": [0.1, 0.2]}, 3, _batches(), _mse
            ),
        ),
        (
            "importance",
            lambda: ka.analysis.mask_least_important_heads(
                _mha_model(), {"mha": [0.1]}, 1, _batches(), _mse
            ),
        ),
    ],
    # ------------------------------------------------------ distribution
    "keras_attention.distribution.get_layout_map": [
        ("device_mesh", lambda: ka.distribution.get_layout_map("mesh")),
        ("model_axis", lambda: ka.distribution.get_layout_map(_device_mesh("batch"))),
    ],
    # ------------------------------------------------------ layers (functions)
    "keras_attention.layers.machinery.memory_budget.set_attention_memory_budget": [
        ("num_bytes", lambda: ka.set_attention_memory_budget("1GB")),
        ("num_bytes", lambda: ka.set_attention_memory_budget(-1)),
    ],
    "keras_attention.layers.machinery.capture.capture_attention": [
        ("model_or_layer", lambda: ka.capture_attention("model")),
        ("model_or_layer", lambda: ka.capture_attention(keras.layers.Dense(2))),
    ],
    "keras_attention.layers.performer_attention.RedrawFeatures": [
        ("every_n_steps", lambda: ka.RedrawFeatures("10")),
        ("every_n_steps", lambda: ka.RedrawFeatures(0)),
    ],
    # ------------------------------------------------------ models
    "keras_attention.models.decoding.DecodingSession": [
        ("text", lambda: _decoding_session(_translator(), 5)),
        ("top_k", lambda: _decoding_session(_translator(), "he hit", top_k=0)),
    ],
    "keras_attention.models.causal_decoding.CausalDecodingSession": [
        ("max_length", lambda: _causal_session(max_length=0)),
        ("vocabulary", lambda: _causal_session(vocabulary=None)),
        ("model", lambda: _causal_session(model="model")),
        ("sampler", lambda: _causal_session(sampler=3)),
    ],
    "keras_attention.models.causal_decoding.Sampling": [
        ("temperature", lambda: _sampling(temperature=0)),
        ("top_p", lambda: _sampling(top_p=1.5)),
        ("top_k", lambda: _sampling(top_k=0)),
    ],
    "keras_attention.models.text_processing.TextEncoder": [
        ("max_length", lambda: _text_encoder(max_length="5")),
        ("max_length", lambda: _text_encoder(max_length=0)),
    ],
    "keras_attention.models.seq2seq_translator.Seq2SeqTranslator": [
        ("max_source_length", lambda: _seq2seq(max_source_length="4")),
        ("max_source_length", lambda: _seq2seq(max_source_length=0)),
    ],
    "keras_attention.models.transformer_translator.TransformerTranslator": [
        ("num_layers", lambda: _transformer(num_layers="2")),
        ("num_layers", lambda: _transformer(num_layers=0)),
    ],
    "keras_attention.models.alignment_chart.alignment_matrix": [
        ("alignment", lambda: ka_chart().alignment_matrix("weights")),
        ("alignment", lambda: ka_chart().alignment_matrix(x(2, 2, 2))),
        ("head", lambda: ka_chart().alignment_matrix(x(1, 1, 2, 2), head="0")),
    ],
    "keras_attention.models.alignment_chart.merge_subwords": [
        ("translation", lambda: ka_chart().merge_subwords("a b")),
        ("suffix", lambda: ka_chart().merge_subwords(_translation(), suffix="")),
    ],
    "keras_attention.models.alignment_chart.alignment_text": [
        ("translation", lambda: ka_chart().alignment_text(None)),
        ("width", lambda: ka_chart().alignment_text(_translation(), width=0)),
    ],
    "keras_attention.models.alignment_chart.alignment_html": [
        ("translations", lambda: ka_chart().alignment_html(_translation())),
        ("title", lambda: ka_chart().alignment_html([_translation()], title=None)),
    ],
    # ------------------------------------------------------ export
    "keras_attention.export.check.check_servable": [
        ("path", lambda: ka_export().check_servable(5)),
        ("timeout", lambda: ka_export().check_servable("/nonexistent", timeout=-1)),
    ],
    "keras_attention.export.saved_model.export_translator": [
        ("translator", lambda: ka_export().export_translator("translator", "/tmp/x")),
        # An existing file is no SavedModel directory (checked before the translator's work).
        ("path", lambda: ka_export().export_translator(_servable(), os.path.abspath(__file__))),
    ],
    "keras_attention.export.causal_lm.export_causal_lm": [
        ("causal_lm", lambda: ka_export().export_causal_lm("causal_lm", "/tmp/x")),
        # An existing file is no SavedModel directory (checked before any tracing).
        ("path", lambda: ka_export().export_causal_lm(_causal_lm(), os.path.abspath(__file__))),
    ],
    "keras_attention.export.warmup.write_warmup_requests": [
        ("saved_model_dir", lambda: ka_export().write_warmup_requests(5, [])),
        ("saved_model_dir", lambda: ka_export().write_warmup_requests("/nonexistent/sm", [])),
        ("requests", lambda: ka_export().write_warmup_requests(HERE, "text")),
    ],
    "keras_attention.export.__main__.main": [
        # The CLI: argparse's own usage errors exit 2 naming the argument.
        ("--verbose", lambda: _cli(["check", "/nonexistent", "--verbose", "x"])),
        ("--verbose", lambda: _cli(["check", "/nonexistent", "--verbose", "5"])),
    ],
    # ------------------------------------------------------ widgets
    "keras_attention.widgets.export.export_html": [
        # The pins: an int was written to as a file descriptor and
        # closed (1 is stdout); None gave `open`'s TypeError.
        ("path", lambda: ka_widgets().export_html(_figure(), 1)),
        ("path", lambda: ka_widgets().export_html(_figure(), None)),
        ("path", lambda: ka_widgets().export_html(_figure(), HERE)),
        ("title", lambda: ka_widgets().export_html(_figure(), "/tmp/x.html", title=3)),
    ],
    "keras_attention.widgets.export.export_png": [
        ("path", lambda: ka_widgets().export_png(_figure(), 1)),
        ("width", lambda: ka_widgets().export_png(_figure(), "/tmp/x.png", width=0)),
    ],
    "keras_attention.widgets.figures.candidate_bars": [
        # The pins: NumPy's and Python's own errors before.
        ("candidates", lambda: ka_widgets().candidate_bars([("a", "high")])),
        ("candidates", lambda: ka_widgets().candidate_bars([("a", 0.5, 1)])),
        ("candidates", lambda: ka_widgets().candidate_bars(5)),
        ("candidates", lambda: ka_widgets().candidate_bars([("a", 1.5)])),
        ("chosen", lambda: ka_widgets().candidate_bars([("a", 0.5)], chosen=1)),
    ],
    "keras_attention.widgets.figures.distribution_bars": [
        ("weights", lambda: ka_widgets().distribution_bars("abc")),
        ("tokens", lambda: ka_widgets().distribution_bars(x(3), ["a"])),
        ("height", lambda: ka_widgets().distribution_bars(x(3), height=-1)),
    ],
    "keras_attention.widgets.figures.head_grid": [
        ("weights", lambda: ka_widgets().head_grid([["a"]])),
        ("weights", lambda: ka_widgets().head_grid(x(2, 2))),
        ("ncols", lambda: ka_widgets().head_grid(x(1, 2, 2), ncols=0)),
    ],
    "keras_attention.widgets.figures.head_view": [
        ("detail_figure", lambda: ka_widgets().head_view("figure")),
        ("detail_figure", lambda: ka_widgets().head_view(ka_widgets().distribution_bars(x(2)))),
        ("width", lambda: ka_widgets().head_view(_figure(), width=0)),
    ],
    "keras_attention.widgets.figures.heatmap": [
        ("weights", lambda: ka_widgets().heatmap(None)),
        # The pin: blamed `heatmap_data`, a helper the user never called.
        ("x_tokens", lambda: ka_widgets().heatmap(np.eye(3), ["a", "b"])),
        ("y_tokens", lambda: ka_widgets().heatmap(np.eye(2), None, "ab")),
        ("width", lambda: ka_widgets().heatmap(np.eye(2), width=2.5)),
    ],
    "keras_attention.widgets.figures.heatmap_source": [
        ("fig", lambda: ka_widgets().heatmap_source("figure")),
        ("fig", lambda: ka_widgets().heatmap_source(_empty_figure())),
    ],
    "keras_attention.widgets.figures.image_heatmap": [
        ("weights", lambda: ka_widgets().image_heatmap({"a": 1})),
        ("max_size", lambda: ka_widgets().image_heatmap(np.eye(2), max_size=0)),
        ("full_shape", lambda: ka_widgets().image_heatmap(np.eye(2), full_shape=(4,))),
    ],
    "keras_attention.widgets.figures.model_view": [
        ("thumbnails", lambda: ka_widgets().model_view(x(1, 1, 2, 2), ["layer"])),
        ("thumbnails", lambda: ka_widgets().model_view([x(2, 2)], ["layer"])),
    ],
    "keras_attention.widgets.figures.weighted_sum": [
        ("values", lambda: ka_widgets().weighted_sum(x(2), "values")),
        ("values", lambda: ka_widgets().weighted_sum(x(2), x(3, 4))),
    ],
    "keras_attention.widgets.decoding_stepper.DecodingStepper": [
        ("translator", lambda: ka_widgets().DecodingStepper("translator", "he hit")),
        ("top_k", lambda: ka_widgets().DecodingStepper(_translator(), "he hit", top_k=0)),
        # The pin: blamed `Seq2SeqTranslator.decoding_session`.
        ("text", lambda: ka_widgets().DecodingStepper(_translator(), "\ud800 5")),
    ],
    "keras_attention.widgets.attention_explorer.AttentionExplorer": [
        ("model", lambda: ka_widgets().AttentionExplorer("model", x(1, 3, 4))),
        ("max_tokens", lambda: ka_widgets().AttentionExplorer(_model(), x(1, 3, 4), max_tokens=1)),
    ],
    "keras_attention.widgets.live_attention.LiveAttention": [
        ("model_or_layer", lambda: ka_widgets().LiveAttention("model", x(1, 3, 4))),
        (
            "every_n_batches",
            lambda: ka_widgets().LiveAttention(_model(), x(1, 3, 4), every_n_batches=0),
        ),
    ],
}

# Layer constructors: one wrong type and one wrong value each; the layer
# fuzz tests (tests/layers/fuzz_test.py, hostile_inputs_test.py) draw many more.
LAYER_CASES = {
    "AdditiveAttention": [("use_scale", {"use_scale": "yes"}), ("dropout", {"dropout": 1.5})],
    "AttentionPooling": [("score", {"score": 3}), ("units", {"units": 0})],
    "CBAM": [("ratio", {"ratio": "8"}), ("kernel_size", {"kernel_size": 0})],
    "LinformerAttention": [
        ("num_heads", {"num_heads": "2", "key_dim": 2, "projected_length": 2, "max_length": 4}),
        (
            "projected_length",
            {"num_heads": 2, "key_dim": 2, "projected_length": 0, "max_length": 4},
        ),
    ],
    "LowRankAttention": [("rank", {"rank": "2"}), ("rank", {"rank": 0})],
    "LuongAttention": [("score_mode", {"score_mode": 3}), ("score_mode", {"score_mode": "dott"})],
    "MultiHeadAttention": [
        ("num_heads", {"num_heads": "2", "key_dim": 2}),
        ("key_dim", {"num_heads": 2, "key_dim": -2}),
        ("rotary", {"num_heads": 2, "key_dim": 2, "rotary": "rope"}),
        ("rotary_fraction", {"num_heads": 2, "key_dim": 2, "rotary": {"rotary_fraction": 0.4}}),
        # #49: odd rotated counts and nested slopes were accepted.
        ("key_dim", {"num_heads": 2, "key_dim": 7, "rotary": True}),
        ("alibi", {"num_heads": 4, "key_dim": 2, "alibi": [[0.5, 0.25], [0.1, 0.05]]}),
        ("qk_norm", {"num_heads": 2, "key_dim": 2, "qk_norm": "rms"}),
        ("query_scale", {"num_heads": 2, "key_dim": 2, "query_scale": 0}),
        ("use_bias", {"num_heads": 2, "key_dim": 2, "use_bias": ["query", "outputs"]}),
        ("score_mod", {"num_heads": 2, "key_dim": 2, "score_mod": lambda score, b: score}),
        ("mask_mod", {"num_heads": 2, "key_dim": 2, "mask_mod": lambda b, h, q: q >= 0}),
    ],
    "PerformerAttention": [
        ("kernel", {"num_heads": 2, "key_dim": 2, "kernel": 3}),
        ("num_features", {"num_heads": 2, "key_dim": 2, "num_features": 0}),
    ],
    "PositionEmbedding": [
        ("sequence_length", {"sequence_length": "4"}),
        ("sequence_length", {"sequence_length": 0}),
    ],
    "RelativePositionBias": [
        ("num_heads", {"num_heads": "2"}),
        ("num_buckets", {"num_heads": 2, "num_buckets": 2}),
    ],
    "RotaryEmbedding": [
        ("max_wavelength", {"max_wavelength": "1e4"}),
        ("scaling", {"scaling": "ntk"}),
        ("original_max_length", {"scaling": "yarn"}),
        ("rotary_fraction", {"rotary_fraction": 1.5}),
        ("interleaved", {"interleaved": "yes"}),
    ],
    "SinusoidalPositionEncoding": [
        ("max_wavelength", {"max_wavelength": "1e4"}),
        ("max_wavelength", {"max_wavelength": -1}),
    ],
    "SparseAttention": [
        ("block_size", {"num_heads": 2, "key_dim": 2, "block_size": "4"}),
        ("block_size", {"num_heads": 2, "key_dim": 2, "block_size": 0}),
    ],
    "SqueezeExcitation": [("ratio", {"ratio": "16"}), ("ratio", {"ratio": 0})],
    "TransformerDecoderBlock": [
        ("intermediate_dim", {"num_heads": 2, "key_dim": 2, "intermediate_dim": "8"}),
        ("intermediate_dim", {"num_heads": 2, "key_dim": 2, "intermediate_dim": 0}),
    ],
    "TransformerEncoderBlock": [
        ("intermediate_dim", {"num_heads": 2, "key_dim": 2, "intermediate_dim": "8"}),
        ("intermediate_dim", {"num_heads": 2, "key_dim": 2, "intermediate_dim": 0}),
    ],
}
for _name, _cases in LAYER_CASES.items():
    _module = getattr(ka, _name).__module__
    CASES[f"{_module}.{_name}"] = [
        (argument, lambda name=_name, kwargs=kwargs: getattr(ka, name)(**kwargs))
        for argument, kwargs in _cases
    ]

# "module.name" -> why it has no cases.
EXEMPT = {
    "keras_attention.layers.base_attention.BaseAttention": (
        "abstract base: its constructor (dropout, seed) is every single-head layer's, "
        "checked through them here and in tests/layers/fuzz_test.py"
    ),
    "keras_attention.layers.score_attention.ScoreAttention": (
        "abstract base of the single-head layers; constructed through them (above)"
    ),
    "keras_attention.layers.base_multi_head_attention.BaseMultiHeadAttention": (
        "abstract base of the multi-head family; constructed through MultiHeadAttention"
    ),
    "keras_attention.layers.machinery.memory_budget.attention_memory_budget": "takes no arguments",
    "keras_attention.widgets.export.find_chromium": "takes no arguments",
    "keras_attention.widgets.notebook.output_notebook": "takes no arguments",
    "keras_attention.models.translator_base.Translator": (
        "abstract base of the two translators, whose constructors are checked above "
        "and in tests/models/translator_fuzz_test.py"
    ),
    "keras_attention.models.decoding.Translation": (
        "a record our translators return (a dataclass), not built from user input"
    ),
    "keras_attention.models.causal_decoding.CausalDecodingStep": (
        "a record a CausalDecodingSession returns (a dataclass), not built from user input"
    ),
    "keras_attention.models.causal_decoding.CacheView": (
        "a record a CausalDecodingStep holds (a dataclass), not built from user input"
    ),
    "keras_attention.models.decoding.DecodingStep": (
        "a record a DecodingSession returns (a dataclass), not built from user input"
    ),
    "keras_attention.export.check.CheckReport": (
        "the record check_servable returns (a dataclass), not built from user input"
    ),
    "keras_attention.export.check.NotASavedModelError": "an exception class",
    "keras_attention.analysis.heads.HeadMaskingResult": (
        "the record mask_least_important_heads returns (a dataclass), not built from user input"
    ),
}


def ka_chart():
    from keras_attention.models import alignment_chart

    return alignment_chart


def ka_export():
    import keras_attention.export

    return keras_attention.export


def ka_widgets():
    import keras_attention.widgets

    return keras_attention.widgets


def _text_encoder(**kwargs):
    from keras_attention.models import TextEncoder

    return TextEncoder(VOCABULARY + ["a", "b"], **kwargs)


def _transformer(**kwargs):
    from keras_attention.models import TransformerTranslator

    return TransformerTranslator(VOCABULARY + ["one", "two"], VOCABULARY + ["1", "2"], **kwargs)


def _servable():
    """Enough of a translator for `export_translator`'s type check."""
    import types

    return types.SimpleNamespace(serving_outputs=lambda *args: None)


def _causal_lm():
    """Enough of a KerasHub causal LM for `export_causal_lm`'s type check."""

    class CausalLM(keras.Model):
        def call_with_cache(self, token_ids, cache, cache_update_index):
            return None

        def _build_cache(self, token_ids):
            return None

        def generate_step(self, inputs, stop_token_ids=None):
            return None

    causal_lm = CausalLM()
    causal_lm.built = True
    return causal_lm


def _decoding_session(*args, **kwargs):
    from keras_attention.models import DecodingSession

    return DecodingSession(*args, **kwargs)


def _empty_figure():
    from bokeh.plotting import figure

    return figure()


def _ring(mesh=None, balance="auto", length=2):
    from keras_attention.ops.ring import ring_attention

    q = x(1, length, 1, 2)
    return ring_attention(q, q, q, mesh=_mesh() if mesh is None else mesh, balance=balance)


def _cli(argv):
    from keras_attention.export.__main__ import main

    main(argv)


def _name(path):
    """The name a message must carry: the class or function the user called."""
    name = path.rsplit(".", 1)[-1]
    # Users open a session with `translator.decoding_session(...)`, the name
    # its errors carry.
    return {"main": "keras-attention", "DecodingSession": "decoding_session"}.get(name, name)


def test_every_public_callable_has_cases_or_an_exemption():
    public = public_callables()
    missing = sorted(set(public) - set(CASES) - set(EXEMPT))
    assert not missing, f"public callables with no refusal cases and no exemption: {missing}"
    # Every entry names a public callable (a renamed one is noticed), and an
    # exemption is never also tested nor left without its reason.
    assert not (set(CASES) | set(EXEMPT)) - set(public) - {"keras_attention.export.__main__.main"}
    assert not set(CASES) & set(EXEMPT)
    assert all(reason.strip() for reason in EXEMPT.values())


def _group(path):
    """The public module a callable belongs to (one test each: Keras' session
    reset after every test costs ~1 s, more than all of a group's cases)."""
    return next(g for g in GROUPS if path.startswith(g))


GROUPS = [
    "keras_attention.ops",
    "keras_attention.analysis",
    "keras_attention.layers",
    "keras_attention.distribution",
    "keras_attention.models",
    "keras_attention.export",
    "keras_attention.interchange",
    "keras_attention.widgets",
]


@pytest.mark.parametrize("group", GROUPS)
def test_bad_arguments_are_refused_naming_the_callable_and_the_argument(group, capsys):
    for path in sorted(p for p in CASES if _group(p) == group):
        _check_cases(path, capsys)


# What user functions return (#49): a `mask_mod` or `score_mod` whose result
# is wrong is refused by the call that runs it, naming the callable the user
# built, the argument and what the function returned, on each kernel the
# selector can pick for it (forced here by argument).
def _mod_call(kernel, **mods):
    layer = ka.MultiHeadAttention(
        2, 4, memory_efficient=kernel == "blockwise", block_size=4, **mods
    )
    return layer(x(1, 6, 4), x(1, 6, 4))


RETURNED = {
    "additive mask_mod": (
        "mask_mod",
        dict(mask_mod=lambda b, h, q, k: keras.ops.where(k <= q, 0.0, float("-inf"))),
    ),
    "mask_mod of a column less": ("mask_mod", dict(mask_mod=lambda b, h, q, k: (k <= q)[..., 1:])),
    "integer score_mod": ("score_mod", dict(score_mod=lambda s, b, h, q, k: q + k)),
}


@pytest.mark.parametrize("kernel", ["dense", "blockwise"])
@pytest.mark.parametrize("case", sorted(RETURNED))
def test_what_user_functions_return_is_refused_naming_the_callable(case, kernel):
    argument, mods = RETURNED[case]
    with pytest.raises((ValueError, TypeError)) as raised:
        _mod_call(kernel, **mods)
    message = str(raised.value)
    # Keras prefixes an error raised inside a layer's call with its own line.
    message = message.split("\x1b[1m", 1)[-1]
    assert message.startswith(f"MultiHeadAttention: `{argument}` <lambda> "), message
    assert "Received" in message, message


def _check_cases(path, capsys):
    assert len(CASES[path]) >= 2, f"{path}: at least one wrong-type and one wrong-value case"
    for argument, call in CASES[path]:
        if path.endswith("__main__.main"):
            with pytest.raises(SystemExit) as raised:
                call()
            assert raised.value.code == 2
            message = capsys.readouterr().err
        else:
            with pytest.raises((ValueError, TypeError)) as raised:
                call()
            message = str(raised.value)
        # The message starts with the name (a helper's, `heatmap_data`, is not
        # `heatmap`); a method's carries its class (`Seq2SeqTranslator.decoding_session`).
        starts = re.match(rf"(\w+\.)?{re.escape(_name(path))}\b", message)
        assert starts or path.endswith("main"), (path, argument, message)
        assert _name(path) in message, (path, argument, message)
        assert argument in message, (path, argument, message)
        assert "Received" in message or path.endswith("main"), (path, argument, message)


def test_counts():
    """The walk's counts, printed for the record (`-s`)."""
    public = public_callables()
    print(f"public callables: {len(public)}, with cases: {len(CASES)}, exempt: {len(EXEMPT)}")
    assert len(CASES) + len(EXEMPT) >= len(public)
