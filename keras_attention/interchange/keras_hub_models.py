"""KerasHub backbones and causal LMs on our attention (#37, #49, #51).

`replace_keras_hub_attention(model)` swaps every attention layer of a built
backbone (or a causal LM's) for ours (`MultiHeadAttention.from_keras_hub`,
`keras_hub_layers`), each wrapped in `KerasHubAttention`, which takes a
KerasHub decoder's call signature. Each decoder block hands its mask to ours
as rules (`use_mask_rules`), a causal LM's `generate` keeps window-sized
caches (`use_window_caches`, `generation_cache`), the compiled functions that
traced KerasHub's layers are reset, and the swap is recorded in the
backbone's config so that a `.keras` file loads with ours
(`KerasHubBackboneOnOurAttention`).

KerasHub is never imported here: layers are recognised by their class names,
so `keras_attention` works without it.
"""

import inspect

import keras
from keras import ops
from keras.src.backend import get_keras_mask

from keras_attention.interchange.keras_hub_layers import ATTENTION_ATTRIBUTES
from keras_attention.interchange.keras_hub_layers import family_of
from keras_attention.interchange.keras_hub_layers import from_keras_hub_cache
from keras_attention.interchange.keras_hub_layers import to_keras_hub_cache
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.ops import cache as ring_cache

__all__ = ["from_keras_hub_cache", "replace_keras_hub_attention", "to_keras_hub_cache"]


# ------------------------------------------------- decoder masks as rules
class DecoderMaskRules:
    """What a KerasHub decoder block's attention mask says, kept as rules:
    causal (at the cache index under a cache), and `key_mask` `(B, Tk)`
    (the padding mask, KerasHub's key mask), or None. The swap makes each
    block return this instead of its dense `(B, Tq, Tk)` mask
    (`use_mask_rules`), and `KerasHubAttention` hands it to ours as
    `key_mask=` and `use_causal_mask=True`, so no `Tq x Tk` tensor is built;
    the windows are our layer's own (`sliding_window`)."""

    def __init__(self, key_mask=None):
        self.key_mask = key_mask

    def arguments(self):
        """Our layer's call arguments for these rules."""
        return {"key_mask": self.key_mask, "use_causal_mask": True}


# Each decoder block's mask method (by family: Llama, Mistral, Qwen, Qwen 3
# and GPT-OSS name the first, Gemma, Gemma 3 and BLOOM the second).
MASK_METHODS = ("_compute_self_attention_mask", "_compute_attention_mask")
# Their arguments' names in each family, read by name.
_SEQUENCE = ("decoder_sequence", "x")
_PADDING = ("decoder_padding_mask", "padding_mask")
_CACHE = ("self_attention_cache", "cache")


def _named(arguments, names):
    return next((arguments[name] for name in names if name in arguments), None)


def _cache_length(cache):
    """Key slots of a block's cache: `(B, 2, T, Hkv, D)`, or Gemma 3's
    `(keys, values)` with keys `(B, T, Hkv, D)`."""
    if isinstance(cache, (tuple, list)):
        return cache[0].shape[1]
    return cache.shape[2]


def mask_rules(arguments):
    """`DecoderMaskRules` for a block's mask method called with
    `arguments` (by name), or None where the mask says more than causal
    and padding (a custom `decoder_attention_mask`, Gemma 3's image
    tokens, BLOOM without its causal mask, a padding mask that does not
    cover a cache's keys): that call builds KerasHub's dense mask."""
    if arguments.get("decoder_attention_mask") is not None:
        return None
    if arguments.get("vision_mask") is not None:
        return None
    if not arguments.get("use_causal_mask", True):
        return None  # BLOOM's ALiBi equals ours under the causal mask only
    sequence = _named(arguments, _SEQUENCE)
    padding = _named(arguments, _PADDING)
    if padding is None and sequence is not None:
        padding = get_keras_mask(sequence)  # KerasHub's fallback, as merged there
    cache = _named(arguments, _CACHE)
    if padding is not None and cache is not None:
        # KerasHub's padding mask masks keys: under a cache it must span it.
        slots, length = _cache_length(cache), padding.shape[-1]
        if slots is None or length != slots:
            return None
    return DecoderMaskRules(padding)


