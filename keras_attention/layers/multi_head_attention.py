import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.interchange import keras_hub_layers
from keras_attention.interchange import keras_layers
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.machinery import call_checks
from keras_attention.layers.machinery import call_options
from keras_attention.layers.machinery import decoding_cache
from keras_attention.layers.machinery import head_mask as head_masks
from keras_attention.layers.machinery import kernel_selector
from keras_attention.layers.machinery import score_options
from keras_attention.layers.machinery import utils
from keras_attention.layers.machinery.kernel_selector import Kernel
from keras_attention.layers.machinery.score_options import ScoreModifierOptions
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.ops import dense_attention
from keras_attention.ops import mods
from keras_attention.ops import multi_head
from keras_attention.ops import ring
from keras_attention.ops.memory_efficient import memory_efficient_attention

# Tiles of 512: at L = 8192 / 16384 (8 heads, fwd+bwd, one process) 512
# ran 0.98x / 0.75x the time of 1024 in TF graph mode and 0.79x at 8192 on
# JAX, with a quarter of the tile memory (benchmarks/RESULTS.md, #26).
DEFAULT_BLOCK_SIZE = 512


@keras_attention_export("layers")
class MultiHeadAttention(ScoreModifierOptions, BaseMultiHeadAttention):
    """Multi-head attention (Vaswani et al., 2017, https://arxiv.org/abs/1706.03762).

    A drop-in for `keras.layers.MultiHeadAttention`: the same constructor
    (argument names and positional order), call, sublayer names and weight
    order, so a Keras layer's config (`from_config`) and weights
    (`set_weights`, `load_weights`, `from_keras`) give the same outputs. It
    adds, as keyword-only arguments:

    - grouped-query attention (`num_key_value_heads < num_heads`, Ainslie et
      al., 2023): query head `h` uses key/value head `h // (num_heads //
      num_key_value_heads)`, as `keras.layers.GroupedQueryAttention`;
    - exact attention in memory linear in the sequence length (blockwise,
      online softmax, recomputing backward pass; see
      `keras_attention.ops.memory_efficient`), on every backend, switched on
      for long keys when the weights are not needed;
    - attention weights of selected heads and query rows on demand, exact,
      without the memory of the full weights (`attention_scores_heads`,
      `attention_scores_query_range`), also where Keras refuses weights;
    - incremental decoding with a key/value cache usable in a compiled loop;
    - the scores with the right symbolic shape for cross-attention, masks of
      any shape Keras accepts, and zero output for fully masked rows in any
      dtype.

    Kernels: one function, `layers.machinery.kernel_selector.select_kernel`, picks the
    kernel of each call from the configuration, the static shapes, what the
    call needs and the backend (its docstring has the table).
    `flash_attention=True` runs the backend's fused kernel where one exists
    (`keras.ops.dot_product_attention` on JAX GPU/TPU and torch CUDA) and our
    blockwise kernel elsewhere (TensorFlow, CPUs), where Keras would raise;
    `flash_attention=False` always materialises the weights;
    `flash_attention=None` (default) follows `memory_efficient`. Weights that
    must be stored (returned or captured) always come from the materialised
    path; dropout in training runs inside the blockwise kernel where that
    kernel is chosen (keep bits hashed per tile, `ops.dropout_keep_mask`),
    and in the materialised one otherwise. Every kernel reads the call's masks from
    one `ops.attention_mask.AttentionMask` with absolute positions, so a
    sliding window under a decoding cache is measured from the cache
    position on every kernel.

    Args:
        num_heads: number of query heads `H`.
        key_dim: size `D` of each query/key head.
        value_dim: size `Dv` of each value head; defaults to `key_dim`.
        dropout: fraction of attention weights dropped during training.
        use_bias: whether the projections have biases: a bool, or the
            names of those that have one among "query", "key", "value",
            "output" and "gate" (e.g. Qwen 2's `("query", "key", "value")`).
        output_shape: output feature shape (int or tuple) besides batch and
            time; defaults to the query's last dimension.
        attention_axes: axes over which attention is applied (`None`: every
            axis between batch and features, as Keras), e.g. `(1, 2)` for
            attention over the pixels of `(B, H, W, C)` images.
        sliding_window: if set, query `i` sees only keys with
            `|i - j| < sliding_window` (with `use_causal_mask`, the previous
            `sliding_window - 1` keys and itself), as Keras.
        flash_attention: `None`, `True` or `False` (see Kernels above).
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: for the projections, as in Keras.
        use_gate: multiply each head's attention output by a sigmoid gate
            projected from the query (Qiu et al., 2025), as Keras does.
        seed: seed of the dropout.
        num_key_value_heads: (keyword-only) number of key/value heads `Hkv`;
            must divide `num_heads`. Defaults to `num_heads`.
        memory_efficient: (keyword-only) `"auto"` (default), `True` or
            `False`. `"auto"` materialises the logits (the fastest exact
            kernel) when their forward + backward working set fits the memory
            budget and runs the blockwise, memory-linear kernel otherwise;
            `True` runs the blockwise kernel whenever the weights need not be
            stored and lengths are static; `False` never does.
        memory_efficient_threshold: (keyword-only) `None` (default), or a
            key length from which `"auto"` switches to the blockwise kernel
            whatever the budget (the rule before budgets).
        memory_budget: (keyword-only) bytes the materialised kernel's
            working set may take under `"auto"`; `None` (default) uses
            `keras_attention.attention_memory_budget()` (three quarters of the memory
            available when first read; `set_attention_memory_budget` sets it).
        block_size: (keyword-only) query and key tile length of the blockwise
            kernel.
        sequence_parallel: (keyword-only) `None` (default), or the name of
            an axis of the current `keras.distribution` device mesh (JAX
            backend): the sequences are split over that axis and exact
            attention runs ring-style (`keras_attention.ops.ring_attention`:
            each device keeps its query block while key/value blocks rotate
            with `jax.lax.ppermute`), so no device holds more than a
            `(T/N, T/N)` tile of logits. The axis size must divide both
            sequence lengths. Query, key and causal masks, a sliding window
            with sink tokens, segment ids, prefixes and every score modifier
            are supported; `attention_mask`, dropout and returned or
            captured weights are not (ValueError).
        logit_soft_cap: (keyword-only) `c`: logits become `c * tanh(logit / c)`
            (Gemma 2 and 3), or None.
        alibi: (keyword-only) None, True (ALiBi with the paper's slopes) or
            one slope per head: `-slope * |q - k|` added to the logits.
        attention_sinks: (keyword-only) a learned logit per head (weight
            `sinks`) in every row's softmax denominator (GPT-OSS); the
            weights returned are the keys', so a row may sum to less than 1.
        score_mod: (keyword-only) `score_mod(score, batch, head, q_idx,
            k_idx) -> score` written with `keras.ops` (register it to save
            the model), or a layer with weights such as
            `RelativePositionBias`.
        sink_tokens: (keyword-only) with `sliding_window`: the first keys
            stay visible to every query (StreamingLLM).
        mask_mod: (keyword-only) `mask_mod(batch, head, q_idx, k_idx) ->
            bool`, what each query may see besides the other masks.
            The modifiers and rules run on every exact kernel, which call
            them with the same int32 indices, `batch` `(B, 1, 1, 1)`, `head`
            `(1, H, 1, 1)`, `q_idx` `(1, 1, Tq, 1)`, `k_idx` `(1, 1, 1, Tk)`
            (absolute positions of real tokens); their results are checked
            (`ops.mods`). See the programmable-attention guide.
        rotary: (keyword-only) rotary position embedding of the projected
            queries and keys at their absolute positions (a cache holds
            rotated keys): None, True (RoPE with `max_wavelength=10000`), a
            dict of `RotaryEmbedding` arguments (scaling: linear, dynamic
            NTK, YaRN, Llama 3; partial rotation) or a `RotaryEmbedding`.
            Rank-3 inputs only.
        qk_norm: (keyword-only) RMS-normalise each head's query and key
            before the rotary embedding and the logits, each with a learned
            per-feature scale (sublayers `query_norm`, `key_norm`; Gemma 3,
            Qwen 3).
        qk_norm_epsilon: (keyword-only) the norms' epsilon.
        query_scale: (keyword-only) the logits' scale instead of
            `1 / sqrt(key_dim)` (Gemma's `query_pre_attn_scalar ** -0.5`).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, Tq, dq)` (or `(B, ..., dq)` with `attention_axes`).
        value: `(B, Tv, dv)`; `None` means self-attention (`model.add`).
        key: `(B, Tv, dk)`; `None` means `key = value`.
        query_mask, value_mask, key_mask: `(B, Tq)` / `(B, Tv)`, `True` (or
            1) at real positions; filled in from Keras masks.
        attention_mask: broadcastable to `(B, Tq, Tv)` (e.g. `(Tq, Tv)`,
            `(B, 1, Tv)`) or `(B, H, Tq, Tv)`; boolean or 0/1.
        return_attention_scores: also return the weights `(B, H, Tq, Tv)`.
        training: whether dropout is active.
        use_causal_mask: query `i` sees only keys `j <= i`.
        attention_scores_heads: (keyword-only) with
            `return_attention_scores=True`, return only these heads' weights
            (an index or a list).
        attention_scores_query_range: (keyword-only) `(start, stop)`: return
            only these query rows. With either selection the output comes from
            the kernel the layer would use without weights (the blockwise one
            on long inputs) and the selected weights are computed exactly, in
            `O(heads x rows x Tv)` memory.
        cache: (keyword-only) `(B, 2, T_max, Hkv, D)` keys (`[:, 0]`) and
            values (`[:, 1]`), or a `(keys, values)` pair of `(B, T_max,
            Hkv, D)` tensors (KerasHub's Gemma 3 layout; returned as a pair,
            each written in place, never stacked). With `cache_update_index`, the keys/values of
            `query` (self-attention) are written at that index and the layer
            attends over the whole cache: query step `t`, at absolute position
            `cache_update_index + t`, sees cache positions up to its own with
            `use_causal_mask=True`, and positions before
            `cache_update_index + Tq` otherwise. With
            `cache_update_index=None`, the cache is read-only (cross-attention
            keys/values from `precompute_key_value`) and `value`/`key` must
            not be given.
        cache_update_index: (keyword-only) int or scalar int tensor. A
            concrete value (a Python int, an eager tensor or array) is checked
            (`0 <= index <= T_max - Tq`, else ValueError). A symbolic one
            (inside `tf.function` / `jax.jit`, e.g. a compiled decoding loop)
            cannot be checked: an index beyond the cache is clamped to
            `T_max - Tq` by the dynamic update slice, as XLA does.
        cache_update_mask: (keyword-only) with `cache_update_index`, `(B,
            Tq)` booleans: where False, that step's keys/values are not
            written and its slot keeps what the cache held (KerasHub's Gemma
            3 argument: prompt tokens fed again keep their prefill keys); the
            step attends over the cache as written.
        segment_ids: (keyword-only) `(B, Tq)` integers: documents packed
            into one sequence; a query sees the keys of its own document.
        key_segment_ids: (keyword-only) `(B, Tv)` (or `(B, T_max)` with a
            cache); defaults to `segment_ids` when the keys are the queries,
            and is needed otherwise.
        prefix_length: (keyword-only) an int or `(B,)` ints: a prefix LM,
            bidirectional inside the prefix and causal after it (implies
            the causal rule). With a cache, a query sees the prefix's keys
            once written: prefill the whole prefix to match the full pass.
        position_ids: (keyword-only) with `rotary`, `(B, Tq)` or `(Tq,)`
            integer positions of the queries instead of `0 .. Tq - 1` (or
            `cache_update_index + t` with a cache): packed documents whose
            positions restart per document. They are the keys' positions too
            when the keys are the queries, and those of the keys written
            into a cache.
        key_position_ids: (keyword-only) with `rotary`, `(B, Tv)` or `(Tv,)`
            integer positions of the keys instead of `0 .. Tv - 1`; default
            `position_ids` when the keys are the queries, needed with
            `position_ids` otherwise (cross-attention). Not taken with a
            `cache`, which holds keys rotated where they were written
            (`precompute_key_value` takes them for a read-only cache).

        The keys are the queries (self-attention) when the layer is called
        on one input, `layer(x)`, or on the very same tensor as `query` and
        `value` (and `key`), Keras' `layer(x, x)` and `layer(x, x, x)`:
        then `key_segment_ids` and `key_position_ids` default to the
        queries'. Any other `value`, even equal or as long, is
        cross-attention: give the keys' ids, or call on one input.
        head_mask: (keyword-only) `(H,)` or `(B, H)`, 0/1 or soft values:
            each head's attention result is multiplied by its value before
            the output projection (Michel et al., 2019), on every kernel, so
            a head masked with 0 contributes nothing to the output. Returned
            and captured weights are the unmasked ones. Inside
            `keras_attention.analysis.masking_heads` a call without one uses
            the mask set there for this layer.
        tile_plan: (keyword-only) a `TilePlan` (`ops.tile_plan`) of this
            call's mask over `(Tq, Tv)`: which key blocks each query block
            of the blockwise kernel visits, full or partial. A model builds
            it once per batch and passes it to every layer (FlexAttention's
            shared `BlockMask`); it must describe the mask this call makes
            (causal, segment ids, window...). Other kernels ignore it.

    Returns:
        `(B, Tq, *output_shape)`; with `return_attention_scores=True` also the
        weights (`(B, H, Tq, Tv)`, or the selection); with a cache also the
        (updated) cache, last. A query row with nothing to attend to (masked
        by `query_mask` or the Keras mask, or with every key hidden by any
        mask) has all-zero weights and a zero attention result: its output is
        the output projection's bias.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.MultiHeadAttention(num_heads=2, key_dim=4)
    >>> out, scores = layer(np.ones((1, 3, 8), "float32"),
    ...                     np.ones((1, 5, 6), "float32"),
    ...                     return_attention_scores=True)
    >>> tuple(out.shape), tuple(scores.shape)
    ((1, 3, 8), (1, 2, 3, 5))
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        *,
        num_key_value_heads=None,
        memory_efficient="auto",
        memory_efficient_threshold=None,
        memory_budget=None,
        block_size=DEFAULT_BLOCK_SIZE,
        sequence_parallel=None,
        logit_soft_cap=None,
        alibi=None,
        attention_sinks=False,
        score_mod=None,
        sink_tokens=None,
        mask_mod=None,
        rotary=None,
        qk_norm=False,
        qk_norm_epsilon=1e-6,
        query_scale=None,
        **kwargs,
    ):
        owner = type(self).__name__
        query_key = _query_key_options(
            owner, key_dim, rotary, qk_norm, qk_norm_epsilon, query_scale
        )
        modifiers = score_options.validate_score_options(
            owner,
            num_heads,
            logit_soft_cap=logit_soft_cap,
            alibi=alibi,
            attention_sinks=attention_sinks,
            score_mod=score_mod,
        )
        sliding_window, sink_tokens, mask_mod = _mask_rules(
            owner, sliding_window, sink_tokens, mask_mod
        )
        attention_axes = validation.validate_axes(owner, "attention_axes", attention_axes)
        flash_attention, memory_efficient = _kernel_choice(owner, flash_attention, memory_efficient)
        super().__init__(
            num_heads,
            key_dim,
            value_dim=value_dim,
            dropout=dropout,
            use_bias=use_bias,
            output_shape=output_shape,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            use_gate=use_gate,
            seed=seed,
            num_key_value_heads=num_key_value_heads,
            **kwargs,
        )
        if flash_attention and self.dropout > 0.0:  # Keras' own check and message
            raise ValueError(
                f"{owner}: Dropout is not supported when flash attention is "
                "enabled. Please set dropout to 0.0 to use flash attention. "
                f"Received: dropout={dropout!r}, flash_attention=True"
            )
        self._attention_axes = attention_axes
        self._sliding_window = sliding_window
        self.flash_attention = flash_attention
        self.memory_efficient = memory_efficient
        self.memory_efficient_threshold = validation.validate_positive_int(
            owner, "memory_efficient_threshold", memory_efficient_threshold, allow_none=True
        )
        self.memory_budget = validation.validate_positive_int(
            owner, "memory_budget", memory_budget, allow_none=True
        )
        self.block_size = validation.validate_positive_int(owner, "block_size", block_size)
        self.sequence_parallel = _sequence_parallel(
            owner, sequence_parallel, self.dropout, flash_attention
        )
        self._set_score_options(modifiers)
        self.sink_tokens = sink_tokens
        self.mask_mod = mask_mod
        self.rotary, self.qk_norm, self.qk_norm_epsilon, self.query_scale = query_key
        if self.query_scale is not None:  # the logits' scale (Keras' `_scale`)
            self._inverse_sqrt_key_dim = self.query_scale

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self._build_score_options()
        if self.qk_norm:
            # RMSNorm of each head's query and key, one learned scale per
            # feature shared by the heads (Gemma 3, Qwen 3, OLMo 2).
            for name, heads in (
                ("query_norm", self._num_heads),
                ("key_norm", self._num_key_value_heads),
            ):
                norm = keras.layers.RMSNormalization(
                    epsilon=self.qk_norm_epsilon, name=name, dtype=self.dtype_policy
                )
                norm.build((None, None, heads, self._key_dim))
                setattr(self, f"_{name}", norm)

    def _position_heads(self, heads, which, positions):
        """Projected `(B, T, H, D)` queries or keys after QK-norm and the
        rotary embedding at `positions` (`None`: `0 .. T - 1`)."""
        if self.qk_norm:
            heads = (self._query_norm if which == "query" else self._key_norm)(heads)
        if self.rotary is not None:
            if positions is None:
                positions = ops.arange(ops.shape(heads)[1], dtype="int32")
            heads = self.rotary.rotate(heads, positions)
        return heads

    def _project_query(self, prepared):
        query, gate = super()._project_query(prepared)
        return self._position_heads(query, "query", prepared.query_positions), gate

    def _project_key_value(self, key, value, positions=None):
        key, value = super()._project_key_value(key, value)
        return self._position_heads(key, "key", positions), value

    def _positions(self, options, layout, query_shape, key_shape, self_attention):
        return call_checks.rotary_positions(
            self,
            options.position_ids,
            options.key_position_ids,
            layout,
            query_shape,
            key_shape,
            self_attention,
        )

    def _call_mask(self, mask, options, layout, flat_query, key_length, self_attention):
        """The base's rules, the prefix under a cache, and the tile plan."""
        mask = super()._call_mask(mask, options, layout, flat_query, key_length, self_attention)
        if options.prefix_length is not None and options.cache_update_index is not None:
            # The prefix sees forward, but only as far as the cache is
            # written: prefill the whole prefix to match the full pass.
            written = ops.cast(options.cache_update_index, "int32") + ops.shape(flat_query)[1]
            mask = mask.replace(key_length=written)
        if options.tile_plan is not None:
            plan = call_checks.check_tile_plan(
                self, options.tile_plan, flat_query.shape[1], key_length
            )
            mask = mask.replace(tile_plan=plan)
        return mask

    def _attention_mask(self, *args, **kwargs):
        """The base's `AttentionMask`, with this layer's sink tokens and
        `mask_mod`."""
        spec = super()._attention_mask(*args, **kwargs)
        if self.sink_tokens is None and self.mask_mod is None:
            return spec
        mask_mod = mods.UserMod.wrap(self.mask_mod, "mask_mod", type(self).__name__)
        return spec.replace(sink_tokens=self.sink_tokens, mask_mod=mask_mod)

    @property
    def sliding_window(self):
        return self._sliding_window

    @property
    def _flash_attention(self):
        """Keras' name: whether the fused path is forced."""
        return bool(self.flash_attention)

    # ------------------------------------------------------ kernel selection
    def kernel_for(
        self,
        query_shape,
        key_shape=None,
        *,
        training=False,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        """The `Kernel` a call on inputs of these shapes would run.

        A pure query of `kernel_selector.select_kernel` (nothing runs):
        `query_shape` / `key_shape` are the inputs' shapes (`key_shape`
        defaults to `query_shape`, self-attention), `training` whether
        dropout would act, `return_attention_scores` whether all weights are
        asked for, `use_causal_mask` whether the call is causal (the
        blockwise kernel skips half the tiles then, and is chosen from
        shorter lengths). Inside a TensorFlow XLA trace the answer can differ
        (see the selector's table).
        """
        return kernel_selector.kernel_for(
            self,
            query_shape,
            key_shape,
            training=training,
            return_attention_scores=return_attention_scores,
            use_causal_mask=use_causal_mask,
        )

    def _weights_needed(self, training, return_attention_scores):
        """Whether the call must form all the weights: returned or captured
        (dropout is the kernels' own: see `_dropout_seed`)."""
        return bool(return_attention_scores or self._capturing_attention)

    @utils.follows_contract
    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        """The exact kernels over projected heads (Keras' hook; see
        `BaseMultiHeadAttention._compute_attention`): one kernel choice, then
        one dispatch."""
        if return_attention_scores and self.flash_attention:
            raise ValueError(
                self._error(
                    "Returning attention scores is not supported when flash "
                    "attention is enabled. Please disable flash attention to "
                    "access attention scores, or select heads/rows with "
                    "`attention_scores_heads` / `attention_scores_query_range`."
                )
            )
        mask = self._as_attention_mask(attention_mask, use_causal_mask)
        dropping = self._dropout_callable(training) is not None
        kernel = kernel_selector.select_kernel(
            kernel_selector.request_for(
                self,
                query,
                key,
                self._weights_needed(training, return_attention_scores),
                causal=bool(mask.causal),
                dropout=dropping,
            )
        )
        scale = self._inverse_sqrt_key_dim
        modifier = self._score_modifier()
        if kernel is Kernel.DENSE:
            return dense_attention.dense_attention(
                query,
                key,
                value,
                mask,
                scale=scale,
                dropout=self._dropout_callable(training),
                modifier=modifier,
            )
        if kernel is Kernel.SHIFTED:
            output = dense_attention.shifted_attention(
                query, key, value, mask, scale=scale, modifier=modifier
            )
            return output, None
        if kernel is Kernel.RING:
            if dropping or self._weights_needed(training, return_attention_scores):
                raise ValueError(
                    self._error(
                        f"`sequence_parallel={self.sequence_parallel!r}` (ring "
                        "attention) never forms the attention weights. Received: a "
                        "call that needs the weights (returned, captured or dropped "
                        "out)"
                    )
                )
            return self._ring_attention(query, key, value, mask, modifier), None
        if kernel is Kernel.BLOCKWISE:
            output = memory_efficient_attention(
                query,
                key,
                value,
                scale=scale,
                mask=mask,
                block_size=self.block_size,
                modifier=modifier,
                dropout_rate=self.dropout if dropping else 0.0,
                dropout_seed=self._dropout_seed() if dropping else None,
            )
        else:  # FUSED, COMPOSITE: keras.ops.dot_product_attention
            output = dense_attention.composite_attention(
                query,
                key,
                value,
                mask,
                scale=scale,
                num_heads=self._num_heads,
                flash_attention=(
                    False
                    if kernel is Kernel.COMPOSITE
                    else (True if self.flash_attention else None)
                ),
            )
        return output, None

    def _ring_attention(self, query, key, value, mask, modifier=None):
        axis = self.sequence_parallel
        if mask.pair_mask is not None:
            given = mask.pair_mask if mask.per_head else mask.pair_mask[:, 0]
            raise ValueError(
                self._error(
                    f"`sequence_parallel={axis!r}` (ring attention) takes query, "
                    "key and causal masks only. Received: an attention_mask of "
                    f"shape {tuple(given.shape)}"
                )
            )
        mesh = ring.check_sequence_mesh(
            self._error, "sequence_parallel", axis, query.shape, key.shape
        )
        distribution = keras.distribution.distribution()
        batch_axis = distribution.batch_dim_name
        if batch_axis == axis or batch_axis not in mesh.axis_names:
            batch_axis = None
        ring.check_batch_axis(self._error, mesh, batch_axis, query.shape[0])
        key = multi_head.repeat_key_value_heads(key, self._num_heads)
        value = multi_head.repeat_key_value_heads(value, self._num_heads)
        return ring.ring_attention(
            query,
            key,
            value,
            mesh=mesh.backend_mesh,
            sequence_axis=axis,
            batch_axis=batch_axis,
            scale=self._inverse_sqrt_key_dim,
            mask=mask,
            modifier=modifier,
        )

    # ---------------------------------------------------------------- caching
    def precompute_key_value(self, value, key=None, *, key_position_ids=None):
        """Projects cross-attention keys/values once for decoding.

        Args:
            value: `(B, Tv, dv)`, e.g. the encoder outputs.
            key: `(B, Tv, dk)`; defaults to `value`.
            key_position_ids: (keyword-only) with `rotary`, `(B, Tv)` or
                `(Tv,)` integer positions the keys are rotated at, instead
                of `0 .. Tv - 1` (the cache holds rotated keys).

        Returns:
            The cache `(B, 2, Tv, Hkv, D)` to pass as `cache=` with
            `cache_update_index=None`.
        """
        key = value if key is None else key
        if not self.built:
            raise ValueError(
                self._error(
                    "precompute_key_value needs a built layer: call it once on "
                    "(query, value) or build it. Received: an unbuilt layer"
                )
            )
        decoding_cache.check_cacheable(
            self,
        )
        positions = None
        if key_position_ids is not None:
            self._check_tensor("key", key)
            positions = call_checks.check_position_ids(
                self, key_position_ids, None, tuple(key.shape), "key_position_ids"
            )
        return ops.stack(self._project_key_value(key, value, positions), axis=1)

    # ------------------------------------------------------------------- call
    def __call__(self, *args, **kwargs):
        # Before Keras converts it: JAX's conversion of a text array fails first.
        head_masks.check_head_mask(self, kwargs.get("head_mask"))
        return super().__call__(*args, **kwargs)

    @utils.follows_contract
    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        *,
        mask=None,
        attention_scores_heads=None,
        attention_scores_query_range=None,
        cache=None,
        cache_update_index=None,
        cache_update_mask=None,
        segment_ids=None,
        key_segment_ids=None,
        prefix_length=None,
        position_ids=None,
        key_position_ids=None,
        head_mask=None,
        tile_plan=None,
    ):
        # Keras' call and this layer's keyword-only arguments (the class
        # docstring's "Call arguments"), in one record from here on.
        query, value, key, options = call_options.from_arguments(self, locals())
        head_mask = options.head_mask
        if head_mask is None:  # a mask set for this layer by `analysis.masking_heads`
            head_mask = head_masks.active_head_mask(self)
        head_mask = head_masks.check_head_mask(self, head_mask, query)
        selection = call_checks.selection(self, query, options)
        if options.cache is None:
            decoding_cache.refuse_without_cache(self, options)
            prepared = self._prepare_inputs(query, value, key, options)
            projected_key, projected_value = self._project_key_value(
                prepared.flat_key, prepared.flat_value, prepared.key_positions
            )
            cache = None
        else:
            prepared, projected_key, projected_value, cache = decoding_cache.cached_inputs(
                self, query, value, key, options
            )
        projected_query, gate = self._project_query(prepared)
        results = self._attend_and_project(
            prepared,
            projected_query,
            gate,
            projected_key,
            projected_value,
            options,
            head_mask=head_mask,
        )
        if selection is not None:
            # A step after the kernel: the exact weights of the selection only.
            results = (
                results[0],
                dense_attention.selected_weights(
                    projected_query,
                    projected_key,
                    prepared.mask,
                    scale=self._inverse_sqrt_key_dim,
                    num_heads=self._num_heads,
                    heads=selection.heads,
                    rows=selection.query_range,
                    dtype=self.compute_dtype,
                    modifier=self._score_modifier(),
                ),
            )
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _output_spec(self, query, value, key, options):
        head_masks.check_head_mask(self, options.head_mask, query)
        call_checks.check_tile_plan(self, options.tile_plan)
        selection = call_checks.selection(self, query, options)
        if options.cache is None:
            decoding_cache.refuse_without_cache(self, options)
            results = super()._output_spec(query, value, key, options)
        else:
            results = decoding_cache.output_spec(self, query, value, key, options)
        if selection is not None:
            scores = results[1]
            results = (
                results[0],
                keras.KerasTensor(selection.shape(tuple(scores.shape)), dtype=scores.dtype),
            ) + results[2:]
        return results

    # ------------------------------------------------------------ conversion
    @classmethod
    def from_keras(cls, layer, **kwargs):
        """Builds ours from a built `keras.layers.MultiHeadAttention` or
        `keras.layers.GroupQueryAttention`, with the same weights.

        Outputs match to float rounding without retraining, for inputs of
        any rank the Keras layer was built for (images with
        `attention_axes=(1, 2)` too). `kwargs` override constructor arguments
        (for example `memory_efficient=False`).
        """
        return keras_layers.multi_head_from_keras(cls, layer, kwargs)

    @classmethod
    def from_keras_hub(cls, layer, **kwargs):
        """Builds ours from a built KerasHub attention layer, with its
        weights: `LlamaAttention`, `CachedMistralAttention`,
        `CachedGemmaAttention`, `CachedGemma3Attention`, `GptOssAttention`,
        `FalconAttention`, `BloomAttention`, `QwenAttention` or
        `Qwen3Attention` (KerasHub 0.32; subclasses too).

        The configuration is read from the instance (rotary wavelength and
        scaling, grouped heads, QK-norm, query scale, biases, soft cap,
        window, sinks, ALiBi) and a configuration ours cannot compute is
        refused naming the class and the attribute. Called as
        `ours(x, attention_mask=mask)` (or with `cache=` and
        `cache_update_index=`), with the causal and padding mask KerasHub's
        decoder gives its layer, ours returns what theirs returns;
        `keras_attention.interchange.keras_hub_models.to_keras_hub_cache` /
        `from_keras_hub_cache` convert a cache between the two, and
        `replace_keras_hub_attention(causal_lm)` swaps every attention layer
        of a backbone for ours. KerasHub itself is not imported. `kwargs`
        override constructor arguments (e.g. `memory_efficient=True`).
        """
        family, args, weights = keras_hub_layers.configuration(layer)
        args.setdefault("dtype", layer.dtype_policy)
        args.setdefault("name", f"{layer.name}_keras_attention")
        args.update(kwargs)
        new = cls(**args)
        new.build((None, None, weights["query/kernel"].shape[0]))
        keras_hub_layers.assign(new, weights)
        return new

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attention_axes": self._attention_axes,
                "sliding_window": self._sliding_window,
                "flash_attention": self.flash_attention,
                "memory_efficient": self.memory_efficient,
                "memory_efficient_threshold": self.memory_efficient_threshold,
                "memory_budget": self.memory_budget,
                "block_size": self.block_size,
                "sequence_parallel": self.sequence_parallel,
                **self._score_options_config(),
                "sink_tokens": self.sink_tokens,
                "mask_mod": (
                    None
                    if self.mask_mod is None
                    else keras.saving.serialize_keras_object(self.mask_mod)
                ),
                "rotary": (
                    None
                    if self.rotary is None
                    else keras.saving.serialize_keras_object(self.rotary)
                ),
                "qk_norm": self.qk_norm,
                "qk_norm_epsilon": self.qk_norm_epsilon,
                "query_scale": self.query_scale,
            }
        )
        return config


