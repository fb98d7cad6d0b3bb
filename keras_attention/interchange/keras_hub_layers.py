"""KerasHub's per-family attention layers as configurations of ours (#37).

`configuration(layer)` reads a built KerasHub attention layer's configuration
from the instance (and refuses, by class and attribute, what ours cannot
compute); `assign` copies its weights into our `MultiHeadAttention`
(`MultiHeadAttention.from_keras_hub` uses both); `to_keras_hub_cache` /
`from_keras_hub_cache` convert a decoding cache between the two layouts.
Whole backbones and causal LMs are swapped by `keras_hub_models`.

KerasHub is never imported here: layers are recognised by their class names,
so `keras_attention` works without it.
What each family computes (KerasHub 0.32, read from its code):

| class | ours |
| --- | --- |
| `LlamaAttention` | rotary (Llama 3.1's scaling when set), GQA, no biases |
| `CachedMistralAttention` | rotary (linear); its window is in the decoder's mask |
| `CachedGemmaAttention` | rotary on pairs `(2i, 2i + 1)` (features permuted), soft cap, window |
| `CachedGemma3Attention` | + QK-norm (`1 + scale`), its rotary wavelength and scaling |
| `GptOssAttention` | rotary (YaRN), learned sinks, biases, a window of `W + 1` keys |
| `FalconAttention` | ALiBi added before the scale (slopes / sqrt(D)), biases |
| `BloomAttention` | ALiBi after the scale, biases |
| `QwenAttention` | rotary, biases on query, key and value only, window |
| `Qwen3Attention` | rotary, QK-norm, window |

The decoders give these layers a causal (and padding) `attention_mask`; the
windows and ALiBi above are measured under it. ALiBi as KerasHub writes it
(`slope * key_position`) differs from ours (`-slope * |q - k|`) by a constant
per row where keys precede queries, so the two agree under the causal mask.
"""

import math

import numpy as np
from keras import ops

from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.ops.score_modifier import alibi_slopes

__all__ = ["from_keras_hub_cache", "to_keras_hub_cache"]

FAMILIES = (
    "LlamaAttention",
    "CachedMistralAttention",
    "CachedGemmaAttention",
    "CachedGemma3Attention",
    "GptOssAttention",
    "FalconAttention",
    "BloomAttention",
    "QwenAttention",
    "Qwen3Attention",
)

# Where each decoder block keeps its attention layer.
ATTENTION_ATTRIBUTES = (
    "_self_attention_layer",
    "self_attention_layer",
    "attention",
    "attention_layer",
)


def family_of(layer, owner="MultiHeadAttention.from_keras_hub"):
    """The KerasHub class name `layer` is (or derives from), else TypeError."""
    for klass in type(layer).__mro__:
        if klass.__name__ in FAMILIES and klass.__module__.startswith("keras_hub"):
            return klass.__name__
    raise TypeError(
        f"{owner}: `layer` must be one of KerasHub's attention layers "
        f"({', '.join(FAMILIES)}). Received: layer of type {type(layer).__name__}"
    )


def _refuse(owner, family, attribute, value, why):
    raise ValueError(
        f"{owner}: {family}.{attribute}={value!r} is not supported ({why}). "
        f"Received: a {family} with {attribute}={value!r}"
    )


def _array(variable):
    return np.asarray(ops.convert_to_numpy(variable))


def _linear_rotary(wavelength, factor):
    scaling = None if float(factor) == 1.0 else "linear"
    return RotaryEmbedding(
        max_wavelength=float(wavelength), scaling=scaling, scaling_factor=float(factor)
    )


def configuration(layer, owner="MultiHeadAttention.from_keras_hub"):
    """`(family, constructor arguments of ours, weights)`, where `weights`
    maps our sublayer names to arrays in our layouts."""
    family = family_of(layer, owner)
    if not layer.built:
        raise ValueError(
            f"{owner}: `layer` must be built (call it once or `build` it). "
            f"Received: an unbuilt {family}"
        )
    read = _READERS[family]
    return (family,) + read(layer, owner, family)