def use_mask_rules(block):
    """Makes `block` (a KerasHub decoder block) return `DecoderMaskRules`
    from its mask method where `mask_rules` can say what its mask says;
    the method is replaced on the instance only, and the original runs
    otherwise. True when `block` has such a method."""
    for name in MASK_METHODS:
        original = getattr(type(block), name, None)
        if original is None:
            continue
        signature = inspect.signature(original)

        def rules_or_dense(*args, _original=original, _signature=signature, **kwargs):
            bound = _signature.bind(block, *args, **kwargs)
            bound.apply_defaults()
            rules = mask_rules(bound.arguments)
            return _original(block, *args, **kwargs) if rules is None else rules

        # An instance attribute, not Keras-tracked state: the block's config
        # and weights are unchanged.
        object.__setattr__(block, name, rules_or_dense)
        return True
    return False


def _attention_arguments(attention_mask):
    """Our layer's mask arguments for what a decoder block passed."""
    if isinstance(attention_mask, DecoderMaskRules):
        return attention_mask.arguments()
    return {"attention_mask": attention_mask}


def _block_arguments(block, family):
    """Constructor arguments of ours that a family keeps in its decoder
    block: Mistral's window is in the block's mask, not its attention."""
    window = getattr(block, "sliding_window", None)
    if family == "CachedMistralAttention" and window:
        return {"sliding_window": int(window)}
    return {}


# ------------------------------------------------------- in a backbone
class KerasHubAttention(keras.layers.Layer):
    """Our `MultiHeadAttention` behind a KerasHub decoder's call signature
    (`hidden_states` or `x`, `attention_mask`, `cache`, `cache_update_index`,
    Gemma 3's `cache_update_mask`), with its cache layout, so a decoder
    block calls it as its own attention layer (`replace_keras_hub_attention`).
    """

    def __init__(self, attention, family, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention
        self.family = family

    def build(self, input_shape=None):
        self.built = True

    def call(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        cache_update_mask=None,
        training=None,
    ):
        masks = _attention_arguments(attention_mask)
        # Gemma 3's decoder passes index 0 for its uncached call's default.
        if cache is None:
            return self.attention(hidden_states, training=training, **masks)
        if cache_update_mask is not None and cache_update_index is not None:
            masks["cache_update_mask"] = _rows_to_write(
                cache_update_mask, cache_update_index, ring_cache.cache_slots(cache)
            )
        # Ours reads every family's cache as it is, Gemma 3's (keys, values)
        # pair too (no per-step conversion, `to_keras_hub_cache`), and writes
        # only the rows of Gemma 3's `cache_update_mask` before attending,
        # as KerasHub's layer.
        return self.attention(
            hidden_states,
            cache=cache,
            cache_update_index=cache_update_index,
            training=training,
            **masks,
        )


def _rows_to_write(cache_update_mask, index, slots):
    """Gemma 3's `cache_update_mask` `(B, Tq)` (prompt tokens fed again keep
    their prefill keys), or every row once a window's ring
    (`use_window_caches`) wraps, where the slot held another position (text
    only: the rewritten keys are the prefill's)."""
    length = ops.shape(cache_update_mask)[1]
    wrapped = ops.cast(index, "int32") + length > slots
    return ops.logical_or(ops.cast(cache_update_mask, "bool"), wrapped)


# -------------------------------------------- window caches in `generate`
def _ring_from_full(cache, layer, written):
    """`layer`'s cache (a `KerasHubAttention`'s: Gemma 3's `(keys, values)`
    pair, or one `(B, 2, T, Hkv, D)` tensor), filled by position, as the
    ring our layer reads once positions `0 .. written - 1` are written
    (`ops.cache.ring_positions`): the `sliding_window` (plus sink) slots, or
    `cache` itself where the window is none or as long."""
    slots = _window_slots(layer)
    length = ring_cache.cache_slots(cache)
    if slots is None or length is None or slots >= length:
        return cache
    positions = ring_cache.ring_positions(slots, written, layer.attention.sink_tokens or 0)
    if ring_cache.is_pair(cache):
        return tuple(ops.take(part, positions, axis=1) for part in cache)
    return ops.take(cache, positions, axis=2)


def _window_slots(layer):
    """The slots a window's ring needs for one-token steps (the window plus
    the sinks), or None for a layer without a window."""
    window = layer.attention.sliding_window
    return None if window is None else window + (layer.attention.sink_tokens or 0)


def _first_step_index(padding_mask):
    """Where KerasHub's sampler starts: the shortest prompt's length (its
    first step writes position `index - 1`, so the ring holds what a cache
    written up to `index` holds)."""
    return ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))


