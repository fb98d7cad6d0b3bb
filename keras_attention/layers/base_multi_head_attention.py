"""The multi-head family: Keras' projections and call, a kernel per layer.

`MultiHeadAttention` (exact attention), `SparseAttention`,
`PerformerAttention` and `LinformerAttention` are siblings: each subclasses
`BaseMultiHeadAttention`, takes its own arguments and supplies only its
attention kernel. The base holds what all of them use: the projections, the
call's validation, one `AttentionMask` built from every mask spelling, and
the output projection. Features of one family (MultiHeadAttention's decoding
cache, selected weights, kernel choice) live in that family's class.
"""

import inspect
import math

import keras
from keras import ops

from keras_attention import distribution
from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.layers.machinery import attention_layout
from keras_attention.layers.machinery import call_checks
from keras_attention.layers.machinery import call_options
from keras_attention.layers.machinery import head_mask as head_masks
from keras_attention.layers.machinery import utils
from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import masking
from keras_attention.ops import multi_head


@keras_attention_export("layers")
class BaseMultiHeadAttention(BaseAttention):
    """Multi-head attention's projections and call; subclasses give the kernel.

    Holds what every multi-head layer shares with
    `keras.layers.MultiHeadAttention`: the query/key/value projections
    (sublayers named `query`, `key`, `value`, `gate`, `attention_output`,
    created in Keras' order, so `set_weights` / `load_weights` of a Keras
    layer's weights and `DTypePolicyMap` or quantization keyed on those names
    work unchanged), Keras' protected attributes and hooks (`_num_heads`,
    `_key_dim`, `_query_dense`, `_get_common_kwargs_for_sublayer`,
    `_build_attention`, `_masked_softmax`, `_compute_attention`, ...), so
    that subclasses written for Keras' layer run on ours, the call signature
    and its masks, the optional sigmoid gate and the output projection.

    Every mask a call gives (Keras masks, `query_mask` / `value_mask` /
    `key_mask`, `attention_mask` of any shape Keras accepts, causal, the
    layer's own positional rules) becomes one `ops.attention_mask.
    AttentionMask` that the kernel consumes. A query row with nothing to
    attend to, however that is spelled, has zero weights and a zero
    attention result, so the layer returns the output projection's bias for
    it (a linear map of a zero context).

    A subclass implements `_attend` (heads already repeated to one key/value
    head per query head) or, for full control, `_compute_attention`.

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
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: for the projections, as in Keras. Every projection
            gets its own copy of the initializers.
        use_gate: multiply each head's attention output by a sigmoid gate
            projected from the query (Qiu et al., 2025), as Keras does.
        seed: seed of the dropout.
        num_key_value_heads: number of key/value heads `Hkv` (grouped-query
            attention, Ainslie et al., 2023, as
            `keras.layers.GroupedQueryAttention`); must divide `num_heads`.
            Defaults to `num_heads`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).
    """

    # MultiHeadAttention's positional rule; the other families have none.
    _sliding_window = None

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        num_key_value_heads=None,
        **kwargs,
    ):
        owner = type(self).__name__
        num_heads = validation.validate_positive_int(owner, "num_heads", num_heads)
        key_dim = validation.validate_positive_int(owner, "key_dim", key_dim)
        value_dim = validation.validate_positive_int(owner, "value_dim", value_dim, allow_none=True)
        num_key_value_heads = validation.validate_positive_int(
            owner, "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                f"{owner}: `num_key_value_heads` must divide `num_heads` "
                f"({num_heads}). Received: num_key_value_heads="
                f"{num_key_value_heads!r}"
            )
        use_bias = _validate_use_bias(owner, use_bias)
        use_gate = validation.validate_bool(owner, "use_gate", use_gate)
        output_shape = self._standardize_output_shape(output_shape)
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        # Keras' attribute names: subclasses written for Keras read them.
        self._num_heads = num_heads
        self._key_dim = key_dim
        self._value_dim = value_dim or key_dim
        self._num_key_value_heads = num_key_value_heads or num_heads
        self._use_bias = use_bias
        self._use_gate = use_gate
        self._output_shape = output_shape
        self._kernel_initializer = keras.initializers.get(kernel_initializer)
        self._bias_initializer = keras.initializers.get(bias_initializer)
        self._kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self._bias_regularizer = keras.regularizers.get(bias_regularizer)
        # As Keras: the projections' and this layer's activity regularizer.
        self._activity_regularizer = keras.regularizers.get(activity_regularizer)
        self._kernel_constraint = keras.constraints.get(kernel_constraint)
        self._bias_constraint = keras.constraints.get(bias_constraint)
        self._inverse_sqrt_key_dim = 1.0 / math.sqrt(float(self._key_dim))
        self._attention_axes = None  # None: every axis between batch and features

    def _standardize_output_shape(self, output_shape):
        if output_shape is None:
            return None
        output_shape = validation.as_python_scalar(output_shape)
        dims = (output_shape,) if validation.is_int(output_shape) else output_shape
        try:
            dims = tuple(dims)
        except TypeError:
            dims = None
        if not dims or not all(validation.is_int(d) and d > 0 for d in dims):
            raise ValueError(
                f"{type(self).__name__}: Invalid `output_shape`: it must be a "
                "positive integer or a tuple of positive integers. Received: "
                f"output_shape={output_shape!r}"
            )
        return tuple(int(d) for d in dims)

    # ------------------------------------------------ Keras' public surface
    num_heads = property(lambda self: self._num_heads)
    key_dim = property(lambda self: self._key_dim)
    value_dim = property(lambda self: self._value_dim)
    num_key_value_heads = property(lambda self: self._num_key_value_heads)
    use_bias = property(lambda self: self._use_bias)
    use_gate = property(lambda self: self._use_gate)
    kernel_initializer = property(lambda self: self._kernel_initializer)
    bias_initializer = property(lambda self: self._bias_initializer)
    kernel_regularizer = property(lambda self: self._kernel_regularizer)
    bias_regularizer = property(lambda self: self._bias_regularizer)
    kernel_constraint = property(lambda self: self._kernel_constraint)
    bias_constraint = property(lambda self: self._bias_constraint)
    # Keras' protected names for the dropout rate and the logit scale.
    _dropout = property(lambda self: self.dropout)
    _scale = property(lambda self: self._inverse_sqrt_key_dim)

    @property
    def attention_axes(self):
        return self._attention_axes

    query_dense = property(lambda self: self._query_dense)
    key_dense = property(lambda self: self._key_dense)
    value_dense = property(lambda self: self._value_dense)
    output_dense = property(lambda self: self._output_dense)

    @property
    def gate_dense(self):
        return self._gate_dense if self._use_gate else None

    # --------------------------------------------------------------- shapes
    def _layout(self, rank):
        axes = self._attention_axes
        if axes is None:
            axes = tuple(range(1, rank - 1))
        axes = validation.resolve_axes(self, "attention_axes", axes, rank)
        return attention_layout.Layout(rank, axes)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        call_checks.check_shapes(self, query_shape, value_shape, key_shape)
        dims = self._output_shape or (query_shape[-1],)
        return tuple(query_shape[:-1]) + tuple(dims)

    # ------------------------------------------------------------------ build
    def _get_common_kwargs_for_sublayer(self):
        """Keras' hook: the projections' arguments, fresh initializer copies."""
        return dict(
            kernel_initializer=self._kernel_initializer.__class__.from_config(
                self._kernel_initializer.get_config()
            ),
            bias_initializer=self._bias_initializer.__class__.from_config(
                self._bias_initializer.get_config()
            ),
            kernel_regularizer=self._kernel_regularizer,
            bias_regularizer=self._bias_regularizer,
            activity_regularizer=self._activity_regularizer,
            kernel_constraint=self._kernel_constraint,
            bias_constraint=self._bias_constraint,
            dtype=self.dtype_policy,
        )

    def _has_bias(self, name):
        """Whether projection `name` (a sublayer name) has a bias."""
        if isinstance(self._use_bias, bool):
            return self._use_bias
        return _BIAS_NAMES.get(name, name) in self._use_bias

    def _dense(self, output_shape, bias_axes, name, equation="abc,cde->abde", activation=None):
        return keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self._has_bias(name) else None,
            activation=activation,
            name=name,
            **self._get_common_kwargs_for_sublayer(),
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        call_checks.check_shapes(self, query_shape, value_shape, key_shape)
        heads, kv_heads = self._num_heads, self._num_key_value_heads
        out_dims = self._output_shape or (query_shape[-1],)
        self._check_layout(query_shape, value_shape, key_shape, out_dims)
        # Keras' names and creation order (query, key, gate, value, output),
        # which is the order of `get_weights()`. The kernels see inputs
        # flattened to (B', T, features), so one equation serves every rank.
        self._query_dense = self._dense((None, heads, self._key_dim), "de", "query")
        self._query_dense.build((None, None, query_shape[-1]))
        self._key_dense = self._dense((None, kv_heads, self._key_dim), "de", "key")
        self._key_dense.build((None, None, key_shape[-1]))
        if self._use_gate:
            self._gate_dense = self._dense(
                (None, heads, self._value_dim), "de", "gate", activation="sigmoid"
            )
            self._gate_dense.build((None, None, query_shape[-1]))
        self._value_dense = self._dense((None, kv_heads, self._value_dim), "de", "value")
        self._value_dense.build((None, None, value_shape[-1]))
        letters = "efghijklmnop"[: len(out_dims)]
        self._output_dense = self._dense(
            (None,) + tuple(out_dims),
            letters,
            "attention_output",
            equation=f"abcd,cd{letters}->ab{letters}",
        )
        self._output_dense.build((None, None, heads, self._value_dim))
        self._build_attention(4)
        self._built_feature_dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self.built = True

    def _build_attention(self, rank):
        """Keras' hook: the einsum equations and softmax of projected heads.

        `rank` is the projected tensors' rank, `(B, <axes>, H, D)`; the
        attention axes are the time axes (ours flattens them to one).
        """
        axes = tuple(range(1, rank - 2))
        self._dot_product_equation, self._combine_equation, scores_rank = (
            attention_layout.attention_equations(rank, axes)
        )
        self._softmax = keras.layers.Softmax(
            axis=tuple(range(scores_rank - len(axes), scores_rank)),
            dtype=self.dtype_policy,
        )

    def _check_layout(self, query_shape, value_shape, key_shape, out_dims):
        """Under `ModelParallel`, the heads must divide over the mesh."""
        heads, kv_heads = self._num_heads, self._num_key_value_heads
        head = ("num_heads", "key_dim")
        kv_head = ("num_key_value_heads", "key_dim")
        value_head = ("num_key_value_heads", "value_dim")
        weights = {
            "query/kernel": ((query_shape[-1], heads, self._key_dim), ("query features",) + head),
            "query/bias": ((heads, self._key_dim), head),
            "key/kernel": ((key_shape[-1], kv_heads, self._key_dim), ("key features",) + kv_head),
            "key/bias": ((kv_heads, self._key_dim), kv_head),
            "value/kernel": (
                (value_shape[-1], kv_heads, self._value_dim),
                ("value features",) + value_head,
            ),
            "value/bias": ((kv_heads, self._value_dim), value_head),
            "attention_output/kernel": (
                (heads, self._value_dim) + tuple(out_dims),
                ("num_heads", "value_dim") + ("output_shape",) * len(out_dims),
            ),
        }
        if self._use_gate:
            weights["gate/kernel"] = (
                (query_shape[-1], heads, self._value_dim),
                ("query features", "num_heads", "value_dim"),
            )
        distribution.check_layout(self, weights)

    # ------------------------------------------------------------ kernel hook
    def _masked_softmax(self, attention_scores, attention_mask=None):
        """Keras' hook: softmax of `(B, H, Tq, Tk)` scores under a mask.

        As Keras, a mask of lower rank gets the head axis; unlike Keras' (a
        uniform distribution), a row with no allowed key gets zero weights.
        """
        if attention_mask is not None:
            while len(attention_mask.shape) < len(attention_scores.shape):
                attention_mask = ops.expand_dims(attention_mask, -3)
        return masking.masked_softmax(attention_scores, attention_mask)

    def _dropout_callable(self, training):
        """The attention dropout as a callable, or `None` when it cannot act."""
        if self.dropout > 0 and training is not None and training is not False:
            return lambda weights: self._dropout_layer(weights, training=training)
        return None

    def _dropout_seed(self):
        """One int32 seed per call from the dropout's `SeedGenerator` (a new
        one each training step): the tiled kernels hash their keep bits from
        it (`ops.dropout`)."""
        return keras.random.randint(
            (), 0, 2**31 - 1, dtype="int32", seed=self._dropout_layer.seed_generator
        )

    def _as_attention_mask(self, attention_mask, use_causal_mask=False):
        """An `AttentionMask`, from ours or from a Keras-style tensor mask."""
        if isinstance(attention_mask, attention_masks.AttentionMask):
            if use_causal_mask and not attention_mask.causal:
                return attention_mask.replace(causal=True)
            return attention_mask
        return attention_masks.from_keras_mask(attention_mask, use_causal_mask)

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
        """The attention kernel over projected heads (Keras' hook).

        Args:
            query: `(B, Tq, H, D)` projected queries (not yet scaled).
            key: `(B, Tv, Hkv, D)` projected keys (grouped heads not repeated).
            value: `(B, Tv, Hkv, Dv)` projected values. A position whose key
                or value held NaN/Inf comes as a NaN key and a zero value
                (`masking.confine_nonfinite`): mask logits with `where`.
            attention_mask: an `AttentionMask` (from this layer's call), or,
                as in Keras, a boolean or 0/1 tensor broadcastable to
                `(B, Tq, Tv)` or `(B, H, Tq, Tv)`, or None.
            training: whether dropout is active.
            return_attention_scores: whether the caller needs the weights.
            use_causal_mask: query `i` sees keys `j <= i` as well.

        Returns:
            `(output (B, Tq, H, Dv), weights (B, H, Tq, Tv) or None)`. The
            caller applies the gate and output projection and records the
            weights for `capture_attention`.
        """
        mask = self._as_attention_mask(attention_mask, use_causal_mask)
        if (
            mask.sliding_window is not None
            or mask.key_length is not None
            or (not isinstance(mask.query_offset, int) or mask.query_offset)
            or mask.key_positions is not None
        ):
            raise ValueError(
                self._error(
                    "this attention kernel takes no sliding window or decoding "
                    "positions. Received: an attention mask with them"
                )
            )
        key = multi_head.repeat_key_value_heads(key, self._num_heads)
        value = multi_head.repeat_key_value_heads(value, self._num_heads)
        result = self._attend(
            query,
            key,
            value,
            mask,
            dropout=self._dropout_callable(training),
            return_weights=return_attention_scores or self._capturing_attention,
        )
        return result if isinstance(result, tuple) else (result, None)

    def _attend(self, query, key, value, mask, *, dropout, return_weights):
        """A sibling's kernel: `output`, or `(output, weights)` with `return_weights`.

        `query` is `(B, Tq, H, D)`, `key`/`value` `(B, Tv, H, D)` with the
        heads repeated; `mask` is the call's `AttentionMask` (its pair mask
        `(B|1, H|1, Tq, Tv)`); `dropout` is a callable on the weights or `None`.
        Options a kernel cannot honour are rejected earlier by
        `_check_call_options`; masked query rows are zeroed by the caller.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement `_attend` or `_compute_attention`."
        )

    def _check_call_options(self, query, value, attention_mask, use_causal_mask):
        """Hook: raise here for call options the kernel cannot honour.

        Runs first in both `call` and `compute_output_spec`, so the error comes
        eagerly and when a functional model is built.
        """

    def _reject_per_head_mask(self, attention_mask):
        """For kernels that take one `attention_mask` for every head."""
        if (
            attention_mask is not None
            and hasattr(attention_mask, "shape")
            and len(attention_mask.shape) == 4
            and attention_mask.shape[1] not in (1, None)
        ):
            raise ValueError(
                self._error(
                    "a per-head `attention_mask` (B, H, Tq, Tv) is not "
                    "supported by this kernel; pass one mask for all heads, "
                    "(B, Tq, Tv). Received: attention_mask with shape "
                    f"{tuple(attention_mask.shape)}"
                )
            )

    # ------------------------------------------------------------------- call
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
    ):
        return self._call(*call_options.from_arguments(self, locals()))

    def _call(self, query, value, key, options):
        """`call`'s body, given its `CallOptions`."""
        prepared = self._prepare_inputs(query, value, key, options)
        projected_query, gate = self._project_query(prepared)
        projected_key, projected_value = self._project_key_value(
            prepared.flat_key, prepared.flat_value, prepared.key_positions
        )
        results = self._attend_and_project(
            prepared, projected_query, gate, projected_key, projected_value, options
        )
        return results[0] if len(results) == 1 else results

    def _prepare(self, query, value, key, options):
        """Validates a call (eager or symbolic); returns the resolved inputs,
        the query and value masks and the layout."""
        for name, x in (("query", query), ("value", value), ("key", key)):
            self._check_tensor(name, x)
        if query is None:
            raise TypeError(self._error("`query` is required. Received: query=None"))
        # Keras' mask of a one-input call is the query's.
        query_mask = options.mask if options.query_mask is None else options.query_mask
        attention_mask = options.attention_mask
        self._check_call_options(query, value, attention_mask, options.use_causal_mask)
        value_mask = options.value_mask
        if value is None and value_mask is None:
            value_mask = query_mask  # self-attention: the keys are the queries
        query, value, key = self._resolve_inputs(query, value, key)
        layout = call_checks.check_shapes(self, query.shape, value.shape, key.shape)
        query_shape, value_shape = tuple(query.shape), tuple(value.shape)
        self._check_mask("query_mask", query_mask, query_shape[:-1])
        self._check_mask("value_mask", value_mask, value_shape[:-1])
        self._check_mask("key_mask", options.key_mask, value_shape[:-1])
        batch = (query_shape[0],) + tuple(query_shape[a] for a in layout.batch_axes)
        q_axes = tuple(query_shape[a] for a in layout.attention_axes)
        k_axes = tuple(value_shape[a] for a in layout.attention_axes)
        if (
            attention_mask is not None
            and hasattr(attention_mask, "shape")
            and len(attention_mask.shape) == (len(batch) + 1 + len(q_axes) + len(k_axes))
        ):  # with a head axis
            expected = batch + (self._num_heads,) + q_axes + k_axes
        else:
            expected = batch + q_axes + k_axes
        self._check_mask("attention_mask", attention_mask, expected, broadcast=True)
        return query, value, key, query_mask, value_mask, layout

    def _attention_mask(
        self,
        layout,
        query,
        value,
        query_mask,
        key_mask,
        attention_mask,
        flat_query_length,
        flat_key_length,
        causal,
        **positions,
    ):
        """The call's one `AttentionMask`, from every spelling of a mask.

        `query_mask` / `key_mask` come flattened like the inputs. An
        `attention_mask` that varies only along the keys (`(B, 1, Tv)`) is a
        key mask, one that varies only along the queries (`(B, Tq, 1)`) a
        query mask, and a head axis of 1 is dropped, so memory-linear kernels
        see a `(Tq, Tv)` array only when the mask has one; a row that any
        spelling hides gets the same zero attention result.
        """
        if attention_mask is not None:
            mask = masking.to_bool_mask(attention_mask)
            n = len(layout.attention_axes)
            batch_rank = 1 + len(layout.batch_axes)
            heads = len(mask.shape) == batch_rank + 1 + 2 * n
            for _ in range(batch_rank + int(heads) + 2 * n - len(mask.shape)):
                mask = ops.expand_dims(mask, 0)
            if not layout.trivial:
                # Rare (images, video): broadcast to full size, then flatten.
                q_shape, v_shape = ops.shape(query), ops.shape(value)
                full = (
                    (q_shape[0],)
                    + tuple(q_shape[a] for a in layout.batch_axes)
                    + ((mask.shape[batch_rank],) if heads else ())
                    + tuple(q_shape[a] for a in layout.attention_axes)
                    + tuple(v_shape[a] for a in layout.attention_axes)
                )
                mask = ops.broadcast_to(mask, full)
                mask = ops.reshape(
                    mask,
                    (-1,)
                    + ((full[batch_rank],) if heads else ())
                    + (flat_query_length, flat_key_length),
                )
            if heads and mask.shape[1] == 1:
                mask, heads = mask[:, 0], False
            if not heads and mask.shape[1] == 1:  # (B|1, 1, Tv): a key mask
                key_mask = masking.merge_masks(key_mask, mask[:, 0, :])
                mask = None
            elif not heads and mask.shape[2] == 1:  # (B|1, Tq, 1): a query mask
                query_mask = masking.merge_masks(query_mask, mask[:, :, 0])
                mask = None
            attention_mask = mask
        return attention_masks.AttentionMask(
            query_mask=query_mask,
            key_mask=key_mask,
            pair_mask=attention_mask,
            causal=causal,
            sliding_window=self._sliding_window,
            **positions,
        )

    def _call_mask(self, mask, options, layout, flat_query, key_length, self_attention):
        """`mask` with the call's rules (`segment_ids`, `key_segment_ids`,
        `prefix_length`, checked); `self_attention`: whether the keys are
        the queries (`BaseAttention._keys_are_queries`, never with a cache)."""
        changes = call_checks.rule_changes(
            self,
            layout,
            tuple(flat_query.shape),
            key_length,
            self_attention,
            options.segment_ids,
            options.key_segment_ids,
            options.prefix_length,
        )
        return mask.replace(**changes) if changes else mask

    def _positions(self, options, layout, query_shape, key_shape, self_attention):
        """Hook: `(query positions, key positions)` of a call, checked; the
        rotary layers' (`MultiHeadAttention`); None: `0 .. T - 1`."""
        return None, None

    def _prepare_inputs(self, query, value, key, options):
        """The `PreparedCall` of a call without a cache: flat inputs, one mask."""
        self_attention = self._keys_are_queries(query, value, key)
        query, value, key, query_mask, value_mask, layout = self._prepare(
            query, value, key, options
        )
        # Integer inputs run in the compute dtype, as Keras' layers compute.
        query, value, key = (self._to_compute_dtype(x) for x in (query, value, key))
        flat_query = layout.flatten(query)
        flat_value, flat_key = layout.flatten(value), layout.flatten(key)
        query_mask = masking.to_bool_mask(layout.flatten(query_mask, features=False))
        key_mask = masking.merge_masks(
            layout.flatten(value_mask, features=False),
            layout.flatten(options.key_mask, features=False),
        )
        spec = self._attention_mask(
            layout,
            query,
            value,
            query_mask,
            key_mask,
            options.attention_mask,
            ops.shape(flat_query)[1],
            ops.shape(flat_value)[1],
            options.use_causal_mask,
        )
        spec = self._call_mask(spec, options, layout, flat_query, flat_key.shape[1], self_attention)
        positions = self._positions(
            options, layout, tuple(flat_query.shape), tuple(flat_key.shape), self_attention
        )
        # Masked positions are zeroed before the projections (a `where`, not
        # a product), so whatever they hold (NaN, Inf) contributes nothing to
        # any kernel's output or gradient. `ops.copy` keeps the caller's
        # Keras masks off the projections' inputs.
        return call_options.PreparedCall(
            query=query,
            flat_query=flat_query,
            mask=spec,
            layout=layout,
            value_shape=tuple(ops.shape(value)),
            flat_key=masking.zero_masked(ops.copy(flat_key), spec.key_mask),
            flat_value=masking.zero_masked(ops.copy(flat_value), spec.key_mask),
            query_positions=positions[0],
            key_positions=positions[1],
        )

    def _project_query(self, prepared):
        """`(projected query (B, Tq, H, D), gate or None)`."""
        flat_query = masking.zero_masked(ops.copy(prepared.flat_query), prepared.mask.query_mask)
        gate = self._gate_dense(flat_query) if self._use_gate else None
        return self._query_dense(flat_query), gate

    def _project_key_value(self, key, value, positions=None):
        """Projected `(key, value)`, non-finite positions confined."""
        return masking.confine_nonfinite(self._key_dense(key), self._value_dense(value))

    def _run_compute_attention(self, query, key, value, mask, training, return_attention_scores):
        """`_compute_attention`, given a Keras-style merged mask when a
        subclass written for Keras overrides it."""
        hook = type(self)._compute_attention
        if utils.has_contract(hook):
            return self._compute_attention(
                query, key, value, mask, training, return_attention_scores
            )
        merged = mask.dense(ops.shape(query)[1], ops.shape(key)[1])
        if merged is not None:
            if not mask.per_head:
                merged = merged[:, 0]
            merged = ops.broadcast_to(
                merged,
                (ops.shape(query)[0],)
                + tuple(ops.shape(merged)[1:-2])
                + (ops.shape(query)[1], ops.shape(key)[1]),
            )
        optional = {"training": training}
        if "return_attention_scores" in inspect.signature(hook).parameters:
            optional["return_attention_scores"] = return_attention_scores
        return self._compute_attention(query, key, value, merged, **optional)

    def _attend_and_project(self, prepared, query, gate, key, value, options, head_mask=None):
        """Kernel, gate, output projection and result tuple of a call;
        `head_mask` (checked) scales each head's result before the projection."""
        return_weights = options.return_attention_scores
        weights_requested = return_weights and not options.selects_weights
        if masking.is_statically_empty(query, key):
            # No query, or no key (nothing to attend to: the zeros of a fully
            # masked row), on every kernel and in every subclass.
            output, weights = masking.empty_attention(query, value, return_weights=True)
        else:
            output, weights = self._run_compute_attention(
                query, key, value, prepared.mask, options.training, weights_requested
            )
            if weights is not None:
                weights = self._zero_hidden_weights(weights, prepared.mask)
        if weights_requested and weights is None:
            raise ValueError(
                self._error(
                    "this attention kernel does not compute attention weights; "
                    "call with return_attention_scores=False"
                )
            )
        self._record_attention(weights)
        # A masked query row's attention result is zero on every kernel, so
        # its output is the output projection's bias, as a row with no key.
        output = masking.zero_masked(output, prepared.mask.query_mask)
        # After the kernel, so every kernel honours it; the weights stay unmasked.
        output = head_masks.apply_head_mask(output, head_mask)
        if gate is not None:
            output = output * gate
        output = self._output_dense(output)
        flat_query = prepared.flat_query
        if masking.is_statically_empty(flat_query):
            # TF's einsum gives a fully empty (0, 0, ...) input a batch of 1.
            # The batch may be unknown here (a compiled call): dynamic shape.
            batch, length = ops.shape(flat_query)[0], ops.shape(flat_query)[1]
            output = ops.zeros((batch, length) + tuple(output.shape[2:]), output.dtype)
        query_shape = tuple(ops.shape(prepared.query))
        output = prepared.layout.unflatten(output, query_shape)
        if not return_weights:
            return (output,)
        if not prepared.layout.trivial and weights is not None:
            weights = ops.reshape(
                weights,
                prepared.layout.scores_shape(query_shape, prepared.value_shape, self._num_heads),
            )
        return output, weights

    @staticmethod
    def _zero_hidden_weights(weights, mask):
        """`(B, H, Tq, Tv)` weights, zero on masked query rows and keys (the
        approximate kernels would not be)."""
        keep = masking.merge_masks(
            None if mask.query_mask is None else mask.query_mask[:, None, :, None],
            None if mask.key_mask is None else mask.key_mask[:, None, None, :],
        )
        if keep is None:
            return weights
        return ops.where(keep, weights, ops.zeros((), dtype=weights.dtype))

    def compute_output_spec(self, *args, **kwargs):
        if not utils.has_contract(type(self).call):
            # A subclass written for Keras' layer (KerasHub's cached
            # attention): trace its own `call`.
            return keras.layers.Layer.compute_output_spec(self, *args, **kwargs)
        results = self._output_spec(*call_options.bind(self, args, kwargs))
        return results[0] if len(results) == 1 else results

    def _output_spec(self, query, value, key, options):
        """The `KerasTensor`s a call returns, after the checks a call runs."""
        self_attention = self._keys_are_queries(query, value, key)
        query, value, key, _, _, layout = self._prepare(query, value, key, options)
        checked = layout if len(query.shape) > 3 else None
        call_checks.rule_changes(
            self,
            checked,
            tuple(query.shape),
            value.shape[1],
            self_attention,
            options.segment_ids,
            options.key_segment_ids,
            options.prefix_length,
        )
        self._positions(options, checked, tuple(query.shape), tuple(value.shape), self_attention)
        dims = self._output_shape or (query.shape[-1],)
        results = (
            keras.KerasTensor(tuple(query.shape[:-1]) + tuple(dims), dtype=self.compute_dtype),
        )
        if options.return_attention_scores:
            shape = layout.scores_shape(tuple(query.shape), tuple(value.shape), self._num_heads)
            results += (keras.KerasTensor(shape, dtype=self.compute_dtype),)
        return results

    # ---------------------------------------------------------------- config
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self._num_heads,
                "key_dim": self._key_dim,
                "value_dim": self._value_dim,
                "use_bias": (
                    self._use_bias if isinstance(self._use_bias, bool) else list(self._use_bias)
                ),
                "output_shape": self._output_shape,
                "use_gate": self._use_gate,
                "num_key_value_heads": self._num_key_value_heads,
                "kernel_initializer": keras.initializers.serialize(self._kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self._bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self._kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self._bias_regularizer),
                "activity_regularizer": keras.regularizers.serialize(self._activity_regularizer),
                "kernel_constraint": keras.constraints.serialize(self._kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self._bias_constraint),
            }
        )
        return config


# `use_bias` may name the projections with a bias; "output" is the sublayer
# `attention_output`.
_BIAS_NAMES = {"attention_output": "output"}
PROJECTIONS = ("query", "key", "value", "output", "gate")


def _validate_use_bias(owner, use_bias):
    """`use_bias`: a bool (every projection), or the names of the
    projections that have one (Qwen 2: query, key and value only)."""
    if isinstance(use_bias, (list, tuple, set, frozenset)):
        names = tuple(use_bias)
        unknown = [n for n in names if n not in PROJECTIONS]
        if unknown or len(set(names)) != len(names):
            raise ValueError(
                f"{owner}: `use_bias` must be a bool or names among {PROJECTIONS}, "
                f"each once. Received: use_bias={use_bias!r}"
            )
        return tuple(n for n in PROJECTIONS if n in names)
    return validation.validate_bool(owner, "use_bias", use_bias)
