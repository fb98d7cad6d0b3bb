import math
import types

import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import utils
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.transformer_block import TransformerBlockBase
from keras_attention.layers.transformer_block import attention_prototype
from keras_attention.layers.transformer_block import check_mask
from keras_attention.layers.transformer_block import check_sequence_shape
from keras_attention.layers.transformer_block import keras_mask_of
from keras_attention.layers.transformer_block import serialize_prototype
from keras_attention.ops import multi_head


@keras_attention_export("layers")
class TransformerDecoderBlock(TransformerBlockBase):
    """One Transformer decoder layer with cached decoding and visible scores.

    From [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762): causal
    multi-head self-attention, cross-attention over the encoder outputs, and
    a position-wise feed-forward network, each wrapped in a residual
    connection and layer normalization (post-norm `LN(x + f(x))`, or pre-norm
    `x + f(LN(x))` with `norm_first=True`). Unlike KerasHub's decoder it
    returns the self- and cross-attention scores of every head on request,
    and its attention can be any keras_attention multi-head layer.

    The cross-attention sublayer exists when the block is first called (or
    built) with `encoder_outputs`; without them it is a decoder-only
    (GPT-style) block.

    Incremental decoding: `initial_self_attention_cache(batch, max_length)`
    gives an empty self-attention cache and
    `precompute_cross_attention_cache(encoder_outputs)` projects the encoder
    keys/values once; then call the block on one step at a time with
    `self_attention_cache`, `cache_update_index` and `cross_attention_cache`.
    All shapes are fixed, so the loop compiles with XLA.

    Args:
        num_heads, key_dim, intermediate_dim, dropout, norm_first,
        activation, layer_norm_epsilon, kernel_initializer, bias_initializer,
        seed: as in `TransformerEncoderBlock`.
        attention: the self-attention, `None` for `MultiHeadAttention`, or a
            `MultiHeadAttention`-family instance (or its serialized dict) used
            as a prototype, as in `TransformerEncoderBlock`.
        cross_attention: the cross-attention, same forms; `None` uses the
            same choice as `attention`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, d)` decoder sequence (one or a few steps when
            decoding with a cache).
        encoder_outputs: `(B, S, e)`, or `None` for a decoder-only block or
            when `cross_attention_cache` is given.
        decoder_padding_mask: `(B, T)`, `True` for real tokens of `inputs`.
            Defaults to the Keras mask of `inputs`. Without a cache it masks
            both queries and keys; with a cache it masks the new steps only.
        decoder_attention_mask: `(B, T, T)` (or `(B, T, T_max)` with a cache),
            extra self-attention mask, combined with the others.
        encoder_padding_mask: `(B, S)`, `True` for real encoder positions.
            Defaults to the Keras mask of `encoder_outputs`.
        use_causal_mask: whether step `i` sees only steps `<= i` (default).
        self_attention_cache: `(B, 2, T_max, Hkv, key_dim)` from
            `initial_self_attention_cache` or the previous step.
        cache_update_index: where this step's keys/values go in the cache (an
            int or an int scalar tensor, i.e. the position of `inputs[:, 0]`).
        cross_attention_cache: `(B, 2, S, Hkv, key_dim)` from
            `precompute_cross_attention_cache`, instead of `encoder_outputs`.
        return_attention_scores: also return the attention weights.
        return_cross_attention_logits: also return the cross-attention scores
            before softmax, `query . key / sqrt(key_dim)` per head (what the
            softmax of the cross-attention weights is taken over). Needs a
            block with cross-attention of the `MultiHeadAttention` kind
            (query/key projections and a dot-product score). Encoder
            positions masked by `encoder_padding_mask` keep their raw score
            (their weight is 0): drop them before reading.
        training: whether dropout is active.
        segment_ids: `(B, T)` integers, documents packed into one sequence: a
            token attends to the tokens of its own document only (the earlier
            ones under the causal mask).
            With `self_attention_cache`, `(B, T_max)`: the ids of every cache
            slot (this step's rows are read at `cache_update_index`).
        encoder_segment_ids: `(B, S)` integers, the encoder's packed
            documents: a token's cross-attention sees the encoder tokens of
            its own document only (needs `segment_ids`).
        prefix_length: an int or `(B,)` ints: a prefix LM, the first
            `prefix_length` positions attend to each other both ways, the
            rest causally.
            These three need an attention that takes them
            (`MultiHeadAttention`); score modifiers come with the `attention`
            prototype, e.g. `attention=MultiHeadAttention(..., alibi=True)`.

    Returns:
        `outputs (B, T, d)`; with `return_attention_scores=True` also
        `self_scores (B, H, T, T or T_max)` and, if the block has
        cross-attention, `cross_scores (B, H, T, S)`; with
        `return_cross_attention_logits=True` then `cross_logits (B, H, T, S)`;
        with a self-attention cache, last, the updated cache. So a cached
        decoding step with scores returns `outputs, self_scores, cross_scores,
        cache`.

    Example:

    >>> import numpy as np, keras_attention
    >>> block = keras_attention.TransformerDecoderBlock(
    ...     num_heads=2, key_dim=4, intermediate_dim=16)
    >>> target = np.random.rand(1, 3, 8).astype("float32")
    >>> source = np.random.rand(1, 5, 8).astype("float32")
    >>> outputs, self_scores, cross_scores = block(
    ...     target, source, return_attention_scores=True)
    >>> tuple(self_scores.shape), tuple(cross_scores.shape)
    ((1, 2, 3, 3), (1, 2, 3, 5))
    >>> cache = block.initial_self_attention_cache(batch_size=1, max_length=3)
    >>> cross_cache = block.precompute_cross_attention_cache(source)
    >>> step, cache = block(target[:, :1], self_attention_cache=cache,
    ...                     cache_update_index=0, cross_attention_cache=cross_cache)
    >>> tuple(step.shape), tuple(cache.shape)
    ((1, 1, 8), (1, 2, 3, 2, 4))
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        intermediate_dim,
        dropout=0.0,
        norm_first=False,
        attention=None,
        cross_attention=None,
        activation="relu",
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            intermediate_dim=intermediate_dim,
            dropout=dropout,
            norm_first=norm_first,
            attention=attention,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            seed=seed,
            **kwargs,
        )
        self._cross_attention_prototype = attention_prototype(
            type(self).__name__, "cross_attention", cross_attention, num_heads, key_dim
        )
        self.has_cross_attention = None  # decided in build

    def build(self, inputs_shape, encoder_outputs_shape=None):
        check_sequence_shape(self, "inputs", inputs_shape)
        inputs_shape = tuple(inputs_shape)
        self._build_attention_sublayer(
            "self_attention", self._attention_prototype, inputs_shape, inputs_shape
        )

        self.has_cross_attention = encoder_outputs_shape is not None
        if self.has_cross_attention:
            check_sequence_shape(self, "encoder_outputs", encoder_outputs_shape)
            encoder_outputs_shape = tuple(encoder_outputs_shape)
            self._build_attention_sublayer(
                "cross_attention",
                self._cross_attention_prototype or self._attention_prototype,
                inputs_shape,
                encoder_outputs_shape,
            )
        self._build_feedforward(inputs_shape)
        self.built = True

    # ------------------------------------------------------------- decoding
    def _require_built(self, method, cross=False):
        if not self.built or (cross and not self.has_cross_attention):
            raise ValueError(
                f"{validation.owner_name(self)}: `{method}` needs "
                f"a block built{' with encoder outputs' if cross else ''}; call "
                f"it once on (inputs, encoder_outputs) or `build` it first. "
                f"Received: a block with built={self.built}, "
                f"has_cross_attention={self.has_cross_attention}"
            )

    def initial_self_attention_cache(self, batch_size, max_length, dtype=None):
        """Zeros `(batch_size, 2, max_length, Hkv, key_dim)` for decoding.

        `dtype` defaults to the block's compute dtype.
        """
        self._require_built("initial_self_attention_cache")
        attention = self.self_attention
        return ops.zeros(
            (
                batch_size,
                2,
                max_length,
                attention.num_key_value_heads,
                attention.key_dim,
            ),
            dtype=dtype or self.compute_dtype,
        )

    def precompute_cross_attention_cache(self, encoder_outputs):
        """Projects the encoder outputs once: `(B, 2, S, Hkv, key_dim)`."""
        self._require_built("precompute_cross_attention_cache", cross=True)
        check_sequence_shape(self, "encoder_outputs", encoder_outputs.shape)
        return self.cross_attention.precompute_key_value(encoder_outputs)

    # ----------------------------------------------------------------- call
    def _error(self, message):
        return validation.error(self, message)

    def _validate_call(self, call):
        """Checks a call's arguments (`call`: their namespace, from `call` or
        `compute_output_spec`); returns the self- and encoder key lengths."""
        check_sequence_shape(self, "inputs", call.inputs.shape)
        if call.encoder_outputs is not None:
            check_sequence_shape(self, "encoder_outputs", call.encoder_outputs.shape)
            if call.cross_attention_cache is not None:
                raise ValueError(
                    self._error(
                        "pass `encoder_outputs` or `cross_attention_cache`, not "
                        "both. Received: encoder_outputs with shape "
                        f"{tuple(call.encoder_outputs.shape)} and cross_attention_cache "
                        f"with shape {tuple(call.cross_attention_cache.shape)}"
                    )
                )
        has_encoder = call.encoder_outputs is not None or call.cross_attention_cache is not None
        if self.built and has_encoder != self.has_cross_attention:
            raise ValueError(
                self._error(
                    "the block was built "
                    + (
                        "with cross-attention: pass `encoder_outputs` or `cross_attention_cache`"
                        if self.has_cross_attention
                        else "without cross-attention (decoder-only), so it "
                        "takes no `encoder_outputs`/`cross_attention_cache`"
                    )
                    + f". Received: encoder_outputs={_shape_of(call.encoder_outputs)}, "
                    f"cross_attention_cache={_shape_of(call.cross_attention_cache)}"
                )
            )
        if (call.self_attention_cache is None) != (call.cache_update_index is None):
            raise ValueError(
                self._error(
                    "`self_attention_cache` and `cache_update_index` go together. "
                    f"Received: self_attention_cache="
                    f"{_shape_of(call.self_attention_cache)}, "
                    f"cache_update_index={call.cache_update_index!r}"
                )
            )
        batch, length = call.inputs.shape[0], call.inputs.shape[1]
        self_length = (
            length if call.self_attention_cache is None else call.self_attention_cache.shape[2]
        )
        check_mask(self, "decoder_padding_mask", call.decoder_padding_mask, (batch, length))
        check_mask(
            self,
            "decoder_attention_mask",
            call.decoder_attention_mask,
            (batch, length, self_length),
        )
        encoder_length = None
        if call.encoder_outputs is not None:
            encoder_length = call.encoder_outputs.shape[1]
        elif call.cross_attention_cache is not None:
            encoder_length = call.cross_attention_cache.shape[2]
        if call.encoder_padding_mask is not None and not has_encoder:
            raise ValueError(
                self._error(
                    "`encoder_padding_mask` needs `encoder_outputs` or "
                    "`cross_attention_cache`. Received: encoder_padding_mask "
                    f"with shape {tuple(call.encoder_padding_mask.shape)}"
                )
            )
        check_mask(self, "encoder_padding_mask", call.encoder_padding_mask, (batch, encoder_length))
        return self_length, encoder_length

    def call(
        self,
        inputs,
        encoder_outputs=None,
        *,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        use_causal_mask=True,
        self_attention_cache=None,
        cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        return_cross_attention_logits=False,
        training=None,
        segment_ids=None,
        encoder_segment_ids=None,
        prefix_length=None,
    ):
        # The arguments by name, as `compute_output_spec` reads them.
        arguments = types.SimpleNamespace(**{k: v for k, v in locals().items() if k != "self"})
        self._validate_call(arguments)
        self_rules, cross_rules = self._rules(arguments)
        if decoder_padding_mask is None:
            decoder_padding_mask = keras_mask_of(inputs)
        if encoder_padding_mask is None:
            encoder_padding_mask = keras_mask_of(encoder_outputs)
        # Integer inputs run in the compute dtype (after reading their masks).
        inputs = utils.cast_to_compute_dtype(self, inputs)
        encoder_outputs = utils.cast_to_compute_dtype(self, encoder_outputs, "encoder_outputs")
        if return_cross_attention_logits:
            self._check_cross_logits()
        updated_cache = []
        cross_logits = []
        # What both attentions take alike.
        common = dict(
            query_mask=decoder_padding_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )

        if self_attention_cache is None:
            self_extra = dict(value_mask=decoder_padding_mask)
        else:
            self_extra = dict(cache=self_attention_cache, cache_update_index=cache_update_index)
        outputs, self_scores = self._self_attention_residual(
            inputs,
            caches=updated_cache,
            attention_mask=decoder_attention_mask,
            use_causal_mask=use_causal_mask,
            **common,
            **self_extra,
            **self_rules,
        )
        scores = (self_scores,)
        if self.has_cross_attention:
            if cross_attention_cache is None:
                source, cross_extra = (encoder_outputs,), {}
            else:
                source, cross_extra = (), dict(cache=cross_attention_cache, cache_update_index=None)
            cross_branch = self._attention_branch(
                self.cross_attention,
                *source,
                value_mask=encoder_padding_mask,
                **common,
                **cross_extra,
                **cross_rules,
            )

            def cross_attention(x):
                if return_cross_attention_logits:
                    cross_logits.append(
                        self._cross_attention_logits(x, encoder_outputs, cross_attention_cache)
                    )
                return cross_branch(x)

            outputs, cross_scores = self._residual(
                self.cross_attention_layer_norm,
                self.cross_attention_dropout,
                cross_attention,
                outputs,
                training,
            )
            scores += (cross_scores,)
        outputs = self._feedforward(outputs, training)

        results = (outputs,)
        if return_attention_scores:
            results += scores
        results += tuple(cross_logits)
        results += tuple(updated_cache)
        return results[0] if len(results) == 1 else results

    def compute_output_spec(self, *args, **kwargs):
        call = utils.call_arguments(self, args, kwargs)
        self_length, encoder_length = self._validate_call(call)
        batch, length = call.inputs.shape[0], call.inputs.shape[1]
        results = (keras.KerasTensor(call.inputs.shape, dtype=self.compute_dtype),)
        if call.return_attention_scores:
            results += (
                keras.KerasTensor(
                    (batch, self.num_heads, length, self_length),
                    dtype=self.compute_dtype,
                ),
            )
            has_encoder = call.encoder_outputs is not None or call.cross_attention_cache is not None
            if has_encoder:
                results += (
                    keras.KerasTensor(
                        (batch, self.num_heads, length, encoder_length),
                        dtype=self.compute_dtype,
                    ),
                )
        if call.return_cross_attention_logits:
            self._check_cross_logits()
            results += (
                keras.KerasTensor(
                    (batch, self.num_heads, length, encoder_length),
                    dtype=self.compute_dtype,
                ),
            )
        if call.self_attention_cache is not None:
            results += (
                keras.KerasTensor(
                    call.self_attention_cache.shape, dtype=call.self_attention_cache.dtype
                ),
            )
        return results[0] if len(results) == 1 else results

    def _rules(self, call):
        """The call-level mask rules for the self- and cross-attention (#36):
        passed only when given, so that an attention prototype without them
        keeps working."""
        self_rules, cross_rules = {}, {}
        if call.encoder_segment_ids is not None and call.segment_ids is None:
            raise ValueError(
                self._error(
                    "`encoder_segment_ids` needs `segment_ids` (the decoder "
                    "tokens' documents). Received: segment_ids=None"
                )
            )
        if call.encoder_segment_ids is not None and not self.has_cross_attention:
            raise ValueError(
                self._error(
                    "`encoder_segment_ids` needs a block with cross-attention. "
                    f"Received: encoder_segment_ids with shape "
                    f"{_shape_of(call.encoder_segment_ids)}"
                )
            )
        if call.prefix_length is not None:
            self_rules["prefix_length"] = call.prefix_length
        if call.segment_ids is not None:
            rows = call.segment_ids
            if call.self_attention_cache is not None:
                # One id per cache slot; this step's rows start at the index.
                slots = call.self_attention_cache.shape[2]
                if len(call.segment_ids.shape) != 2 or call.segment_ids.shape[1] not in (
                    None,
                    slots,
                ):
                    raise ValueError(
                        self._error(
                            "with `self_attention_cache`, `segment_ids` holds one id "
                            f"per cache slot, shape (batch, {slots}). Received: "
                            f"segment_ids with shape {_shape_of(call.segment_ids)}"
                        )
                    )
                positions = ops.arange(call.inputs.shape[1], dtype="int32")
                index = ops.cast(call.cache_update_index, "int32")
                rows = ops.take(call.segment_ids, index + positions, axis=1)
                self_rules["key_segment_ids"] = call.segment_ids
            self_rules["segment_ids"] = rows
            if call.encoder_segment_ids is not None:
                cross_rules.update(segment_ids=rows, key_segment_ids=call.encoder_segment_ids)
        for name, layer, rules in (
            ("self_attention", getattr(self, "self_attention", None), self_rules),
            ("cross_attention", getattr(self, "cross_attention", None), cross_rules),
        ):
            if rules and layer is not None and not isinstance(layer, MultiHeadAttention):
                raise ValueError(
                    self._error(
                        f"{', '.join(f'`{n}`' for n in sorted(rules))} need a "
                        f"{name} of the MultiHeadAttention kind. Received: "
                        f"{type(layer).__name__}"
                    )
                )
        return self_rules, cross_rules

    def _check_cross_logits(self):
        layer = getattr(self, "cross_attention", None) if self.has_cross_attention else None
        if not isinstance(layer, MultiHeadAttention):
            raise ValueError(
                self._error(
                    "`return_cross_attention_logits=True` needs a block with "
                    "cross-attention of the MultiHeadAttention kind (a dot-product "
                    "score). Received: cross_attention="
                    f"{type(layer).__name__ if layer is not None else None}"
                )
            )

    def _cross_attention_logits(self, query, encoder_outputs, cross_attention_cache):
        """`(B, H, T, S)` scores before softmax of the cross-attention's heads."""
        layer = self.cross_attention
        query = layer.query_dense(query)  # (B, T, H, D)
        if cross_attention_cache is not None:
            key = cross_attention_cache[:, 0]  # (B, S, Hkv, D), projected once
        else:
            key = layer.key_dense(encoder_outputs)
        key = multi_head.repeat_key_value_heads(key, layer.num_heads)  # (B, S, H, D)
        return ops.einsum("bthd,bshd->bhts", query, ops.cast(key, query.dtype)) * ops.cast(
            1.0 / math.sqrt(float(layer.key_dim)), query.dtype
        )

    def get_config(self):
        config = super().get_config()
        config["cross_attention"] = serialize_prototype(self._cross_attention_prototype)
        return config


def _shape_of(value):
    return None if value is None else f"<tensor of shape {tuple(value.shape)}>"