def _use_pair_window_caches(causal_lm, layers):
    """Gemma 3: KerasHub's `_build_cache` fills one `(keys, values)` pair
    of `max_length` slots per layer with the prefill, and its sampler
    carries the tuple through its loop whatever each pair's length; here,
    on the instance, each pair of a layer with a window is then cut to its
    ring before the first decoding step. With images the caches stay full:
    their update mask keeps the prefill's image keys at their positions."""
    original = type(causal_lm)._build_cache

    def build_cache(token_ids, img_embeddings, vision_mask, padding_mask, vision_indices):
        hidden, cache = original(
            causal_lm, token_ids, img_embeddings, vision_mask, padding_mask, vision_indices
        )
        if img_embeddings is not None:
            return hidden, cache
        index = _first_step_index(padding_mask)
        return hidden, tuple(
            _ring_from_full(pair, layer, index) for pair, layer in zip(cache, layers, strict=True)
        )

    object.__setattr__(causal_lm, "_build_cache", build_cache)


# The causal LMs whose `_build_cache` stacks every layer's cache in one
# `(B, num_layers, 2, T, Hkv, D)` tensor and whose layers can have a window
# (KerasHub 0.32): how `call_with_cache` calls a block (its cache arguments)
# and whether it scales the token embeddings by sqrt(hidden_dim) (Gemma).
_STACKED_CACHE_LMS = {
    "GemmaCausalLM": ("cache", "cache_update_index", True),
    "MistralCausalLM": ("self_attention_cache", "self_attention_cache_update_index", False),
    "GptOssCausalLM": ("self_attention_cache", "self_attention_cache_update_index", False),
    "QwenCausalLM": ("self_attention_cache", "self_attention_cache_update_index", False),
    "Qwen3CausalLM": ("self_attention_cache", "self_attention_cache_update_index", False),
}


def _stacked_cache_calls(causal_lm):
    for klass in type(causal_lm).__mro__:
        if klass.__name__ in _STACKED_CACHE_LMS and klass.__module__.startswith("keras_hub"):
            return _STACKED_CACHE_LMS[klass.__name__]
    return None


def _use_stacked_window_caches(causal_lm, layers, calls):
    """Gemma (2), Mistral, GPT-OSS, Qwen, Qwen 3: KerasHub's `_build_cache`
    fills one `(B, num_layers, 2, T, Hkv, D)` tensor, which its
    `call_with_cache` slices per layer and stacks again at every step. In
    `generate` (where the prompts' padding mask says where the sampler
    starts) the prefill's tensor is split instead into a tuple of one
    `(B, 2, slots, Hkv, D)` cache per layer: a window's ring on local
    layers (`sliding_window` slots, plus sinks), `T` slots on the others;
    `call_with_cache` given such a tuple calls each block with its own and
    returns the tuple (no per-step stack of every layer's cache). Called
    without a padding mask in scope (the export's prefill, a direct
    `_build_cache(token_ids)`), both keep KerasHub's stacked tensor."""
    cache_argument, index_argument, scaled_embedding = calls
    kind = type(causal_lm)
    build_original, call_original = kind._build_cache, kind.call_with_cache
    generate_original = kind.generate_step
    prompt_masks = []  # the padding mask of the `generate_step` being traced

    def generate_step(inputs, *args, **kwargs):
        prompt_masks.append(inputs["padding_mask"])
        try:
            return generate_original(causal_lm, inputs, *args, **kwargs)
        finally:
            prompt_masks.pop()

    def build_cache(token_ids, padding_mask=None):
        hidden, cache = build_original(causal_lm, token_ids)
        length = token_ids.shape[1]
        slots = [_window_slots(layer) for layer in layers]
        if padding_mask is None and prompt_masks:
            padding_mask = prompt_masks[-1]
        if padding_mask is None or length is None or all(s is None or s >= length for s in slots):
            return hidden, cache
        index = _first_step_index(padding_mask)
        return hidden, tuple(
            _ring_from_full(cache[:, i], layer, index) for i, layer in enumerate(layers)
        )

    def call_with_cache(token_ids, cache, cache_update_index):
        if not isinstance(cache, (tuple, list)):
            return call_original(causal_lm, token_ids, cache, cache_update_index)
        backbone = causal_lm.backbone
        x = backbone.token_embedding(token_ids)
        if scaled_embedding:
            x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
        caches = []
        for block, layer_cache in zip(backbone.transformer_layers, cache, strict=True):
            x, layer_cache = block(
                x, **{cache_argument: layer_cache, index_argument: cache_update_index}
            )[:2]
            caches.append(layer_cache)
        hidden_states = x = backbone.layer_norm(x)
        logits = backbone.token_embedding(x, reverse=True)
        return logits, hidden_states, tuple(caches)

    for name, method in (
        ("generate_step", generate_step),
        ("_build_cache", build_cache),
        ("call_with_cache", call_with_cache),
    ):
        object.__setattr__(causal_lm, name, method)