def _einsum_weights(query, key, value, output, heads_first=False):
    """Our `query`/`key`/`value`/`attention_output` weights from KerasHub's
    EinsumDense sublayers (Gemma's kernels put heads first)."""
    weights = {}
    for name, dense in (("query", query), ("key", key), ("value", value), ("output", output)):
        kernel = _array(dense.kernel)
        if heads_first and name != "output":  # (H, M, D) -> (M, H, D)
            kernel = np.transpose(kernel, (1, 0, 2))
        weights[f"{name}/kernel"] = kernel
        bias = getattr(dense, "bias", None)
        if bias is not None:
            weights[f"{name}/bias"] = _array(bias)
    return weights


def _check_dropout(owner, family, attribute, rate, on_probabilities):
    """KerasHub drops the attention output in some families, ours the
    weights: a nonzero rate carries over only where both drop the weights."""
    if rate and not on_probabilities:
        _refuse(
            owner,
            family,
            attribute,
            rate,
            "it drops the attention output, ours the attention weights",
        )
    return float(rate or 0.0)


def _llama_like(layer, owner, family):
    """Llama, Mistral, Qwen, Qwen 3: `_query_dense` ... `_output_dense`."""
    heads = layer.num_query_heads if family != "CachedMistralAttention" else layer._num_query_heads
    kv_heads = (
        layer.num_key_value_heads
        if family != "CachedMistralAttention"
        else layer._num_key_value_heads
    )
    kernel = _array(layer._query_dense.kernel)  # (M, H, D)
    head_dim = kernel.shape[-1]
    dropout = layer.dropout if family != "CachedMistralAttention" else layer._dropout
    args = dict(
        num_heads=heads,
        key_dim=head_dim,
        num_key_value_heads=kv_heads,
        dropout=_check_dropout(owner, family, "dropout", dropout, False),
        use_bias=False,
    )
    if family == "LlamaAttention":
        rotary = dict(max_wavelength=float(layer.rope_max_wavelength))
        if layer.rope_low_freq_factor is not None:
            # Llama 3.1's bands; KerasHub's `rope_position_scaling_factor` is
            # not read by its Llama rotary layer, so it changes nothing there.
            rotary.update(
                scaling="llama3",
                scaling_factor=float(layer.rope_frequency_adjustment_factor),
                low_freq_factor=float(layer.rope_low_freq_factor),
                high_freq_factor=float(layer.rope_high_freq_factor),
                original_max_length=int(layer.rope_pretraining_sequence_length),
            )
        args["rotary"] = RotaryEmbedding(**rotary)
    elif family == "CachedMistralAttention":
        # Mistral's window is in the mask its decoder builds, not the layer.
        args["rotary"] = _linear_rotary(layer._rope_max_wavelength, layer._rope_scaling_factor)
    else:
        args["rotary"] = _linear_rotary(layer.rope_max_wavelength, layer.rope_scaling_factor)
    if family == "QwenAttention":
        args["use_bias"] = ("query", "key", "value")
        if layer.use_sliding_window_attention:
            args["sliding_window"] = int(layer.sliding_window_size)
    if family == "Qwen3Attention":
        args.update(qk_norm=True, qk_norm_epsilon=float(layer.layer_norm_epsilon))
        if layer.sliding_window_size:
            args["sliding_window"] = int(layer.sliding_window_size)
    weights = _einsum_weights(
        layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense
    )
    if family == "Qwen3Attention":
        weights["query_norm/scale"] = _array(layer._query_dense_layer_norm.scale)
        weights["key_norm/scale"] = _array(layer._key_dense_layer_norm.scale)
    return args, weights