def _query_key_options(owner, key_dim, rotary, qk_norm, qk_norm_epsilon, query_scale):
    """The checked options that act on the projected queries and keys:
    `(rotary, qk_norm, qk_norm_epsilon, query_scale)`."""
    rotary = _validate_rotary(owner, rotary, key_dim)
    qk_norm = validation.validate_bool(owner, "qk_norm", qk_norm)
    qk_norm_epsilon = validation.validate_real(
        owner, "qk_norm_epsilon", qk_norm_epsilon, low=0.0, include_low=False
    )
    if query_scale is not None:
        query_scale = validation.validate_real(
            owner, "query_scale", query_scale, low=0.0, include_low=False
        )
    return rotary, qk_norm, qk_norm_epsilon, query_scale


def _mask_rules(owner, sliding_window, sink_tokens, mask_mod):
    """The constructor's mask rules, checked: `(sliding_window, sink_tokens, mask_mod)`."""
    mask_mod = score_options.user_function(
        owner, "mask_mod", mask_mod, "(batch, head, q_idx, k_idx) -> bool"
    )
    sink_tokens = validation.validate_positive_int(
        owner, "sink_tokens", sink_tokens, allow_none=True
    )
    if sink_tokens is not None and sliding_window is None:
        raise ValueError(
            f"{owner}: `sink_tokens` keeps the first keys visible beside a "
            "sliding window: pass `sliding_window` too. Received: "
            f"sink_tokens={sink_tokens!r}, sliding_window=None"
        )
    sliding_window = validation.validate_positive_int(
        owner, "sliding_window", sliding_window, allow_none=True
    )
    return sliding_window, sink_tokens, mask_mod