def generation_cache(causal_lm, token_ids, padding_mask):
    """`(hidden_states, cache)` as the swapped causal LM's `generate` starts
    from prompts `token_ids` with `padding_mask`: KerasHub's prefill, cut to
    window rings where `use_window_caches` applies (the decoding stepper
    steps from it with `call_with_cache`)."""
    kind = type(causal_lm)
    if "padding_mask" in inspect.signature(kind._build_cache).parameters:  # Gemma 3
        return causal_lm._build_cache(token_ids, None, None, padding_mask, None)
    if causal_lm.__dict__.get("_build_cache") is not None:  # window caches on this instance
        return causal_lm._build_cache(token_ids, padding_mask)
    return causal_lm._build_cache(token_ids)


def use_window_caches(causal_lm, layers):
    """Makes a causal LM's `generate` keep its local layers' caches at
    window size: rings of `sliding_window` slots (plus sinks) that our
    layer addresses by absolute position (`MultiHeadAttention`'s
    `cache=`), cut from the prefill's cache where KerasHub's sampler starts
    (`min(prompt lengths)`). `layers` are the blocks' `KerasHubAttention`,
    in order. True when the causal LM is one this covers (Gemma 3's pair
    per layer, or a stacked cache of `_STACKED_CACHE_LMS`) and a layer has
    a window; methods are replaced on the instance only."""
    if not any(_window_slots(layer) is not None for layer in layers):
        return False  # also for an empty `layers`
    if layers[0].family == "CachedGemma3Attention":
        _use_pair_window_caches(causal_lm, layers)
        return True
    calls = _stacked_cache_calls(causal_lm)
    if calls is None:
        return False
    _use_stacked_window_caches(causal_lm, layers, calls)
    return True


# Keras' compiled functions and KerasHub's `generate`: set to None, each is
# traced again on its next call, as `make_*_function(force=True)` would.
COMPILED_FUNCTIONS = ("train_function", "test_function", "predict_function", "generate_function")
# Where a swapped backbone's config records the swap.
SWAP_CONFIG_KEY = "keras_attention_swap"
# 2: Gemma's query / key features in Gemma's order, rotary interleaved. Files
# of format 1 of the classes below hold other weights under the same names.
SWAP_FORMAT = 2
_FORMAT_2_CLASSES = ("GemmaBackbone",)
_SWAPPED_CLASSES = {}  # KerasHub backbone class -> its swapped subclass


