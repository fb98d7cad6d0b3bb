import numbers

import keras
from keras import ops

from keras_attention.layers.base_attention import BaseAttention
from keras_attention.layers.base_attention import inverse_sqrt
from keras_attention.layers.base_attention import validate_positive_int
from keras_attention.ops import masking
from keras_attention.ops.cache import update_cache
from keras_attention.ops import multi_head
from keras_attention.ops.memory_efficient import memory_efficient_attention

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
    """Whether `keras.ops.dot_product_attention` has a fused GPU kernel here."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "gpu"
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
    logits = ops.cast(logits, "float32")
    if mask is None:
        return ops.cast(ops.softmax(logits, axis=-1), dtype)
    weights = ops.softmax(ops.where(mask, logits, -1e9), axis=-1)
    # A row with no allowed key would be uniform: zero it.
    return ops.cast(weights * ops.cast(mask, "float32"), dtype)


@keras.saving.register_keras_serializable(package="keras_attention")
class MultiHeadAttention(BaseAttention):
    """Multi-head attention (Vaswani et al., 2017, https://arxiv.org/abs/1706.03762).

    Projects the query, key and value into `num_heads` heads, attends with
    scaled dot products, and projects the concatenated heads back. Given the
    same weights it computes what `keras.layers.MultiHeadAttention` computes
    (see `from_keras`), and adds:

    - grouped-query attention (`num_key_value_heads < num_heads`, Ainslie et
      al., 2023): query head `h` uses key/value head `h // (num_heads //
      num_key_value_heads)`, as in `keras.layers.GroupedQueryAttention`;
    - exact attention in memory linear in the sequence length (blockwise,
      online softmax, recomputing backward pass; see
      `keras_attention.ops.memory_efficient`), switched on automatically for
      long keys when the weights are not needed;
    - incremental decoding with a key/value cache usable in a compiled loop;
    - the scores `(B, H, Tq, Tv)` with the right symbolic shape for
      cross-attention, and zero output for fully masked rows in any dtype.

    Args:
        num_heads: number of query heads `H`.
        key_dim: size `D` of each query/key head.
        value_dim: size `Dv` of each value head; defaults to `key_dim`.
        num_key_value_heads: number of key/value heads `Hkv`; must divide
            `num_heads`. Defaults to `num_heads` (ordinary multi-head).
        dropout: fraction of attention weights dropped during training.
        use_bias: whether the projections have biases.
        output_shape: output feature shape (int or tuple) besides batch and
            time; defaults to the query's last dimension.
        use_gate: multiply the attention output of each head by a sigmoid
            gate projected from the query (Qiu et al., 2025), as Keras does.
        seed: seed of the dropout.
        memory_efficient: `"auto"` (default), `True` or `False`. `"auto"` uses
            the memory-efficient kernel when the key length is at least
            `memory_efficient_threshold`, no weights are requested or captured,
            dropout is inactive and lengths are static. `True` uses it whenever
            weights are not needed and lengths are static (dropout during
            training falls back to the exact kernel, since the dropped weights
            would have to be stored; so do unknown lengths, which only occur
            in TF graph mode without XLA). `False`
            always computes the full weights.
        memory_efficient_threshold: key length from which `"auto"` switches;
            defaults to 8192: below it the exact kernel is faster on CPU and
            fits in memory (see benchmarks/RESULTS.md).
        block_size: query and key block length of the memory-efficient kernel.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, kernel_constraint, bias_constraint: for the
            projections, as in Keras.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, Tq, dq)`.
        value: `(B, Tv, dv)`; `None` means self-attention.
        key: `(B, Tv, dk)`; `None` means `key = value`.
        query_mask, value_mask, key_mask, attention_mask, use_causal_mask,
        return_attention_scores, training, mask: see `BaseAttention`.
        cache: `(B, 2, T_max, Hkv, D)` keys (`[:, 0]`) and values (`[:, 1]`).
            With `cache_update_index`, the keys/values of `query` (self-
            attention) are written at that index and the layer attends over
            the whole cache: query step `t`, at absolute position
            `cache_update_index + t`, sees cache positions up to its own
            with `use_causal_mask=True`, and positions before
            `cache_update_index + Tq` otherwise. With
            `cache_update_index=None`, the cache is read-only (cross-attention
            keys/values from `precompute_key_value`) and `value`/`key` must
            not be given.
        cache_update_index: int or scalar int tensor. A Python int is
            checked (`0 <= index <= T_max - Tq`). A tensor cannot be checked
            inside a compiled loop: an index beyond the cache is clamped to
            `T_max - Tq` by the dynamic update slice, as XLA does.

    Returns:
        `(B, Tq, *output_shape)`; with `return_attention_scores=True` also the
        weights `(B, H, Tq, Tv)`; with a cache also the (updated) cache, last.
        Query rows masked by `query_mask` (or the Keras mask) are zero.

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
        num_key_value_heads=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        use_gate=False,
        seed=None,
        memory_efficient="auto",
        memory_efficient_threshold=DEFAULT_MEMORY_EFFICIENT_THRESHOLD,
        block_size=DEFAULT_BLOCK_SIZE,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        **kwargs,
    ):
        name = "MultiHeadAttention"
        validate_positive_int(name, "num_heads", num_heads)
        validate_positive_int(name, "key_dim", key_dim)
        validate_positive_int(name, "value_dim", value_dim, allow_none=True)
        validate_positive_int(
            name, "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                f"{name}: `num_key_value_heads` must divide `num_heads` "
                f"({num_heads}). Received: num_key_value_heads="
                f"{num_key_value_heads!r}"
            )
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.num_key_value_heads = num_key_value_heads or num_heads
        self.use_bias = bool(use_bias)
        self.use_gate = bool(use_gate)
        self._output_shape = self._standardize_output_shape(output_shape)
        if memory_efficient not in (True, False, "auto"):
            raise ValueError(
                f"{name}: `memory_efficient` must be True, False or 'auto'. "
                f"Received: memory_efficient={memory_efficient!r}"
            )
        self.memory_efficient = memory_efficient
        self.memory_efficient_threshold = validate_positive_int(
            name, "memory_efficient_threshold", memory_efficient_threshold
        )
        self.block_size = validate_positive_int(name, "block_size", block_size)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self._scale = inverse_sqrt(self.key_dim)

    @staticmethod
    def _standardize_output_shape(output_shape):
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
                "MultiHeadAttention: `output_shape` must be a positive integer "
                "or a tuple of positive integers. Received: "
                f"output_shape={output_shape!r}"
            )
        return dims

    # ------------------------------------------------------------------ build
    def _dense(self, equation, output_shape, bias_axes, name, activation=None):
        # Fresh initializer objects so that no two kernels start identical.
        initializers = {
            key: init.__class__.from_config(init.get_config())
            for key, init in (
                ("kernel_initializer", self.kernel_initializer),
                ("bias_initializer", self.bias_initializer),
            )
        }
        return keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            activation=activation,
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
            name=name,
            **initializers,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_input_shapes(query_shape, value_shape, key_shape)
        heads, kv_heads = self.num_heads, self.num_key_value_heads
        self.query_dense = self._dense(
            "abc,cde->abde", (None, heads, self.key_dim), "de", "query_dense"
        )
        self.query_dense.build(query_shape)
        self.key_dense = self._dense(
            "abc,cde->abde", (None, kv_heads, self.key_dim), "de", "key_dense"
        )
        self.key_dense.build(key_shape)
        self.value_dense = self._dense(
            "abc,cde->abde", (None, kv_heads, self.value_dim), "de", "value_dense"
        )
        self.value_dense.build(value_shape)
        if self.use_gate:
            self.gate_dense = self._dense(
                "abc,cde->abde",
                (None, heads, self.value_dim),
                "de",
                "gate_dense",
                activation="sigmoid",
            )
            self.gate_dense.build(query_shape)
        out_dims = self._output_shape or (query_shape[-1],)
        letters = "efghijklmnop"[: len(out_dims)]
        self.output_dense = self._dense(
            f"abcd,cd{letters}->ab{letters}",
            (None,) + tuple(out_dims),
            letters,
            "output_dense",
        )
        self.output_dense.build(
            (query_shape[0], query_shape[1], heads, self.value_dim)
        )
        self._built_feature_dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self.built = True

    # ------------------------------------------------------------ kernel hook
    def _weights_optional(self, training, return_attention_scores):
        """Whether a kernel that never forms the weights may run."""
        if return_attention_scores or self._capturing_attention:
            return False
        if self.memory_efficient is False:
            return False
        return not (self.dropout > 0 and training)

    def _use_fused(self, training, return_attention_scores):
        return self._weights_optional(
            training, return_attention_scores
        ) and _fused_kernel_available()

    def _use_memory_efficient(self, query, key, training, return_attention_scores):
        if not self._weights_optional(training, return_attention_scores):
            return False
        if query.shape[1] is None or key.shape[1] is None:
            return False
        if self.memory_efficient == "auto":
            return key.shape[1] >= self.memory_efficient_threshold and query.shape[1] > 1
        return True

    def _compute_attention(
        self,
        query,
        key,
        value,
        *,
        query_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
        return_attention_scores=False,
    ):
        """The attention kernel over projected heads; override for variants.

        Args:
            query: `(B, Tq, H, D)` projected queries (not yet scaled).
            key: `(B, Tv, Hkv, D)` projected keys. Grouped heads are NOT
                repeated by the caller: a kernel that needs one key/value head
                per query head calls
                `keras_attention.ops.multi_head.repeat_key_value_heads`.
            value: `(B, Tv, Hkv, Dv)` projected values.
            query_mask: `(B, Tq)` boolean or None.
            key_mask: `(B, Tv)` boolean or None (value and key masks merged).
            attention_mask: `(B, Tq, Tv)` boolean or None (already includes
                the decoding cache's positions when a cache is used).
            use_causal_mask: query `i` sees keys `j <= i`.
            training: whether dropout is active.
            return_attention_scores: whether the caller needs the weights;
                when False a kernel may return `None` for them.

        Returns:
            `(output (B, Tq, H, Dv), weights (B, H, Tq, Tv) or None)`. The
            caller applies the gate, the output projection, zeroes masked
            query rows and records the weights for `capture_attention`.
        """
        if self._use_memory_efficient(query, key, training, return_attention_scores):
            output = memory_efficient_attention(
                query,
                key,
                value,
                scale=self._scale,
                query_mask=query_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                block_size=self.block_size,
            )
            return output, None
        mask = masking.attention_mask_from(
            query_mask=query_mask,
            value_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_length=ops.shape(query)[1],
            key_length=ops.shape(key)[1],
        )
        query = query * ops.cast(self._scale, query.dtype)
        logits = multi_head.multi_head_logits(query, key)  # (B, H, Tq, Tv)
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B, 1, Tq, Tv)
        weights = _softmax(logits, mask)
        dropped = self._dropout_layer(weights, training=training)
        return multi_head.multi_head_weighted_sum(dropped, value), weights

    def _fused_attention(
        self, query, key, value, query_mask, key_mask, attention_mask, use_causal_mask
    ):
        mask = masking.attention_mask_from(
            query_mask=query_mask,
            value_mask=key_mask,
            attention_mask=attention_mask,
            query_length=ops.shape(query)[1],
            key_length=ops.shape(key)[1],
        )
        if keras.backend.backend() != "jax":  # only JAX takes grouped heads
            key = multi_head.repeat_key_value_heads(key, self.num_heads)
            value = multi_head.repeat_key_value_heads(value, self.num_heads)
        if mask is not None:
            mask = ops.broadcast_to(
                mask, (ops.shape(query)[0], ops.shape(query)[1], ops.shape(key)[1])
            )
        output = ops.dot_product_attention(
            query,
            key,
            value,
            mask=None if mask is None else ops.expand_dims(mask, 1),
            scale=self._scale,
            is_causal=use_causal_mask,
        )
        if mask is not None:
            # The fused kernels spread a row with no allowed key uniformly.
            if use_causal_mask:
                mask = ops.logical_and(
                    mask,
                    masking.causal_mask(ops.shape(query)[1], ops.shape(key)[1]),
                )
            attended = ops.any(mask, axis=-1)  # (B, Tq)
            output = output * ops.cast(attended[:, :, None, None], output.dtype)
        return output

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
        return ops.stack([self.key_dense(key), self.value_dense(value)], axis=1)

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
        if isinstance(cache_update_index, numbers.Integral):
            max_length, steps = shape[2], query.shape[1]
            if cache_update_index < 0 or (
                max_length is not None
                and steps is not None
                and cache_update_index + steps > max_length
            ):
                raise ValueError(
                    self._error(
                        "`cache_update_index` plus the query length "
                        f"({steps}) must fit in the cache length ({max_length}). "
                        f"Received: cache_update_index={cache_update_index}"
                    )
                )

    def _check_call_options(
        self, query, value, attention_mask, use_causal_mask, cache, cache_update_index
    ):
        """Hook: subclasses raise here for call options their kernel cannot honour.

        Runs first in both `call` and `compute_output_spec`, so the error comes
        eagerly and when a functional model is built.
        """

    # ------------------------------------------------------------------- call
    def call(
        self,
        query,
        value=None,
        key=None,
        *,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        mask=None,
        cache=None,
        cache_update_index=None,
    ):
        self._check_call_options(
            query, value, attention_mask, use_causal_mask, cache, cache_update_index
        )
        if query_mask is None:
            query_mask = mask
        if cache is not None:
            self._check_cache(query, value, key, cache, cache_update_index)
        elif cache_update_index is not None:
            raise ValueError(
                self._error(
                    "`cache_update_index` needs a `cache`. Received: "
                    f"cache_update_index={cache_update_index!r}, cache=None"
                )
            )
        self_attention = value is None
        if self_attention and value_mask is None and cache is None:
            value_mask = query_mask
        if cache is not None:
            # Keys/values come from the cache: validate masks against it.
            self._check_input_shapes(tuple(query.shape), None, None)
            cache_length = cache.shape[2]
            batch, steps = query.shape[0], query.shape[1]
            for name, m, expected in (
                ("query_mask", query_mask, (batch, steps)),
                ("value_mask", value_mask, (batch, cache_length)),
                ("key_mask", key_mask, (batch, cache_length)),
                ("attention_mask", attention_mask, (batch, steps, cache_length)),
            ):
                self._check_mask(name, m, expected)
        else:
            query, value, key = self._validate_call(
                query, value, key, query_mask, value_mask, key_mask, attention_mask
            )

        # Copies without the Keras mask: the projections do not take masks,
        # which are handled here (Keras clears the caller's tensors instead).
        query = ops.copy(query)
        value = None if value is None else ops.copy(value)
        key = None if key is None else ops.copy(key)
        projected_query = self.query_dense(query)  # (B, Tq, H, D)
        gate = self.gate_dense(query) if self.use_gate else None
        if cache is None:
            projected_key = self.key_dense(key)  # (B, Tv, Hkv, D)
            projected_value = self.value_dense(value)  # (B, Tv, Hkv, Dv)
        elif cache_update_index is None:
            projected_key, projected_value = cache[:, 0], cache[:, 1]
        else:
            step = ops.stack(
                [self.key_dense(query), self.value_dense(query)], axis=1
            )  # (B, 2, Tq, Hkv, D)
            index = ops.cast(cache_update_index, "int32")
            cache = update_cache(cache, step, index)
            projected_key, projected_value = cache[:, 0], cache[:, 1]
            attention_mask = masking.merge_masks(
                attention_mask,
                self._decoding_mask(
                    index, ops.shape(query)[1], ops.shape(cache)[2], use_causal_mask
                ),
            )
            use_causal_mask = False

        output, weights = self._compute_attention(
            projected_query,
            projected_key,
            projected_value,
            query_mask=masking.to_bool_mask(query_mask),
            key_mask=masking.merge_masks(value_mask, key_mask),
            attention_mask=masking.to_bool_mask(attention_mask),
            use_causal_mask=use_causal_mask,
            training=training,
            return_attention_scores=return_attention_scores,
        )
        if return_attention_scores and weights is None:
            raise ValueError(
                self._error(
                    "this attention kernel does not compute attention weights; "
                    "call with return_attention_scores=False"
                )
            )
        if weights is not None:
            self._record_attention(weights)
        if gate is not None:
            output = output * gate
        output = self.output_dense(output)
        if query_mask is not None:
            keep = ops.cast(masking.to_bool_mask(query_mask), output.dtype)
            for _ in range(len(output.shape) - 2):
                keep = ops.expand_dims(keep, -1)
            output = output * keep
        results = (output,)
        if return_attention_scores:
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

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

    # ------------------------------------------------------------ shapes etc.
    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        dims = self._output_shape or (query_shape[-1],)
        return tuple(query_shape[:-1]) + tuple(dims)

    def _scores_shape(self, query_shape, value_shape):
        return (query_shape[0], self.num_heads, query_shape[1], value_shape[1])

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        *,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        mask=None,
        cache=None,
        cache_update_index=None,
    ):
        self._check_call_options(
            query, value, attention_mask, use_causal_mask, cache, cache_update_index
        )
        if cache is not None:
            self._check_cache(query, value, key, cache, cache_update_index)
            keys_shape = (cache.shape[0], cache.shape[2])
        else:
            query, value, key = self._validate_call(
                query, value, key, query_mask, value_mask, key_mask, attention_mask
            )
            keys_shape = value.shape
        results = (
            keras.KerasTensor(
                self.compute_output_shape(query.shape), dtype=self.compute_dtype
            ),
        )
        if return_attention_scores:
            results += (
                keras.KerasTensor(
                    self._scores_shape(query.shape, keys_shape),
                    dtype=self.compute_dtype,
                ),
            )
        if cache is not None:
            results += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return results[0] if len(results) == 1 else results

    def compute_mask(self, inputs, previous_mask=None):
        return previous_mask

    # ------------------------------------------------------------ conversion
    @classmethod
    def from_keras(cls, layer, **kwargs):
        """Builds a `MultiHeadAttention` from a built `keras.layers.MultiHeadAttention`.

        Copies the configuration and the projection weights, so outputs match
        (to float rounding) without retraining. Keras layers with
        `attention_axes` other than the time axis or with `sliding_window` are
        not supported. `kwargs` override constructor arguments (for example
        `memory_efficient=False`).
        """
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            raise TypeError(
                "MultiHeadAttention.from_keras expects a "
                "keras.layers.MultiHeadAttention. Received: "
                f"{type(layer).__name__}"
            )
        if not layer.built:
            raise ValueError(
                "MultiHeadAttention.from_keras needs a built layer (call it "
                f"once). Received: unbuilt layer '{layer.name}'"
            )
        keras_config = layer.get_config()
        if keras_config.get("sliding_window") is not None:
            raise ValueError(
                "MultiHeadAttention.from_keras does not support sliding_window. "
                f"Received: sliding_window={keras_config['sliding_window']!r}"
            )
        query_kernel = layer.query_dense.kernel
        if len(query_kernel.shape) != 3:
            raise ValueError(
                "MultiHeadAttention.from_keras supports rank-3 inputs "
                "(batch, time, features) only. Received: query kernel with "
                f"shape {tuple(query_kernel.shape)}"
            )
        config = {
            key: keras_config[key]
            for key in (
                "num_heads",
                "key_dim",
                "value_dim",
                "dropout",
                "use_bias",
                "output_shape",
                "seed",
                "kernel_initializer",
                "bias_initializer",
                "kernel_regularizer",
                "bias_regularizer",
                "kernel_constraint",
                "bias_constraint",
                "name",
                "trainable",
                "dtype",
            )
            if key in keras_config
        }
        config["use_gate"] = keras_config.get("use_gate", False)
        config.update(kwargs)
        new = cls(**config)
        query_shape = (None, None, query_kernel.shape[0])
        key_shape = (None, None, layer.key_dense.kernel.shape[0])
        value_shape = (None, None, layer.value_dense.kernel.shape[0])
        new.build(query_shape, value_shape, key_shape)
        pairs = [
            (new.query_dense, layer.query_dense),
            (new.key_dense, layer.key_dense),
            (new.value_dense, layer.value_dense),
            (new.output_dense, layer.output_dense),
        ]
        if new.use_gate:
            pairs.append((new.gate_dense, layer._gate_dense))
        for ours, theirs in pairs:
            ours.set_weights(theirs.get_weights())
        return new

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "use_bias": self.use_bias,
                "output_shape": self._output_shape,
                "use_gate": self.use_gate,
                "memory_efficient": self.memory_efficient,
                "memory_efficient_threshold": self.memory_efficient_threshold,
                "block_size": self.block_size,
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
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(
                    self.bias_constraint
                ),
            }
        )
        return config