def _kernel_choice(owner, flash_attention, memory_efficient):
    """Keras' `flash_attention` and our `memory_efficient`, checked to agree."""
    flash_attention = validation.validate_choice(
        owner, "flash_attention", flash_attention, (None, True, False)
    )
    memory_efficient = validation.validate_choice(
        owner, "memory_efficient", memory_efficient, ("auto", True, False)
    )
    if flash_attention is not None and memory_efficient is (not flash_attention):
        raise ValueError(
            f"{owner}: flash_attention={flash_attention} contradicts "
            f"memory_efficient={memory_efficient}; set only one. Received: "
            f"flash_attention={flash_attention!r}, "
            f"memory_efficient={memory_efficient!r}"
        )
    return flash_attention, memory_efficient


def _sequence_parallel(owner, sequence_parallel, dropout, flash_attention):
    """`sequence_parallel`: None or a device mesh axis's name (ring attention,
    which takes no attention `dropout` and no `flash_attention`)."""
    if sequence_parallel is None:
        return None
    if not isinstance(sequence_parallel, str) or not sequence_parallel:
        raise ValueError(
            f"{owner}: `sequence_parallel` must be None or the name of "
            "a device mesh axis. Received: "
            f"sequence_parallel={sequence_parallel!r}"
        )
    for argument, received, given in (
        ("dropout", dropout, dropout > 0.0),
        ("flash_attention", flash_attention, flash_attention is not None),
    ):
        if given:
            raise ValueError(
                f"{owner}: `sequence_parallel` (ring attention) does not support "
                f"`{argument}`. Received: sequence_parallel={sequence_parallel!r}, "
                f"{argument}={received!r}"
            )
    return sequence_parallel


