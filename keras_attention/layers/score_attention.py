"""The single-head family: a layer writes only its score function."""

import keras
from keras import ops

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.ops import masking
from keras_attention.ops import scores as score_ops


@keras_attention_export("layers")
class ScoreAttention(BaseAttention):
    """Single-head attention from a score function (the seq2seq layers).

    The four stages of the classic decoder attention: scores
    `score(query, key)` `(B, Tq, Tv)`, a masked softmax over the keys, the
    weighted sum of the values, and the caller's prediction from it. A
    subclass supplies only the score: `build_score` creates its weights from
    the query and key shapes, `score` returns the logits.

    Args:
        dropout: fraction of attention weights dropped during training.
        seed: seed for the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, Tq, dq)`, or a list `[query, value]` /
            `[query, value, key]` as `keras.layers.Attention` takes.
        value: `(B, Tv, dv)`; `None` means self-attention (`value = query`),
            which is what `model.add(layer)` uses.
        key: `(B, Tv, dk)`; `None` means `key = value`.
        query_mask: `(B, Tq)`, `True` for real query positions.
        value_mask: `(B, Tv)`, `True` for real key/value positions.
        key_mask: `(B, Tv)`, combined with `value_mask`.
        attention_mask: broadcastable to `(B, Tq, Tv)` (e.g. `(Tq, Tv)` or
            `(B, 1, Tv)`), `True` where query `i` may attend to key `j`.
        use_causal_mask: if `True`, query `i` sees only keys `j <= i`.
        return_attention_scores: if `True`, also return the attention
            weights (after softmax, before dropout).
        training: whether dropout is active.
        mask: the Keras mask of `query` (or, for a list call, the list of
            masks), filled in automatically by Keras.

    Masks may be boolean or 0/1 numbers. Keras masks propagate: an upstream
    `Embedding(mask_zero=True)` fills in `query_mask`/`value_mask`, and the
    output carries the query mask.

    Returns:
        `(B, Tq, dv)`, and with `return_attention_scores=True` also the
        weights `(B, Tq, Tv)`. A query row whose keys are all masked gets zero
        weights and a zero output, never NaN.
    """

    # ------------------------------------------------------------------ hooks
    def build_score(self, query_shape, key_shape):
        """Creates the score function's weights. Override in subclasses."""

    def score(self, query, key):
        """Returns logits `(B, Tq, Tk)`. Override in subclasses."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `score(query, key)`."
        )

    # ------------------------------------------------------------- validation
    def _check_input_shapes(self, query_shape, value_shape, key_shape):
        self._check_rank("query", query_shape)
        self._check_rank("value", value_shape)
        self._check_rank("key", key_shape)
        if value_shape is not None and key_shape is not None:
            tv, tk = value_shape[1], key_shape[1]
            if tv is not None and tk is not None and tv != tk:
                raise ValueError(
                    self._error(
                        "`key` and `value` must have the same length. Received: "
                        f"key shape {tuple(key_shape)}, value shape "
                        f"{tuple(value_shape)}"
                    )
                )
        built = getattr(self, "_built_feature_dims", None)
        if built is None:
            return
        for name, shape, dim in zip(
            ("query", "value", "key"), (query_shape, value_shape, key_shape), built
        ):
            if shape is not None and shape[-1] is not None and shape[-1] != dim:
                raise ValueError(
                    self._error(
                        f"`{name}` has {shape[-1]} features but the layer was "
                        f"built for {dim}. Received: {name} with shape "
                        f"{tuple(shape)}"
                    )
                )

    @staticmethod
    def _unpack_list_call(query, value, key, mask):
        """`layer([query, value(, key)])`, the `keras.layers.Attention` call."""
        masks = [None, None]
        if isinstance(query, (list, tuple)):
            if value is not None or key is not None or not 1 <= len(query) <= 3:
                raise ValueError(
                    "a list input must be [query], [query, value] or "
                    "[query, value, key], with no separate `value`/`key`. "
                    f"Received: a list of {len(query)} tensors"
                    + (", and `value`/`key`" if value is not None or key is not None else "")
                )
            query, value, key = (list(query) + [None, None])[:3]
            if isinstance(mask, (list, tuple)):
                masks = (list(mask) + [None, None])[:2]
                mask = None
        return query, value, key, mask, masks

    def _prepare(self, query, value, key, query_mask, value_mask, key_mask,
                 attention_mask, mask):
        try:
            query, value, key, mask, list_masks = self._unpack_list_call(
                query, value, key, mask
            )
        except ValueError as error:
            raise ValueError(self._error(str(error))) from None
        for name, x in (("query", query), ("value", value), ("key", key)):
            self._check_tensor(name, x)
        if query is None:
            raise TypeError(self._error("`query` is required. Received: query=None"))
        if query_mask is None:
            query_mask = mask if mask is not None else list_masks[0]
        if value_mask is None:
            value_mask = list_masks[1]
        if value is None and value_mask is None:
            value_mask = query_mask  # self-attention: the keys are the queries
        query, value, key = self._resolve_inputs(query, value, key)
        self._check_input_shapes(
            tuple(query.shape), tuple(value.shape), tuple(key.shape)
        )
        batch, tq, tv = query.shape[0], query.shape[1], value.shape[1]
        self._check_mask("query_mask", query_mask, (batch, tq))
        self._check_mask("value_mask", value_mask, (batch, tv))
        self._check_mask("key_mask", key_mask, (batch, tv))
        self._check_mask(
            "attention_mask", attention_mask, (batch, tq, tv), broadcast=True
        )
        return query, value, key, query_mask, value_mask

    # --------------------------------------------------------------- keras API
    def build(self, query_shape, value_shape=None, key_shape=None):
        if isinstance(query_shape, (list, tuple)) and query_shape and isinstance(
            query_shape[0], (list, tuple)
        ):  # list call: build([query_shape, value_shape(, key_shape)])
            query_shape, value_shape, key_shape = (list(query_shape) + [None] * 2)[:3]
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_input_shapes(query_shape, value_shape, key_shape)
        self.build_score(tuple(query_shape), tuple(key_shape))
        self._built_feature_dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self.built = True

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
    ):
        query, value, key, query_mask, value_mask = self._prepare(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, mask
        )
        combined = masking.attention_mask_from(
            query_mask=query_mask,
            value_mask=masking.merge_masks(value_mask, key_mask),
            attention_mask=masking.to_bool_mask(attention_mask),
            use_causal_mask=use_causal_mask,
            query_length=ops.shape(query)[1],
            key_length=ops.shape(key)[1],
        )
        # Scores and the weighted sum run in the compute dtype: integer
        # inputs are cast, as Keras' own layers do.
        query, value, key = (
            ops.cast(x, self.compute_dtype) for x in (query, value, key)
        )
        # Masked positions are zeroed before any matmul, so that whatever
        # they hold (NaN, Inf) contributes nothing (0 * NaN would be NaN).
        query = masking.zero_masked(query, query_mask)
        keys_valid = masking.merge_masks(value_mask, key_mask)
        value = masking.zero_masked(value, keys_valid)
        key = masking.zero_masked(key, keys_valid)
        # NaN/Inf at a key hidden only by `attention_mask` or the causal mask
        # reaches only the queries that see it.
        key, value = masking.confine_nonfinite(key, value)
        # `score` sees the compute dtype (a subclass mixes in its weights);
        # the built-in dot scores form their logits in float32 themselves.
        weights = ops.cast(
            masking.masked_softmax(self.score(query, key), combined),
            self.compute_dtype,
        )
        output = score_ops.weighted_sum(
            self._dropout_layer(weights, training=training), value
        )
        # A masked query row is zero whatever the values hold.
        output = masking.zero_masked(output, query_mask)
        self._record_attention(weights)
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        return tuple(query_shape[:-1]) + (value_shape[-1],)

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
    ):
        query, value, key, _, _ = self._prepare(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, mask
        )
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return output
        scores = keras.KerasTensor(
            (query.shape[0], query.shape[1], value.shape[1]), dtype=self.compute_dtype
        )
        return output, scores
