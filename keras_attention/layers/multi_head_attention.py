import numbers

import keras
from keras import ops

from keras_attention.api_export import keras_attention_export
from keras_attention.layers import utils
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.ops import masking
from keras_attention.ops.cache import update_cache
from keras_attention.ops import multi_head
from keras_attention.ops.memory_efficient import memory_efficient_attention
from keras_attention.ops import ring_attention
from keras_attention.ops.xla import tensorflow_xla_trace

# The fused kernel, looked up here so that tests can prove it ran.
dot_product_attention = ops.dot_product_attention

# Keys at or beyond this length switch "auto" to the memory-efficient kernel.
# Measured with benchmarks/mha_benchmark.py on a 2-core CPU (TF graph mode,
# batch 1, 8 heads of 64): the recomputing backward does 7/6 of the exact
# kernel's matmul work, and on a CPU the exact kernel's matmuls run at full
# speed, so the memory-efficient kernel is ~1.1x slower at 8192; but there the
# exact kernel (ours or Keras') peaks at 7.3 GiB against 1.3 GiB, and at 16384
# it runs out of memory. See benchmarks/RESULTS.md.
DEFAULT_MEMORY_EFFICIENT_THRESHOLD = 8192
DEFAULT_BLOCK_SIZE = 1024


def _fused_kernel_available():
    """Whether `keras.ops.dot_product_attention` has a fused kernel here."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() in ("gpu", "tpu")
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    return False


def _softmax(logits, mask):
    """`masking.masked_softmax`, on the backend's fused softmax when it can.

    The fused op (one pass forward, one fused gradient) is measurably faster
    than the written-out softmax at long lengths; it is skipped for a
    length-1 key axis, where `ops.softmax` warns.
    """
    if logits.shape[-1] is None or logits.shape[-1] < 2:
        return masking.masked_softmax(logits, mask)
    dtype = logits.dtype
    if mask is None:
        return ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), dtype)
    weights = ops.softmax(ops.where(mask, ops.cast(logits, "float32"), -1e9), axis=-1)
    # A row with no allowed key would be uniform: zero it.
    return ops.cast(ops.where(mask, weights, 0.0), dtype)


class _ScoresSelection:
    """Which heads and query rows `return_attention_scores` returns."""

    def __init__(self, layer, heads, query_range):
        self.heads = None
        if heads is not None:
            received = heads
            if isinstance(heads, numbers.Integral):
                heads = [heads]
            valid = (
                isinstance(heads, (list, tuple))
                and heads
                and all(
                    isinstance(h, numbers.Integral)
                    and not isinstance(h, bool)
                    and 0 <= h < layer.num_heads
                    for h in heads
                )
            )
            if not valid or isinstance(received, bool):
                raise ValueError(
                    layer._error(
                        "`attention_scores_heads` must be a head index or a "
                        f"non-empty list of indices in [0, {layer.num_heads}). "
                        f"Received: attention_scores_heads={received!r}"
                    )
                )
            self.heads = [int(h) for h in heads]
        self.query_range = None
        if query_range is not None:
            ok = (
                isinstance(query_range, (tuple, list))
                and len(query_range) == 2
                and all(
                    isinstance(x, numbers.Integral) and not isinstance(x, bool)
                    for x in query_range
                )
                and 0 <= query_range[0] < query_range[1]
            )
            if not ok:
                raise ValueError(
                    layer._error(
                        "`attention_scores_query_range` must be (start, stop) "
                        "with 0 <= start < stop. Received: "
                        f"attention_scores_query_range={query_range!r}"
                    )
                )
            self.query_range = (int(query_range[0]), int(query_range[1]))

    def check_length(self, layer, query_length):
        if self.query_range and query_length is not None:
            if self.query_range[1] > query_length:
                raise ValueError(
                    layer._error(
                        "`attention_scores_query_range` must lie inside the "
                        f"query of length {query_length}. Received: "
                        f"attention_scores_query_range={self.query_range}"
                    )
                )

    def shape(self, full):
        """The selected scores' shape given the full `(B, H, Tq, Tv)`."""
        batch, heads, rows, keys = full
        if self.heads is not None:
            heads = len(self.heads)
        if self.query_range is not None:
            rows = self.query_range[1] - self.query_range[0]
        return (batch, heads, rows, keys)