def _gemma(layer, owner, family):
    """Gemma and Gemma 3: heads-first kernels, the query scaled before the
    scores, a soft cap, a window, and (Gemma 3) QK-norm with `1 + scale`."""
    query = _array(layer.query_dense.kernel)  # (H, M, D)
    hidden = query.shape[1]
    scale = 1.0 / math.sqrt(
        layer.head_dim if layer.query_head_dim_normalize else hidden // layer.num_query_heads
    )
    args = dict(
        num_heads=layer.num_query_heads,
        key_dim=layer.head_dim,
        num_key_value_heads=layer.num_key_value_heads,
        dropout=_check_dropout(owner, family, "dropout", layer.dropout, True),
        use_bias=False,
        query_scale=scale,
    )
    if layer.logit_soft_cap:
        args["logit_soft_cap"] = float(layer.logit_soft_cap)
    if layer.use_sliding_window_attention:
        args["sliding_window"] = int(layer.sliding_window_size)
    weights = _einsum_weights(
        layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense, heads_first=True
    )
    if family == "CachedGemmaAttention":
        # Gemma rotates halves, then interleaves them (`_gemma_permutation`):
        # the same as turning pairs (2i, 2i + 1) of projections whose
        # features are so permuted. Ours writes keys in Gemma's cache order,
        # and a KerasHub cache is ours as it is, with no per-step gather.
        order = _gemma_permutation(layer.head_dim)
        for name in ("query/kernel", "key/kernel"):
            weights[name] = weights[name][..., order]
        args["rotary"] = RotaryEmbedding(max_wavelength=10000.0, interleaved=True)
        return args, weights
    if layer.use_bidirectional_attention:
        _refuse(
            owner,
            family,
            "use_bidirectional_attention",
            True,
            "its centred window has no counterpart in ours yet",
        )
    args["rotary"] = _linear_rotary(layer.rope_wavelength, layer.rope_scaling_factor)
    if layer.use_query_key_norm:
        args.update(qk_norm=True, qk_norm_epsilon=float(layer.layer_norm_epsilon))
        # Gemma's RMSNorm multiplies by `1 + scale`; ours by `scale`.
        weights["query_norm/scale"] = 1.0 + _array(layer.query_norm.scale)
        weights["key_norm/scale"] = 1.0 + _array(layer.key_norm.scale)
    return args, weights


def _gpt_oss(layer, owner, family):
    """GPT-OSS: biases everywhere, YaRN rotary, learned sinks, and a window
    that keeps `W + 1` keys (`j >= i - W`)."""
    head_dim = _array(layer.query_dense.kernel).shape[-1]
    factor = float(layer.rope_scaling_factor)
    rotary = dict(max_wavelength=float(layer.rope_max_wavelength))
    if factor != 1.0:
        rotary.update(
            scaling="yarn",
            scaling_factor=factor,
            original_max_length=4096,
            beta_fast=32.0,
            beta_slow=1.0,
            yarn_truncate=False,
        )
    args = dict(
        num_heads=layer.num_query_heads,
        key_dim=head_dim,
        num_key_value_heads=layer.num_key_value_heads,
        dropout=_check_dropout(owner, family, "dropout", layer.dropout, False),
        use_bias=True,
        rotary=RotaryEmbedding(**rotary),
        attention_sinks=True,
    )
    if layer.sliding_window is not None and layer.sliding_window > 0:
        args["sliding_window"] = int(layer.sliding_window) + 1
    weights = _einsum_weights(
        layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense
    )
    weights["sinks"] = _array(layer.sinks)
    return args, weights


def _alibi_family(layer, owner, family):
    """Falcon and BLOOM: plain multi-head attention with ALiBi; the output
    projection is a `Dense` over the concatenated heads."""
    if family == "FalconAttention":
        dense = (layer.query_dense, layer.key_dense, layer.value_dense)
        output, rate = layer.output_dense, layer.attention_dropout_rate
        dropout = _check_dropout(owner, family, "attention_dropout_rate", rate, True)
    else:
        dense = (layer._query_dense, layer._key_dense, layer._value_dense)
        output = layer._output_dense
        # BLOOM drops the weights and the layer's output with one rate.
        dropout = _check_dropout(owner, family, "dropout", layer.dropout, False)
    heads = layer.num_heads
    head_dim = _array(dense[0].kernel).shape[-1]
    if family == "FalconAttention":
        # Falcon adds the bias before the 1 / sqrt(D) scale.
        slopes = [s / math.sqrt(head_dim) for s in alibi_slopes(heads)]
    else:
        slopes = alibi_slopes(heads, float(layer._alibi_layer.alibi_bias_max))
    args = dict(
        num_heads=heads,
        key_dim=head_dim,
        dropout=dropout,
        use_bias=True,
        alibi=slopes,
    )
    weights = {}
    for name, sublayer in zip(("query", "key", "value"), dense, strict=True):
        weights[f"{name}/kernel"] = _array(sublayer.kernel)
        weights[f"{name}/bias"] = _array(sublayer.bias)
    kernel = _array(output.kernel)  # (H D, M) -> (H, D, M)
    weights["output/kernel"] = kernel.reshape(heads, head_dim, kernel.shape[-1])
    weights["output/bias"] = _array(output.bias)
    return args, weights