@keras.saving.register_keras_serializable(package="keras_attention")
class KerasHubBackboneOnOurAttention:
    """What `replace_keras_hub_attention` makes a KerasHub backbone: the
    same class (a subclass made per KerasHub class, with its name) whose
    config is KerasHub's plus the swap (`SWAP_CONFIG_KEY`: KerasHub's class
    and the constructor overrides). `from_config` builds KerasHub's backbone
    and swaps again, so a `.keras` file of the backbone or of its causal LM
    loads with our layers in place before Keras loads their weights.
    Loading needs `import keras_attention` (this registration) and KerasHub.
    """

    def get_config(self):
        config = super().get_config()
        base = self._keras_hub_class
        config[SWAP_CONFIG_KEY] = {
            "keras_hub_class": {
                "module": base.__module__,
                "class_name": base.__name__,
                "registered_name": keras.saving.get_registered_name(base),
            },
            "overrides": keras.saving.serialize_keras_object(self._keras_attention_overrides),
            "format": SWAP_FORMAT,
        }
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        swap = config.pop(SWAP_CONFIG_KEY)
        base = swap["keras_hub_class"]["class_name"]
        if swap.get("format", 1) < 2 and base in _FORMAT_2_CLASSES:
            raise ValueError(
                f"{base}.from_config: this swapped {base} was saved by an earlier "
                "keras-attention, whose Gemma layers held their query and key "
                "kernels in another feature order (half-split rotary; now Gemma's "
                "own order with interleaved rotary, so the cache is KerasHub's). "
                "Its weights would load without error and give wrong outputs: "
                "load the model with KerasHub's own layers (or the earlier "
                "keras-attention) and call `replace_keras_hub_attention` again. "
                f"Received: a swap config with format {swap.get('format', 1)}"
            )
        # Safe mode is the caller's: Keras' loading scope reaches these calls.
        backbone = keras.saving.deserialize_keras_object(
            {**swap["keras_hub_class"], "config": config}
        )
        overrides = keras.saving.deserialize_keras_object(swap["overrides"]) or {}
        replace_keras_hub_attention(backbone, **overrides)
        return backbone


def _swapped_class(base):
    """`base` (a KerasHub backbone class) with the swap's config: Keras
    serialises an object by its class, and KerasHub's `from_config` would
    rebuild KerasHub's attention."""
    if issubclass(base, KerasHubBackboneOnOurAttention):
        return base
    if base not in _SWAPPED_CLASSES:
        swapped = type(
            base.__name__,
            (KerasHubBackboneOnOurAttention, base),
            {"__module__": __name__, "__qualname__": base.__qualname__, "_keras_hub_class": base},
        )
        # Saved under the one registered name; loading goes through the
        # mixin's `from_config`, which reads the KerasHub class from the config.
        name = keras.saving.get_registered_name(KerasHubBackboneOnOurAttention)
        keras.saving.register_keras_serializable(*name.split(">"))(swapped)
        keras.saving.get_custom_objects()[name] = KerasHubBackboneOnOurAttention
        _SWAPPED_CLASSES[base] = swapped
    return _SWAPPED_CLASSES[base]


def _swapped_layers(backbone):
    """The `KerasHubAttention` of each decoder block of `backbone`, in order
    (empty unless every block has one)."""
    layers = [
        getattr(block, attribute)
        for block in backbone.transformer_layers
        for attribute in ATTENTION_ATTRIBUTES
        if isinstance(getattr(block, attribute, None), KerasHubAttention)
    ]
    return layers if len(layers) == len(backbone.transformer_layers) else []


def _is_backbone(model):
    blocks = getattr(model, "transformer_layers", None)
    return isinstance(model, keras.Model) and isinstance(blocks, (list, tuple)) and bool(blocks)


def _backbone_of(model, owner):
    """`model` if it is a KerasHub backbone, else its `backbone` (a task)."""
    if _is_backbone(model):
        return model
    if isinstance(model, keras.Model) and _is_backbone(getattr(model, "backbone", None)):
        return model.backbone
    raise TypeError(
        f"{owner}: `model` must be a built KerasHub backbone (with "
        "`transformer_layers`) or a model with one as its `backbone` (a "
        f"causal LM). Received: model={type(model).__name__}"
    )


def _calls_outside(backbone, model):
    """How many calls of `backbone` lie outside `model`'s graph: building a
    functional model on it (a causal LM) leaves a node on the backbone, and
    that model's compiled functions hold whatever attention they traced."""
    own = {id(node) for nodes in getattr(model, "_nodes_by_depth", {}).values() for node in nodes}
    return sum(id(node) not in own for node in backbone._inbound_nodes)