def _validate_attention_axes(attention_axes):
    if attention_axes is None:
        return None
    if isinstance(attention_axes, numbers.Integral) and not isinstance(
        attention_axes, bool
    ):
        return (int(attention_axes),)
    if not isinstance(attention_axes, (list, tuple)) or not all(
        isinstance(a, numbers.Integral) and not isinstance(a, bool)
        for a in attention_axes
    ) or not attention_axes:
        raise ValueError(
            "MultiHeadAttention: `attention_axes` must be an int, list, or "
            f"tuple of ints. Received: attention_axes={attention_axes!r}"
        )
    return tuple(int(a) for a in attention_axes)


@keras_attention_export("layers")
class MultiHeadAttention(BaseMultiHeadAttention):
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

    Kernels: `flash_attention=True` runs the backend's fused kernel where one
    exists (`keras.ops.dot_product_attention` on JAX GPU/TPU and torch CUDA)
    and our blockwise kernel elsewhere (TensorFlow, CPUs), where Keras would
    raise; `flash_attention=False` always materialises the weights;
    `flash_attention=None` (default) follows `memory_efficient`. Weights that
    must be stored (returned, captured, or dropped out in training) always
    come from the materialised path.

    Args:
        num_heads: number of query heads `H`.
        key_dim: size `D` of each query/key head.
        value_dim: size `Dv` of each value head; defaults to `key_dim`.
        dropout: fraction of attention weights dropped during training.
        use_bias: whether the projections have biases.
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
            `False`. `"auto"` uses the blockwise kernel when the key length is
            at least `memory_efficient_threshold` and the weights need not be
            stored; `True` whenever they need not be stored and lengths are
            static; `False` never (the documented way back to speed at
            L = 8192 on CPU, see benchmarks/RESULTS.md).
        memory_efficient_threshold: (keyword-only) key length from which
            `"auto"` switches; defaults to 8192.
        block_size: (keyword-only) query and key tile length of the blockwise
            kernel.
        sequence_parallel: (keyword-only) `None` (default), or the name of
            an axis of the current `keras.distribution` device mesh (JAX
            backend): the sequences are split over that axis and exact
            attention runs ring-style (`keras_attention.ops.ring_attention`:
            each device keeps its query block while key/value blocks rotate
            with `jax.lax.ppermute`), so no device holds more than a
            `(T/N, T/N)` tile of logits. The axis size must divide both
            sequence lengths. Query, key and causal masks are supported;
            `attention_mask`, `sliding_window`, dropout and returned or
            captured weights are not (ValueError).
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
            values (`[:, 1]`). With `cache_update_index`, the keys/values of
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

    Returns:
        `(B, Tq, *output_shape)`; with `return_attention_scores=True` also the
        weights (`(B, H, Tq, Tv)`, or the selection); with a cache also the
        (updated) cache, last. Query rows masked by `query_mask` (or the
        Keras mask) are zero.

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
        memory_efficient_threshold=DEFAULT_MEMORY_EFFICIENT_THRESHOLD,
        block_size=DEFAULT_BLOCK_SIZE,
        sequence_parallel=None,
        **kwargs,
    ):
        name = type(self).__name__
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
        self._attention_axes = _validate_attention_axes(attention_axes)
        if sliding_window is not None and (
            isinstance(sliding_window, bool)
            or not isinstance(sliding_window, numbers.Integral)
            or sliding_window <= 0
        ):
            raise ValueError(
                f"{name}: `sliding_window` must be `None` or a positive "
                f"integer. Received: sliding_window={sliding_window!r}"
            )
        self._sliding_window = sliding_window
        if flash_attention not in (None, True, False):
            raise ValueError(
                f"{name}: `flash_attention` must be None, True or False. "
                f"Received: flash_attention={flash_attention!r}"
            )
        self.flash_attention = flash_attention
        if flash_attention and self.dropout > 0.0:
            raise ValueError(
                f"{name}: Dropout is not supported when flash attention is "
                "enabled. Please set dropout to 0.0 to use flash attention. "
                f"Received: dropout={dropout!r}, flash_attention=True"
            )
        if memory_efficient not in (True, False, "auto"):
            raise ValueError(
                f"{name}: `memory_efficient` must be True, False or 'auto'. "
                f"Received: memory_efficient={memory_efficient!r}"
            )
        if flash_attention is not None and memory_efficient is (not flash_attention):
            raise ValueError(
                f"{name}: flash_attention={flash_attention} contradicts "
                f"memory_efficient={memory_efficient}; set only one. Received: "
                f"flash_attention={flash_attention!r}, "
                f"memory_efficient={memory_efficient!r}"
            )
        self.memory_efficient = memory_efficient
        self.memory_efficient_threshold = utils.validate_positive_int(
            name, "memory_efficient_threshold", memory_efficient_threshold
        )
        self.block_size = utils.validate_positive_int(name, "block_size", block_size)
        if sequence_parallel is not None:
            if not isinstance(sequence_parallel, str) or not sequence_parallel:
                raise ValueError(
                    f"{name}: `sequence_parallel` must be None or the name of "
                    "a device mesh axis. Received: "
                    f"sequence_parallel={sequence_parallel!r}"
                )
            unsupported = {
                "dropout": (self.dropout > 0.0, dropout),
                "sliding_window": (sliding_window is not None, sliding_window),
                "flash_attention": (flash_attention is not None, flash_attention),
            }
            for argument, (given, received) in unsupported.items():
                if given:
                    raise ValueError(
                        f"{name}: `sequence_parallel` (ring attention) does "
                        f"not support `{argument}`. Received: "
                        f"sequence_parallel={sequence_parallel!r}, "
                        f"{argument}={received!r}"
                    )
        self.sequence_parallel = sequence_parallel

    @property
    def attention_axes(self):
        return self._attention_axes

    @property
    def sliding_window(self):
        return self._sliding_window

    @property
    def _flash_attention(self):
        """Keras' name: whether the fused path is forced."""
        return bool(self.flash_attention)

    # ------------------------------------------------------ kernel selection
    def _weights_must_be_stored(self, training, return_attention_scores):
        if return_attention_scores or self._capturing_attention:
            return True
        return self.dropout > 0 and training is not None and training is not False

    def _kernel_for(self, query, key, training, weights_needed):
        """`"ring"`, `"fused"`, `"blockwise"` or `"dense"` (materialised)."""
        if self.sequence_parallel is not None:
            return "ring"
        if weights_needed or self.flash_attention is False:
            return "dense"
        if self.memory_efficient is False:
            return "dense"
        static = query.shape[1] is not None and key.shape[1] is not None
        # The fused kernels need equal key and value head sizes.
        fused_allowed = (
            keras.config.is_flash_attention_enabled() is not False
            and self.value_dim == self.key_dim
        )
        if self.flash_attention:
            fused = _fused_kernel_available() and self.value_dim == self.key_dim
            return "fused" if fused else ("blockwise" if static else "dense")
        if fused_allowed and _fused_kernel_available():
            return "fused"
        if not static:
            return "dense"
        if self.memory_efficient == "auto":
            long = key.shape[1] >= self.memory_efficient_threshold
            return "blockwise" if long and query.shape[1] > 1 else "dense"
        return "blockwise"

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
        scores_selection=None,
    ):
        """The exact kernels over projected heads (see `BaseMultiHeadAttention`).

        Also takes `scores_selection` (the heads/rows to return weights for).
        """
        full_weights = return_attention_scores and scores_selection is None
        if full_weights and self.flash_attention:
            raise ValueError(
                self._error(
                    "Returning attention scores is not supported when flash "
                    "attention is enabled. Please disable flash attention to "
                    "access attention scores, or select heads/rows with "
                    "`attention_scores_heads` / `attention_scores_query_range`."
                )
            )
        weights_needed = self._weights_must_be_stored(training, full_weights)
        if scores_selection is not None and self._capturing_attention:
            weights_needed = False
        kernel = self._kernel_for(query, key, training, weights_needed)
        self._last_kernel = kernel  # read by tests and benchmarks
        if kernel == "ring":
            output = self._ring_attention(
                query, key, value, query_mask, key_mask, attention_mask,
                use_causal_mask, weights_needed or scores_selection is not None,
            )
            return output, None
        if kernel == "fused":
            output = self._fused_attention(
                query, key, value, query_mask, key_mask, attention_mask,
                use_causal_mask, flash_attention=True if self.flash_attention else None,
            )
            weights = None
        elif kernel == "blockwise":
            output = memory_efficient_attention(
                query,
                key,
                value,
                scale=self._scale,
                query_mask=query_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                sliding_window=self._sliding_window,
                block_size=self.block_size,
            )
            weights = None
        elif (
            weights_needed
            or self.value_dim != self.key_dim  # JAX's composite kernel needs it
            or tensorflow_xla_trace()  # XLA fuses ours: 0.52x Keras' time at 4096
        ):
            output, weights = self._dense_attention(
                query, key, value, query_mask, key_mask, attention_mask,
                use_causal_mask, training,
            )
        else:
            # What Keras runs when no weights are needed: the backend's
            # composite kernel, materialised but never kept for the caller.
            output = self._fused_attention(
                query, key, value, query_mask, key_mask, attention_mask,
                use_causal_mask, flash_attention=False,
            )
            weights = None
        if scores_selection is not None:
            weights = self._selected_weights(
                query, key, query_mask, key_mask, attention_mask, use_causal_mask,
                scores_selection,
            )
        return output, weights

    def _ring_attention(self, query, key, value, query_mask, key_mask,
                        attention_mask, use_causal_mask, weights_needed):
        axis = self.sequence_parallel
        if weights_needed or attention_mask is not None:
            raise ValueError(
                self._error(
                    f"`sequence_parallel={axis!r}` (ring attention) never "
                    "forms the attention weights and takes query, key and "
                    "causal masks only. Received: "
                    + ("an attention_mask of shape "
                       f"{tuple(attention_mask.shape)}" if attention_mask is not None
                       else "a call that needs the weights (returned, captured "
                            "or dropped out)")
                )
            )
        mesh = ring_attention.check_sequence_mesh(
            self._error, "sequence_parallel", axis, query.shape, key.shape)
        key = multi_head.repeat_key_value_heads(key, self.num_heads)
        value = multi_head.repeat_key_value_heads(value, self.num_heads)
        distribution = keras.distribution.distribution()
        batch_axis = distribution.batch_dim_name
        if batch_axis == axis or batch_axis not in mesh.axis_names:
            batch_axis = None
        return ring_attention.ring_attention(
            query, key, value, mesh=mesh.backend_mesh, sequence_axis=axis,
            batch_axis=batch_axis, scale=self._scale, query_mask=query_mask,
            key_mask=key_mask, use_causal_mask=use_causal_mask,
        )

    def _mask_for(self, query_mask, key_mask, attention_mask, use_causal_mask,
                  query_length, key_length, row_offset=0):
        """The merged boolean mask `(B|1, 1|H, Tq, Tv)`, or None."""
        if attention_mask is not None and len(attention_mask.shape) == 3:
            attention_mask = ops.expand_dims(attention_mask, 1)
        parts = []
        if query_mask is not None:
            parts.append(query_mask[:, None, :, None])
        if key_mask is not None:
            parts.append(key_mask[:, None, None, :])
        if attention_mask is not None:
            parts.append(attention_mask)
        rows = row_offset + ops.arange(query_length)[:, None]
        cols = ops.arange(key_length)[None, :]
        if use_causal_mask:
            parts.append((rows >= cols)[None, None])
        if self._sliding_window is not None:
            parts.append((ops.abs(rows - cols) < self._sliding_window)[None, None])
        return masking.merge_masks(*parts)

    def _dense_attention(self, query, key, value, query_mask, key_mask,
                         attention_mask, use_causal_mask, training):
        mask = self._mask_for(
            query_mask, key_mask, attention_mask, use_causal_mask,
            ops.shape(query)[1], ops.shape(key)[1],
        )
        # Logits in float32 under half precision (masking.score_dtype).
        wide = masking.score_dtype(query.dtype)
        query = ops.cast(query, wide) * ops.cast(self._scale, wide)
        logits = multi_head.multi_head_logits(query, ops.cast(key, wide))
        weights = ops.cast(_softmax(logits, mask), value.dtype)  # (B, H, Tq, Tv)
        dropped = self._dropout_layer(weights, training=training)
        return multi_head.multi_head_weighted_sum(dropped, value), weights

    def _selected_weights(self, query, key, query_mask, key_mask, attention_mask,
                          use_causal_mask, selection):
        """Exact weights of the selected heads and query rows only.

        Each selected row's softmax is over all keys, so only
        `(B, heads, rows, Tv)` is ever formed.
        """
        start = 0
        if selection.query_range is not None:
            start, stop = selection.query_range
            query = query[:, start:stop]
            query_mask = None if query_mask is None else query_mask[:, start:stop]
            if attention_mask is not None:
                attention_mask = attention_mask[..., start:stop, :]
        groups = self.num_heads // self.num_key_value_heads
        if selection.heads is not None:
            query = ops.take(query, selection.heads, axis=2)
            key = ops.take(key, [h // groups for h in selection.heads], axis=2)
            if attention_mask is not None and len(attention_mask.shape) == 4:
                if attention_mask.shape[1] != 1:
                    attention_mask = ops.take(attention_mask, selection.heads, axis=1)
        else:
            key = multi_head.repeat_key_value_heads(key, self.num_heads)
        mask = self._mask_for(
            query_mask, key_mask, attention_mask, use_causal_mask,
            ops.shape(query)[1], ops.shape(key)[1], row_offset=start,
        )
        query = ops.cast(query, "float32") * self._scale
        logits = ops.einsum("bqhd,bkhd->bhqk", query, ops.cast(key, "float32"))
        return ops.cast(masking.masked_softmax(logits, mask), self.compute_dtype)

    def _fused_attention(self, query, key, value, query_mask, key_mask,
                         attention_mask, use_causal_mask, flash_attention):
        if flash_attention is False:
            # The composite kernel forms logits in the input dtype: in float32
            # under half precision, as the dense path (the fused GPU kernels
            # accumulate in float32 themselves).
            dtype = query.dtype
            wide = masking.score_dtype(dtype)
            if wide != str(getattr(dtype, "name", dtype)):
                output = self._fused_attention(
                    *(ops.cast(x, wide) for x in (query, key, value)),
                    query_mask, key_mask, attention_mask, use_causal_mask,
                    flash_attention=False,
                )
                return ops.cast(output, dtype)
        if keras.backend.backend() != "jax":  # only JAX takes grouped heads
            key = multi_head.repeat_key_value_heads(key, self.num_heads)
            value = multi_head.repeat_key_value_heads(value, self.num_heads)
        mask = self._mask_for(
            query_mask, key_mask, attention_mask, False,
            ops.shape(query)[1], ops.shape(key)[1],
        )
        if mask is None:  # causal alone: the kernel's own causal mode
            return dot_product_attention(
                query, key, value, scale=self._scale, is_causal=use_causal_mask,
                flash_attention=flash_attention,
            )
        if use_causal_mask:
            mask = self._mask_for(
                query_mask, key_mask, attention_mask, True,
                ops.shape(query)[1], ops.shape(key)[1],
            )
        heads = 1 if mask.shape[1] == 1 else self.num_heads
        mask = ops.broadcast_to(
            mask, (ops.shape(query)[0], heads, ops.shape(query)[1], ops.shape(key)[1])
        )
        output = dot_product_attention(
            query, key, value, mask=mask, scale=self._scale,
            flash_attention=flash_attention,
        )
        # The fused kernels spread a row with no allowed key uniformly: zero it.
        attended = ops.transpose(ops.any(mask, axis=-1), (0, 2, 1))  # (B, Tq, H|1)
        return output * ops.cast(attended[..., None], output.dtype)

    # ---------------------------------------------------------------- caching
    def precompute_key_value(self, value, key=None):
        """Projects cross-attention keys/values once for decoding.

        Args:
            value: `(B, Tv, dv)`, e.g. the encoder outputs.
            key: `(B, Tv, dk)`; defaults to `value`.

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
        self._check_cacheable()
        return ops.stack(
            masking.confine_nonfinite(self._key_dense(key), self._value_dense(value)),
            axis=1,
        )

    def _check_cacheable(self):
        if self.value_dim != self.key_dim:
            raise ValueError(
                self._error(
                    "a key/value cache needs `value_dim == key_dim`. Received: "
                    f"key_dim={self.key_dim}, value_dim={self.value_dim}"
                )
            )

    def _check_cache(self, query, value, key, cache, cache_update_index):
        self._check_cacheable()
        if not hasattr(cache, "shape"):
            raise TypeError(
                self._error(f"`cache` must be a tensor. Received: cache={cache!r}")
            )
        shape = tuple(cache.shape)
        expected = (
            query.shape[0],
            2,
            None,
            self.num_key_value_heads,
            self.key_dim,
        )
        if len(shape) != 5 or not all(
            got is None or want is None or got == want
            for got, want in zip(shape, expected)
        ):
            raise ValueError(
                self._error(
                    "`cache` must have shape (batch, 2, max_length, "
                    f"num_key_value_heads, key_dim) = {expected} (None = any). "
                    f"Received: cache with shape {shape}"
                )
            )
        if cache_update_index is None:
            if value is not None or key is not None:
                raise ValueError(
                    self._error(
                        "a read-only `cache` (cache_update_index=None) holds the "
                        "keys and values; do not pass `value` or `key` too. "
                        f"Received: value={value is not None}, key={key is not None}"
                    )
                )
            return
        if value is not None or key is not None:
            raise ValueError(
                self._error(
                    "`cache_update_index` is for self-attention decoding; "
                    "`value` and `key` must be None. Received a `value` or `key`"
                )
            )
        if isinstance(cache_update_index, (bool, float)):
            raise TypeError(
                self._error(
                    "`cache_update_index` must be an int or an int tensor. "
                    f"Received: cache_update_index={cache_update_index!r}"
                )
            )
        index = utils.concrete_int(cache_update_index)
        if index is not None:
            # A concrete index (Python int, eager tensor) is checked; only a
            # compiled loop's symbolic index is clamped by the update slice.
            max_length, steps = shape[2], query.shape[1]
            if index < 0 or (
                max_length is not None
                and steps is not None
                and index + steps > max_length
            ):
                raise ValueError(
                    self._error(
                        "`cache_update_index` plus the query length "
                        f"({steps}) must fit in the cache length ({max_length}). "
                        f"Received: cache_update_index={index}"
                    )
                )


    def _prepare_or_cache(self, query, value, key, query_mask, value_mask, key_mask,
                          attention_mask, use_causal_mask, cache, cache_update_index):
        if cache is None:
            if cache_update_index is not None:
                raise ValueError(
                    self._error(
                        "`cache_update_index` needs a `cache`. Received: "
                        f"cache_update_index={cache_update_index!r}, cache=None"
                    )
                )
            return super()._prepare_or_cache(
                query, value, key, query_mask, value_mask, key_mask,
                attention_mask, use_causal_mask, cache, cache_update_index,
            )
        self._check_tensor("query", query)
        self._check_rank("query", tuple(query.shape))
        self._check_cache(query, value, key, cache, cache_update_index)
        built = getattr(self, "_built_feature_dims", None)
        if built is not None and query.shape[-1] not in (None, built[0]):
            raise ValueError(
                self._error(
                    f"`query` has {query.shape[-1]} features but the layer was "
                    f"built for {built[0]}. Received: query with shape "
                    f"{tuple(query.shape)}"
                )
            )
        batch, steps, cache_length = query.shape[0], query.shape[1], cache.shape[2]
        for name, mask, expected in (
            ("query_mask", query_mask, (batch, steps)),
            ("value_mask", value_mask, (batch, cache_length)),
            ("key_mask", key_mask, (batch, cache_length)),
        ):
            self._check_mask(name, mask, expected)
        self._check_mask(
            "attention_mask", attention_mask, (batch, steps, cache_length),
            broadcast=True,
        )
        return query, None, None, query_mask, value_mask, self._layout(3)

    def _project_keys(self, query, value, key, cache, cache_update_index,
                      attention_mask, use_causal_mask):
        if cache is None:
            return super()._project_keys(
                query, value, key, cache, cache_update_index, attention_mask,
                use_causal_mask,
            )
        if cache_update_index is None:  # read-only: cross-attention keys
            return cache[:, 0], cache[:, 1], attention_mask, use_causal_mask, cache
        step = ops.stack(
            masking.confine_nonfinite(self._key_dense(query), self._value_dense(query)),
            axis=1,
        )  # (B, 2, Tq, Hkv, D)
        index = ops.cast(cache_update_index, "int32")
        cache = update_cache(cache, step, index)
        decoding = self._decoding_mask(
            index, ops.shape(query)[1], ops.shape(cache)[2], use_causal_mask
        )
        attention_mask = masking.merge_masks(attention_mask, decoding)
        return cache[:, 0], cache[:, 1], attention_mask, False, cache

    @staticmethod
    def _decoding_mask(index, steps, cache_length, use_causal_mask):
        """`(1, Tq, T_max)`: which cache positions each new step may see."""
        positions = ops.arange(cache_length, dtype="int32")
        rows = index + ops.arange(steps, dtype="int32")  # absolute positions
        if use_causal_mask:
            allowed = ops.expand_dims(positions, 0) <= ops.expand_dims(rows, 1)
        else:
            allowed = ops.expand_dims(positions, 0) < index + steps
            allowed = ops.broadcast_to(allowed, (steps, cache_length))
        return ops.expand_dims(allowed, 0)


    # ------------------------------------------------------------------- call
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
    ):
        selection = self._selection(
            query, return_attention_scores, attention_scores_heads,
            attention_scores_query_range,
        )
        return self._attention_call(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            return_attention_scores, training, use_causal_mask, mask,
            cache=cache, cache_update_index=cache_update_index,
            scores_selection=selection,
        )

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
        attention_scores_heads=None,
        attention_scores_query_range=None,
        cache=None,
        cache_update_index=None,
    ):
        selection = self._selection(
            query, return_attention_scores, attention_scores_heads,
            attention_scores_query_range,
        )
        return self._output_spec(
            query, value, key, query_mask, value_mask, key_mask, attention_mask,
            return_attention_scores, use_causal_mask, cache=cache,
            cache_update_index=cache_update_index, scores_selection=selection,
        )

    def _selection(self, query, return_attention_scores, heads, query_range):
        if heads is None and query_range is None:
            return None
        if not return_attention_scores:
            raise ValueError(
                self._error(
                    "`attention_scores_heads` / `attention_scores_query_range` "
                    "select returned weights: pass return_attention_scores=True. "
                    f"Received: attention_scores_heads={heads!r}, "
                    f"attention_scores_query_range={query_range!r}"
                )
            )
        if hasattr(query, "shape") and len(query.shape) != 3:
            raise ValueError(
                self._error(
                    "selected attention scores need rank-3 inputs. Received: "
                    f"query with shape {tuple(query.shape)}"
                )
            )
        selection = _ScoresSelection(self, heads, query_range)
        if hasattr(query, "shape"):
            selection.check_length(self, query.shape[1])
        return selection

    # ------------------------------------------------------------ conversion
    @classmethod
    def from_keras(cls, layer, **kwargs):
        """Builds ours from a built `keras.layers.MultiHeadAttention` or
        `keras.layers.GroupQueryAttention`, with the same weights.

        Outputs match to float rounding without retraining. `kwargs` override
        constructor arguments (for example `memory_efficient=False`).
        """
        grouped = isinstance(layer, keras.layers.GroupQueryAttention)
        if not (grouped or isinstance(layer, keras.layers.MultiHeadAttention)):
            raise TypeError(
                "MultiHeadAttention.from_keras expects a "
                "keras.layers.MultiHeadAttention or "
                "keras.layers.GroupQueryAttention. Received: "
                f"{type(layer).__name__}"
            )
        if not layer.built:
            raise ValueError(
                "MultiHeadAttention.from_keras needs a built layer (call it "
                f"once). Received: unbuilt layer '{layer.name}'"
            )
        config = layer.get_config()
        if grouped:
            config["num_heads"] = config.pop("num_query_heads")
            config["key_dim"] = config.pop("head_dim")
            config["value_dim"] = config["key_dim"]
            config.pop("flash_attention", None)
        config.update(kwargs)
        new = cls.from_config(config)
        features = [
            tuple(dense.kernel.shape)[0]
            for dense in (layer._query_dense, layer._value_dense, layer._key_dense)
        ]
        new.build(*[(None, None, f) for f in features])
        new.set_weights(layer.get_weights())
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
                "block_size": self.block_size,
                "sequence_parallel": self.sequence_parallel,
            }
        )
        return config