def _validate_rotary(owner, rotary, key_dim):
    """`rotary`: None/False, True (the paper's RoPE), a dict of
    `RotaryEmbedding` arguments (or its saved config) or a `RotaryEmbedding`."""
    if rotary is None or rotary is False:
        return None
    if rotary is True:
        rotary = RotaryEmbedding()
    elif isinstance(rotary, dict):
        if "class_name" in rotary:  # a `.keras` file's config
            rotary = validation.deserialize_layer(
                owner, "rotary", rotary, RotaryEmbedding, "a keras_attention.RotaryEmbedding"
            )
        else:
            try:
                rotary = RotaryEmbedding(**rotary)
            except TypeError as error:
                raise TypeError(
                    f"{owner}: `rotary` as a dict takes RotaryEmbedding's arguments. "
                    f"Received: rotary={rotary!r} ({error})"
                ) from None
    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(
            f"{owner}: `rotary` must be None, True, a dict of RotaryEmbedding "
            f"arguments or a keras_attention.RotaryEmbedding. Received: rotary={rotary!r}"
        )
    try:
        rotary.rotary_dim(key_dim)
    except ValueError as error:
        message = str(error).removeprefix("RotaryEmbedding: ")
        raise ValueError(f"{owner}: `rotary`: {message} (key_dim={key_dim!r})") from None
    return rotary