def replace_keras_hub_attention(model=None, **overrides):
    """Swaps the attention layer of every decoder block of a built KerasHub
    backbone for ours (`MultiHeadAttention.from_keras_hub`, weights copied),
    in place; returns the number of layers replaced.

    `model` is the backbone or a model built on it (a causal LM, whose
    `backbone` is swapped). Decoder blocks read their attention layer when
    called, so the backbone's functional graph and the causal LM's cached
    `generate` run ours; the compiled functions of `model` and the backbone
    (`predict_function`, `generate_function`, `train_function`,
    `test_function`) are reset so that they are traced again with ours (on
    TensorFlow a traced function keeps the layers it traced). A backbone
    that another model is built on is refused (pass that model: its
    compiled functions are out of reach), and a compiled model whose
    optimizer was built for KerasHub's variables must be compiled again
    before `fit`. The swap is recorded in the backbone's config, so a
    `.keras` file of the backbone or its causal LM loads with ours. The
    Llama, Mistral, Qwen, Qwen 3, Gemma, Gemma 3, GPT-OSS and BLOOM
    families are supported (Falcon's decoder passes an ALiBi tensor ours
    does not take). Each decoder block hands its causal and padding mask
    to ours as rules (`use_mask_rules`), so no `(B, L, L)` mask is built
    and memory stays linear in the length; a causal LM's `generate` keeps
    its local layers' caches at window size (`use_window_caches`: Gemma,
    Gemma 3, Mistral, GPT-OSS, Qwen, Qwen 3). A loaded causal LM has our
    layers from its file; swapping it again (0 replaced) restores its
    window caches. `overrides` go to our constructor (e.g.
    `memory_efficient=True`).
    """

    owner = "replace_keras_hub_attention"
    if model is None and "backbone" in overrides:  # the argument's name before #49
        model = overrides.pop("backbone")
    backbone = _backbone_of(model, owner)
    others = _calls_outside(backbone, model)
    if others:
        raise ValueError(
            f"{owner}: `model` is a backbone that another model is built on "
            "(a causal LM made from it), whose compiled predict and generate "
            "functions would keep KerasHub's attention. Pass that model "
            "instead: replace_keras_hub_attention(causal_lm). Received: "
            f"model={type(model).__name__}, called in {others} other model graph(s)"
        )
    recorded = getattr(backbone, "_keras_attention_overrides", None)
    if recorded is not None and overrides and overrides != recorded:
        raise ValueError(
            f"{owner}: `model`'s attention is already ours, built with "
            f"{recorded}; swap a fresh KerasHub model to change it. "
            f"Received: overrides={overrides}"
        )
    # Every replacement is built before any is swapped in: a refusal leaves
    # the backbone as it was.
    swaps = []
    for block in backbone.transformer_layers:
        for attribute in ATTENTION_ATTRIBUTES:
            old = getattr(block, attribute, None)
            if old is None or isinstance(old, KerasHubAttention):
                continue
            family = family_of(old, owner)
            if family == "FalconAttention":
                raise ValueError(
                    f"{owner}: Falcon's decoder passes an ALiBi tensor to its "
                    "attention; convert its layers with "
                    "MultiHeadAttention.from_keras_hub and call them directly. "
                    f"Received: a {type(backbone).__name__}"
                )
            arguments = {**_block_arguments(block, family), **overrides}
            # Built under the block's name, so each block's layer has a path
            # of its own (`capture_attention` and head masks key by path).
            with keras.name_scope(block.path or block.name):
                ours = MultiHeadAttention.from_keras_hub(old, **arguments)
                new = KerasHubAttention(ours, family, name=f"{old.name}_keras_attention")
                new.build()
            swaps.append((block, attribute, old, new))
            break
    for block, attribute, old, new in swaps:
        block._tracker.unlock()
        block._tracker.untrack(old)
        setattr(block, attribute, new)
        block._tracker.lock()
        use_mask_rules(block)
    if model is not backbone:
        # A loaded swapped causal LM has ours already: swapping it again
        # gives it the window caches, which live on the instance.
        use_window_caches(model, _swapped_layers(backbone))
    if swaps:
        # Object attributes, not Keras-tracked state.
        object.__setattr__(backbone, "__class__", _swapped_class(type(backbone)))
        object.__setattr__(backbone, "_keras_attention_overrides", dict(overrides))
    for owner_model in {id(m): m for m in (model, backbone)}.values():
        for name in COMPILED_FUNCTIONS:
            if getattr(owner_model, name, None) is not None:
                setattr(owner_model, name, None)
        optimizer = getattr(owner_model, "optimizer", None)
        if swaps and optimizer is not None and optimizer.built:
            # Its slots are KerasHub's variables: `fit` asks for `compile`
            # instead of failing inside the optimizer.
            owner_model.compiled = False
    return len(swaps)
