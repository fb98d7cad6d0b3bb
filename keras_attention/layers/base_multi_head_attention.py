"""The multi-head family: Keras' projections and call, a kernel per layer.

`MultiHeadAttention` (exact attention), `SparseAttention`,
`PerformerAttention` and `LinformerAttention` are siblings: each subclasses
`BaseMultiHeadAttention`, takes its own arguments and supplies only its
attention kernel.
"""

import inspect

import keras
from keras import ops

from keras_attention import distribution
from keras_attention.api_export import keras_attention_export
from keras_attention.layers import utils
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.ops import masking
from keras_attention.ops import multi_head


class _Layout:
    """How an input of rank > 3 maps to the `(B', T, features)` the kernels see.

    The attention axes are flattened into one time axis; the other middle
    axes join the batch. `keras.layers.MultiHeadAttention` computes the same
    thing with generated einsum equations.
    """

    def __init__(self, rank, attention_axes):
        self.rank = rank
        self.attention_axes = tuple(attention_axes)
        self.batch_axes = tuple(
            axis for axis in range(1, rank - 1) if axis not in self.attention_axes
        )
        self.trivial = rank == 3  # (B, T, F): nothing to move

    def flatten(self, x, features=True):
        """`(B, ..., F)` -> `(B', T, F)`; `features=False` for masks `(B, ...)`."""
        if self.trivial or x is None:
            return x
        last = (self.rank - 1,) if features else ()
        x = ops.transpose(x, (0,) + self.batch_axes + self.attention_axes + last)
        shape = ops.shape(x)
        start = 1 + len(self.batch_axes)
        length = shape[start]
        for i in range(1, len(self.attention_axes)):
            length = length * shape[start + i]
        return ops.reshape(x, (-1, length) + ((x.shape[-1],) if features else ()))

    def unflatten(self, x, query_shape):
        """`(B', Tq, *out)` back to `(B, ..., *out)` in the query's axis order."""
        if self.trivial:
            return x
        out_dims = tuple(x.shape[2:])
        order = (0,) + self.batch_axes + self.attention_axes
        x = ops.reshape(x, tuple(query_shape[a] for a in order) + out_dims)
        inverse = [order.index(axis) for axis in range(self.rank - 1)]
        inverse += [self.rank - 1 + i for i in range(len(out_dims))]
        return ops.transpose(x, inverse)

    def scores_shape(self, query_shape, key_shape, num_heads):
        """Keras' layout: `(B, <batch axes>, H, <query axes>, <key axes>)`."""
        return (
            (query_shape[0],)
            + tuple(query_shape[a] for a in self.batch_axes)
            + (num_heads,)
            + tuple(query_shape[a] for a in self.attention_axes)
            + tuple(key_shape[a] for a in self.attention_axes)
        )


def _zero_masked_weights(weights, query_mask, key_mask):
    """`(B, H, Tq, Tv)` weights, zero on masked query rows and keys."""
    keep = masking.merge_masks(
        None if query_mask is None else query_mask[:, None, :, None],
        None if key_mask is None else key_mask[:, None, None, :],
    )
    if keep is None:
        return weights
    return ops.where(keep, weights, ops.zeros((), dtype=weights.dtype))