_READERS = {
    "LlamaAttention": _llama_like,
    "CachedMistralAttention": _llama_like,
    "QwenAttention": _llama_like,
    "Qwen3Attention": _llama_like,
    "CachedGemmaAttention": _gemma,
    "CachedGemma3Attention": _gemma,
    "GptOssAttention": _gpt_oss,
    "FalconAttention": _alibi_family,
    "BloomAttention": _alibi_family,
}


def assign(ours, weights):
    """Copies `weights` (our sublayer names) into a built `ours`."""
    sublayers = {
        "query": ours._query_dense,
        "key": ours._key_dense,
        "value": ours._value_dense,
        "output": ours._output_dense,
    }
    for name, value in weights.items():
        if name == "sinks":
            ours.sinks.assign(value)
            continue
        sublayer, variable = name.split("/")
        if sublayer in ("query_norm", "key_norm"):
            getattr(ours, f"_{sublayer}").scale.assign(value)
            continue
        getattr(sublayers[sublayer], variable).assign(
            np.reshape(value, getattr(sublayers[sublayer], variable).shape)
        )


# ----------------------------------------------------------------- caches
def _gemma_permutation(head_dim):
    """Gemma interleaves the rotated halves (`x[:d/2], x[d/2:]` -> pairs) of
    its queries and keys: its feature `2i` is the projection's `i`, `2i + 1`
    the projection's `i + d/2` (`x[..., order]` puts `x` in Gemma's order)."""
    half = head_dim // 2
    order = np.empty(head_dim, "int64")
    order[0::2] = np.arange(half)
    order[1::2] = np.arange(half) + half
    return order


def _theirs_from_ours(cache, family):
    """Our `(B, 2, T_max, Hkv, D)` cache in `family`'s layout: the same
    tensor (Gemma's too: ours keeps its keys in its feature order), or Gemma
    3's `(keys, values)` pair."""
    if family == "CachedGemma3Attention":
        return cache[:, 0], cache[:, 1]
    return cache


def _ours_from_theirs(cache, family):
    """`family`'s cache in our `(B, 2, T_max, Hkv, D)` layout."""
    if family == "CachedGemma3Attention":
        return ops.stack(list(cache), axis=1)
    return cache


def to_keras_hub_cache(cache, layer):
    """Our `(B, 2, T_max, Hkv, D)` cache in `layer`'s layout (a KerasHub
    attention layer): the same tensor for most families (Gemma's too: ours
    built by `from_keras_hub` writes keys in Gemma's interleaved feature
    order), Gemma 3's `(keys, values)` tuple."""
    family = family_of(layer, "to_keras_hub_cache")
    _check_cache_shape("to_keras_hub_cache", cache)
    return _theirs_from_ours(cache, family)


def from_keras_hub_cache(cache, layer):
    """A cache made by `layer` (a KerasHub attention layer) in our
    `(B, 2, T_max, Hkv, D)` layout (see `to_keras_hub_cache`)."""
    family = family_of(layer, "from_keras_hub_cache")
    if family == "CachedGemma3Attention" and (
        not isinstance(cache, (tuple, list)) or len(cache) != 2
    ):
        raise TypeError(
            "from_keras_hub_cache: a CachedGemma3Attention cache is a "
            f"(keys, values) pair. Received: cache={type(cache).__name__}"
        )
    if family != "CachedGemma3Attention":
        _check_cache_shape("from_keras_hub_cache", cache)
    return _ours_from_theirs(cache, family)


def _check_cache_shape(owner, cache):
    shape = tuple(getattr(cache, "shape", ()))
    if len(shape) != 5 or shape[1] != 2:
        raise ValueError(
            f"{owner}: `cache` must be (batch, 2, max_length, heads, head_dim). "
            f"Received: cache with shape {shape}"
        )