@keras_attention_export("layers")
class BaseMultiHeadAttention(BaseAttention):
    """Multi-head attention's projections and call; subclasses give the kernel.

    Holds what every multi-head layer shares with
    `keras.layers.MultiHeadAttention`: the query/key/value projections
    (sublayers named `query`, `key`, `value`, `gate`, `attention_output`,
    created in Keras' order, so `set_weights` / `load_weights` of a Keras
    layer's weights and `DTypePolicyMap` or quantization keyed on those names
    work unchanged), the call signature and its masks, the optional sigmoid
    gate, the output projection and zeroed masked query rows.

    A subclass implements `_attend` (heads already repeated to one key/value
    head per query head) or, for full control, `_compute_attention`.

    Args:
        num_heads: number of query heads `H`.
        key_dim: size `D` of each query/key head.
        value_dim: size `Dv` of each value head; defaults to `key_dim`.
        dropout: fraction of attention weights dropped during training.
        use_bias: whether the projections have biases.
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
        name = type(self).__name__
        utils.validate_positive_int(name, "num_heads", num_heads)
        utils.validate_positive_int(name, "key_dim", key_dim)
        utils.validate_positive_int(name, "value_dim", value_dim, allow_none=True)
        utils.validate_positive_int(
            name, "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                f"{name}: `num_key_value_heads` must divide `num_heads` "
                f"({num_heads}). Received: num_key_value_heads="
                f"{num_key_value_heads!r}"
            )
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.value_dim = int(value_dim or key_dim)
        self.num_key_value_heads = int(num_key_value_heads or num_heads)
        self.use_bias = bool(use_bias)
        self.use_gate = bool(use_gate)
        self._output_shape = self._standardize_output_shape(output_shape)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self._projection_activity_regularizer = keras.regularizers.get(
            activity_regularizer
        )
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self._scale = utils.inverse_sqrt(self.key_dim)
        self._attention_axes = None  # None: every axis between batch and features

    def _standardize_output_shape(self, output_shape):
        if output_shape is None:
            return None
        dims = (output_shape,) if isinstance(output_shape, int) else output_shape
        try:
            dims = tuple(dims)
        except TypeError:
            dims = None
        if not dims or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims
        ):
            raise ValueError(
                f"{type(self).__name__}: Invalid `output_shape`: it must be a "
                "positive integer or a tuple of positive integers. Received: "
                f"output_shape={output_shape!r}"
            )
        return dims

    # --------------------------------------------------------------- shapes
    def _layout(self, rank):
        axes = self._attention_axes
        if axes is None:
            axes = tuple(range(1, rank - 1))
        return _Layout(rank, tuple(a if a >= 0 else rank + a for a in axes))

    def _check_shapes(self, query_shape, value_shape, key_shape):
        """Keras' rules, with errors that name the layer and the shapes."""
        for name, shape in (
            ("query_shape", query_shape), ("value_shape", value_shape),
            ("key_shape", key_shape),
        ):
            if shape is not None and not isinstance(shape, (tuple, list)) and not (
                hasattr(shape, "__len__") and hasattr(shape, "__getitem__")
            ):
                raise ValueError(
                    self._error(
                        f"`{name}` must be a shape (a tuple of dimensions). "
                        f"Received: {name}={shape!r}"
                    )
                )
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(
                self._error(
                    "All dimensions of `value` and `key`, except the last one, "
                    f"must be equal. Received: value_shape={value_shape} and "
                    f"key_shape={key_shape}"
                )
            )
        for name, shape in (("query", query_shape), ("value", value_shape)):
            if len(shape) < 3:
                raise ValueError(
                    self._error(
                        f"`{name}` must have rank >= 3 (batch, time..., "
                        f"features). Received: {name} with shape {shape}"
                    )
                )
        if len(value_shape) != len(query_shape):
            raise ValueError(
                self._error(
                    "`query` and `value` must have the same rank, and all "
                    "dimensions except the attention axes and the last one "
                    f"must be equal. Received: query_shape={query_shape} and "
                    f"value_shape={value_shape}"
                )
            )
        layout = self._layout(len(query_shape))
        for axis in layout.attention_axes:
            if not 1 <= axis <= len(query_shape) - 2:
                raise ValueError(
                    self._error(
                        "`attention_axes` must name axes between the batch and "
                        f"the feature axis. Received: attention_axes="
                        f"{self._attention_axes} for inputs of rank "
                        f"{len(query_shape)}"
                    )
                )
        for axis in layout.batch_axes:
            q, v = query_shape[axis], value_shape[axis]
            if q is not None and v is not None and q != v:
                raise ValueError(
                    self._error(
                        "All dimensions of `query` and `value` outside the "
                        "attention axes, except the last one, must be equal. "
                        f"Received: query_shape={query_shape} and "
                        f"value_shape={value_shape}"
                    )
                )
        built = getattr(self, "_built_feature_dims", None)
        if built is not None:
            for name, shape, dim in zip(
                ("query", "value", "key"),
                (query_shape, value_shape, key_shape),
                built,
            ):
                if shape[-1] is not None and shape[-1] != dim:
                    raise ValueError(
                        self._error(
                            f"`{name}` has {shape[-1]} features but the layer "
                            f"was built for {dim}. Received: {name} with shape "
                            f"{shape}"
                        )
                    )
        return layout

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        dims = self._output_shape or (query_shape[-1],)
        return tuple(query_shape[:-1]) + tuple(dims)

    # ------------------------------------------------------------------ build
    def _dense(self, output_shape, bias_axes, name, equation="abc,cde->abde",
               activation=None):
        return keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            activation=activation,
            kernel_initializer=utils.clone_initializer(self.kernel_initializer),
            bias_initializer=utils.clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            activity_regularizer=self._projection_activity_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        heads, kv_heads = self.num_heads, self.num_key_value_heads
        out_dims = self._output_shape or (query_shape[-1],)
        self._check_layout(query_shape, value_shape, key_shape, out_dims)
        # Keras' names and creation order (query, key, gate, value, output),
        # which is the order of `get_weights()`.
        self._query_dense = self._dense((None, heads, self.key_dim), "de", "query")
        self._query_dense.build((None, None, query_shape[-1]))
        self._key_dense = self._dense((None, kv_heads, self.key_dim), "de", "key")
        self._key_dense.build((None, None, key_shape[-1]))
        if self.use_gate:
            self._gate_dense = self._dense(
                (None, heads, self.value_dim), "de", "gate", activation="sigmoid"
            )
            self._gate_dense.build((None, None, query_shape[-1]))
        self._value_dense = self._dense(
            (None, kv_heads, self.value_dim), "de", "value"
        )
        self._value_dense.build((None, None, value_shape[-1]))
        letters = "efghijklmnop"[: len(out_dims)]
        self._output_dense = self._dense(
            (None,) + tuple(out_dims),
            letters,
            "attention_output",
            equation=f"abcd,cd{letters}->ab{letters}",
        )
        self._output_dense.build((None, None, heads, self.value_dim))
        self._built_feature_dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self._check_hook_signature()
        self.built = True

    def _check_layout(self, query_shape, value_shape, key_shape, out_dims):
        """Under `ModelParallel`, the heads must divide over the mesh."""
        heads, kv_heads = self.num_heads, self.num_key_value_heads
        head = ("num_heads", "key_dim")
        kv_head = ("num_key_value_heads", "key_dim")
        weights = {
            "query/kernel": ((query_shape[-1], heads, self.key_dim),
                             ("query features",) + head),
            "query/bias": ((heads, self.key_dim), head),
            "key/kernel": ((key_shape[-1], kv_heads, self.key_dim),
                           ("key features",) + kv_head),
            "key/bias": ((kv_heads, self.key_dim), kv_head),
            "value/kernel": ((value_shape[-1], kv_heads, self.value_dim),
                             ("value features", "num_key_value_heads",
                              "value_dim")),
            "value/bias": ((kv_heads, self.value_dim),
                           ("num_key_value_heads", "value_dim")),
            "attention_output/kernel": (
                (heads, self.value_dim) + tuple(out_dims),
                ("num_heads", "value_dim") + ("output_shape",) * len(out_dims)),
        }
        if self.use_gate:
            weights["gate/kernel"] = (
                (query_shape[-1], heads, self.value_dim),
                ("query features", "num_heads", "value_dim"))
        distribution.check_layout(self, weights)

    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def output_dense(self):
        return self._output_dense

    @property
    def gate_dense(self):
        return self._gate_dense if self.use_gate else None

    def _check_hook_signature(self):
        # A subclass written for keras.layers.MultiHeadAttention overrides
        # `_compute_attention(query, key, value, attention_mask, training,
        # return_attention_scores)`: it gets one merged mask, as in Keras.
        parameters = inspect.signature(self._compute_attention).parameters
        self._hook_takes_split_masks = "query_mask" in parameters
        self._hook_takes_scores_flag = "return_attention_scores" in parameters

    # ------------------------------------------------------------ kernel hook
    def _dropout_callable(self, training):
        """The attention dropout as a callable, or `None` when it cannot act."""
        if self.dropout > 0 and training is not None and training is not False:

            def dropout(weights):
                return self._dropout_layer(weights, training=training)

            return dropout
        return None

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
        *,
        query_mask=None,
        key_mask=None,
    ):
        """The attention kernel over projected heads.

        Args:
            query: `(B, Tq, H, D)` projected queries (not yet scaled).
            key: `(B, Tv, Hkv, D)` projected keys (grouped heads not repeated).
            value: `(B, Tv, Hkv, Dv)` projected values. A position whose key
                or value held NaN/Inf comes as a NaN key and a zero value
                (`masking.confine_nonfinite`): mask logits with `where`.
            attention_mask: boolean `(B|1, Tq, Tv)` or `(B|1, H, Tq, Tv)`, or
                None.
            training: whether dropout is active.
            return_attention_scores: whether the caller needs the weights.
            use_causal_mask: query `i` sees keys `j <= i`.
            query_mask: `(B, Tq)` boolean or None.
            key_mask: `(B, Tv)` boolean or None (value and key masks merged).

        Returns:
            `(output (B, Tq, H, Dv), weights (B, H, Tq, Tv) or None)`. The
            caller applies the gate and output projection, zeroes masked
            query rows and records the weights for `capture_attention`.
        """
        key = multi_head.repeat_key_value_heads(key, self.num_heads)
        value = multi_head.repeat_key_value_heads(value, self.num_heads)
        result = self._attend(
            query,
            key,
            value,
            query_mask=query_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            dropout=self._dropout_callable(training),
            return_weights=return_attention_scores or self._capturing_attention,
        )
        return result if isinstance(result, tuple) else (result, None)

    def _attend(
        self,
        query,
        key,
        value,
        *,
        query_mask,
        key_mask,
        attention_mask,
        use_causal_mask,
        dropout,
        return_weights,
    ):
        """A sibling's kernel: `output`, or `(output, weights)` with `return_weights`.

        `query` is `(B, Tq, H, D)`, `key`/`value` `(B, Tv, H, D)` with the
        heads repeated; `dropout` is a callable on the weights or `None`.
        Options a kernel cannot honour are rejected earlier by
        `_check_call_options`; masked query rows are zeroed by the caller.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement `_attend` or "
            "`_compute_attention`."
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
    def _prepare(self, query, value, key, query_mask, value_mask, key_mask,
                 attention_mask, use_causal_mask):
        """Validates a call; returns the resolved inputs, masks and layout."""
        for name, x in (("query", query), ("value", value), ("key", key)):
            self._check_tensor(name, x)
        if query is None:
            raise TypeError(self._error("`query` is required. Received: query=None"))
        self._check_call_options(query, value, attention_mask, use_causal_mask)
        if value is None and value_mask is None:
            value_mask = query_mask  # self-attention: the keys are the queries
        query, value, key = self._resolve_inputs(query, value, key)
        layout = self._check_shapes(query.shape, value.shape, key.shape)
        query_shape, value_shape = tuple(query.shape), tuple(value.shape)
        self._check_mask("query_mask", query_mask, query_shape[:-1])
        self._check_mask("value_mask", value_mask, value_shape[:-1])
        self._check_mask("key_mask", key_mask, value_shape[:-1])
        batch = (query_shape[0],) + tuple(query_shape[a] for a in layout.batch_axes)
        q_axes = tuple(query_shape[a] for a in layout.attention_axes)
        k_axes = tuple(value_shape[a] for a in layout.attention_axes)
        if attention_mask is not None and len(attention_mask.shape) == (
            len(batch) + 1 + len(q_axes) + len(k_axes)
        ):  # with a head axis, as `(B, H, Tq, Tv)`
            expected = batch + (self.num_heads,) + q_axes + k_axes
        else:
            expected = batch + q_axes + k_axes
        self._check_mask("attention_mask", attention_mask, expected, broadcast=True)
        return query, value, key, query_mask, value_mask, layout

    def _normalize_attention_mask(self, attention_mask, layout, query_mask,
                                  key_mask, query, value, flat_query, flat_value):
        """Keras' mask shapes -> `(query_mask, key_mask, attention_mask)`.

        `attention_mask` comes out boolean and flattened like the inputs,
        `(B|1, Tq, Tv)` or `(B|1, H, Tq, Tv)`. A mask that varies only along
        the keys (as `(B, 1, Tv)`) or only along the queries is folded into
        `key_mask` / `query_mask`, so memory-linear kernels never see a
        `(Tq, Tv)` array.
        """
        if attention_mask is None:
            return query_mask, key_mask, None
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
                + (ops.shape(flat_query)[1], ops.shape(flat_value)[1]),
            )
        if heads and mask.shape[1] == 1:
            mask, heads = mask[:, 0], False
        if heads:
            return query_mask, key_mask, mask
        batch = ops.shape(flat_query)[0]
        if mask.shape[1] == 1:  # (B|1, 1, Tv): a key mask
            length = ops.shape(flat_value)[1]
            folded = ops.broadcast_to(mask[:, 0, :], (batch, length))
            return query_mask, masking.merge_masks(key_mask, folded), None
        if mask.shape[2] == 1:  # (B|1, Tq, 1): a query mask
            length = ops.shape(flat_query)[1]
            folded = ops.broadcast_to(mask[:, :, 0], (batch, length))
            return masking.merge_masks(query_mask, folded), key_mask, None
        return query_mask, key_mask, mask

    def _project_keys(self, query, value, key, cache, cache_update_index,
                      attention_mask, use_causal_mask):
        """Projected `(key, value)`; MultiHeadAttention adds its decoding cache."""
        return self._key_dense(key), self._value_dense(value), attention_mask, use_causal_mask, None

    def _attention_call(
        self,
        query,
        value,
        key,
        query_mask,
        value_mask,
        key_mask,
        attention_mask,
        return_attention_scores,
        training,
        use_causal_mask,
        mask,
        cache=None,
        cache_update_index=None,
        scores_selection=None,
    ):
        if query_mask is None:
            query_mask = mask
        query, value, key, query_mask, value_mask, layout = self._prepare_or_cache(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            use_causal_mask, cache, cache_update_index,
        )
        # Integer inputs run in the compute dtype, as Keras' layers compute.
        query, value, key = (self._to_compute_dtype(x) for x in (query, value, key))
        query_shape = ops.shape(query)
        flat_query = layout.flatten(query)
        flat_value, flat_key = layout.flatten(value), layout.flatten(key)
        query_mask = masking.to_bool_mask(layout.flatten(query_mask, features=False))
        key_mask = masking.merge_masks(
            layout.flatten(value_mask, features=False),
            layout.flatten(key_mask, features=False),
        )
        query_mask, key_mask, attention_mask = self._normalize_attention_mask(
            attention_mask, layout, query_mask, key_mask, query,
            value if cache is None else None, flat_query,
            flat_value if cache is None else cache[:, 0],
        )
        # Masked positions are zeroed before the projections (a `where`, not a
        # product), so whatever they hold (NaN, Inf) contributes nothing to
        # any kernel's output or gradient. It also keeps the caller's Keras
        # masks off the projections (Keras clears the caller's tensors).
        flat_query = masking.zero_masked(ops.copy(flat_query), query_mask)
        if flat_value is not None:
            flat_value = masking.zero_masked(ops.copy(flat_value), key_mask)
            flat_key = masking.zero_masked(ops.copy(flat_key), key_mask)
        projected_query = self._query_dense(flat_query)  # (B, Tq, H, D)
        gate = self._gate_dense(flat_query) if self.use_gate else None
        projected_key, projected_value, attention_mask, use_causal_mask, new_cache = (
            self._project_keys(
                flat_query,
                flat_value,
                flat_key,
                cache,
                cache_update_index,
                attention_mask,
                use_causal_mask,
            )
        )
        if cache is not None:  # the cache's masked positions, likewise
            projected_key = masking.zero_masked(projected_key, key_mask)
            projected_value = masking.zero_masked(projected_value, key_mask)
        else:
            # NaN/Inf at a key that a per-query mask hides from some queries
            # reaches only those that see it, on every kernel (a cache's
            # entries are confined when they are written).
            projected_key, projected_value = masking.confine_nonfinite(
                projected_key, projected_value
            )
        if masking.is_statically_empty(projected_query, projected_key):
            # No query, or no key (nothing to attend to: the zeros of a fully
            # masked row), on every kernel and in every subclass.
            output, weights = masking.empty_attention(
                projected_query, projected_value, return_weights=True
            )
            if scores_selection is not None:
                weights = ops.zeros(
                    scores_selection.shape(tuple(ops.shape(weights))),
                    dtype=weights.dtype,
                )
        else:
            output, weights = self._run_hook(
                projected_query,
                projected_key,
                projected_value,
                query_mask=query_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                scores_selection=scores_selection,
            )
            if weights is not None and scores_selection is None:
                # Every kernel's weights honour the masks: zero for masked
                # query rows and masked keys (approximate kernels would not).
                weights = _zero_masked_weights(weights, query_mask, key_mask)
        if return_attention_scores and weights is None:
            raise ValueError(
                self._error(
                    "this attention kernel does not compute attention weights; "
                    "call with return_attention_scores=False"
                )
            )
        if scores_selection is None:
            self._record_attention(weights)
        if gate is not None:
            output = output * gate
        output = self._output_dense(output)
        if masking.is_statically_empty(flat_query):
            # TF's einsum gives a fully empty (0, 0, ...) input a batch of 1.
            # The batch may be unknown here (a compiled call): dynamic shape.
            batch, length = ops.shape(flat_query)[0], ops.shape(flat_query)[1]
            output = ops.zeros((batch, length) + tuple(output.shape[2:]), output.dtype)
        output = masking.zero_masked(output, query_mask)
        results = (layout.unflatten(output, query_shape),)
        if return_attention_scores:
            if not layout.trivial:
                weights = ops.reshape(
                    weights,
                    layout.scores_shape(query_shape, ops.shape(value), self.num_heads),
                )
            results += (weights,)
        if new_cache is not None:
            results += (new_cache,)
        return results[0] if len(results) == 1 else results

    def _prepare_or_cache(self, query, value, key, query_mask, value_mask, key_mask,
                          attention_mask, use_causal_mask, cache, cache_update_index):
        query, value, key, query_mask, value_mask, layout = self._prepare(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            use_causal_mask,
        )
        return query, value, key, query_mask, value_mask, layout

    def _run_hook(self, query, key, value, *, query_mask, key_mask, attention_mask,
                  use_causal_mask, training, return_attention_scores,
                  scores_selection):
        if self._hook_takes_split_masks:
            kwargs = {}
            if scores_selection is not None:
                kwargs["scores_selection"] = scores_selection
            return self._compute_attention(
                query,
                key,
                value,
                attention_mask,
                training,
                return_attention_scores,
                use_causal_mask,
                query_mask=query_mask,
                key_mask=key_mask,
                **kwargs,
            )
        # A Keras-style override: one merged `(B, Tq, Tv)` mask.
        merged = masking.attention_mask_from(
            query_mask=query_mask,
            value_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_length=ops.shape(query)[1],
            key_length=ops.shape(key)[1],
        )
        if merged is not None and len(merged.shape) == 3:
            merged = ops.broadcast_to(
                merged, (ops.shape(query)[0], ops.shape(query)[1], ops.shape(key)[1])
            )
        optional = {"training": training}
        if self._hook_takes_scores_flag:
            optional["return_attention_scores"] = return_attention_scores
        return self._compute_attention(query, key, value, merged, **optional)

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
        return self._attention_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            return_attention_scores, training, use_causal_mask, mask,
        )

    def _output_spec(self, query, value, key, query_mask, value_mask, key_mask,
                     attention_mask, return_attention_scores, use_causal_mask,
                     cache=None, cache_update_index=None, scores_selection=None):
        query, value, key, _, _, layout = self._prepare_or_cache(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            use_causal_mask, cache, cache_update_index,
        )
        dims = self._output_shape or (query.shape[-1],)
        results = (
            keras.KerasTensor(
                tuple(query.shape[:-1]) + tuple(dims), dtype=self.compute_dtype
            ),
        )
        if return_attention_scores:
            if cache is not None:
                keys_shape = (cache.shape[0], cache.shape[2], None)
            else:
                keys_shape = tuple(value.shape)
            shape = layout.scores_shape(tuple(query.shape), keys_shape, self.num_heads)
            if scores_selection is not None:
                shape = scores_selection.shape(shape)
            results += (keras.KerasTensor(shape, dtype=self.compute_dtype),)
        if cache is not None:
            results += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return results[0] if len(results) == 1 else results

    def compute_output_spec(
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
        return self._output_spec(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            return_attention_scores, use_causal_mask,
        )

    # ---------------------------------------------------------------- config
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "use_bias": self.use_bias,
                "output_shape": self._output_shape,
                "use_gate": self.use_gate,
                "num_key_value_heads": self.num_key_value_heads,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
                "bias_regularizer": keras.regularizers.serialize(
                    self.bias_regularizer
                ),
                "activity_regularizer": keras.regularizers.serialize(
                    self._projection_activity_regularizer
                ),
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(
                    self.bias_constraint
                ),
            }
        )
        return config
