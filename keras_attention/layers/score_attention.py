"""The single-head family: a layer writes only its score function."""

import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.layers.machinery import utils
from keras_attention.ops import attention_mask as attention_masks
from keras_attention.ops import masking
from keras_attention.ops import score_functions as score_ops


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

    Call arguments (Keras' `keras.layers.Attention` call, plus ours):
        query: `(B, Tq, dq)`, or a list `[query, value]` /
            `[query, value, key]` as `keras.layers.Attention` takes
            (`[query]` alone is self-attention). Inputs may have any rank
            >= 3: every axis before the last two is a batch axis
            (`(B, H, W, C)` attends over `W` for each `(B, H)`), and masks
            and weights carry the same leading axes.
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
            weights applied to the values (after the masked softmax, and
            after dropout when training, as `keras.layers.Attention`).
        training: whether dropout is active.
        mask: the Keras mask of `query`, filled in automatically by Keras;
            with a list input, Keras' list `[query_mask, value_mask]`
            (either may be `None`; a third entry is a key mask).

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
        raise NotImplementedError(f"{type(self).__name__} must implement `score(query, key)`.")

    def _calculate_scores(self, query, key):
        """Keras' protected name for `score` (`keras.layers.Attention`)."""
        return self.score(query, key)

    def _calculate_score_mask(self, scores, v_mask, use_causal_mask):
        """Keras' helper: the value mask `(B, 1, Tv)` ANDed with the causal
        mask `(1, Tq, Tv)` when `use_causal_mask`, else `v_mask` as given."""
        if not use_causal_mask:
            return v_mask
        shape = ops.shape(scores)
        causal = masking.causal_mask(shape[-2], shape[-1])
        if v_mask is None:
            return causal
        return ops.logical_and(ops.expand_dims(masking.to_bool_mask(v_mask), -2), causal)

    # ------------------------------------------------------------- validation
    def _check_input_shapes(self, query_shape, value_shape, key_shape):
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if shape is not None and len(shape) < 3:
                raise ValueError(
                    self._error(
                        f"`{name}` must have rank >= 3 (batch..., time, "
                        f"features). Received: {name} with shape {tuple(shape)}"
                    )
                )
        for name, shape in (("value", value_shape), ("key", key_shape)):
            if shape is None or query_shape is None:
                continue
            if len(shape) != len(query_shape) or any(
                q is not None and v is not None and q != v
                for q, v in zip(query_shape[:-2], shape[:-2], strict=True)
            ):
                raise ValueError(
                    self._error(
                        f"`query` and `{name}` must have the same leading "
                        "(batch) dimensions: all but the last two. Received: "
                        f"query shape {tuple(query_shape)}, {name} shape "
                        f"{tuple(shape)}"
                    )
                )
        if value_shape is not None and key_shape is not None:
            tv, tk = value_shape[-2], key_shape[-2]
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
            ("query", "value", "key"), (query_shape, value_shape, key_shape), built, strict=True
        ):
            if shape is not None and dim is not None and shape[-1] is not None and shape[-1] != dim:
                raise ValueError(
                    self._error(
                        f"`{name}` has {shape[-1]} features but the layer was "
                        f"built for {dim}. Received: {name} with shape "
                        f"{tuple(shape)}"
                    )
                )

    def _unpack_list_call(self, query, value, key, mask):
        """`layer([query, value(, key)], mask=[query_mask, value_mask])`, the
        `keras.layers.Attention` call; `[query]` alone is self-attention.

        Returns `(query, value, key, mask, [query_mask, value_mask, key_mask])`.
        """
        masks = [None, None, None]
        if not isinstance(query, (list, tuple)):
            return query, value, key, mask, masks
        if isinstance(value, (list, tuple)) and key is None:
            # Keras' `Attention.call(inputs, mask=None)`: `layer([q, v], [qm, vm])`
            # puts the mask list where our `value` sits.
            if mask is not None:
                raise ValueError(
                    self._error(
                        "the mask list was given twice: positionally, as in "
                        "`keras.layers.Attention`'s `layer(inputs, mask)`, and as "
                        "`mask=`. Received: both"
                    )
                )
            value, mask = None, value
        if value is not None or key is not None:
            raise ValueError(
                self._error(
                    "a list input [query, value(, key)] takes no separate "
                    "`value`/`key`; its masks go in `mask=[query_mask, value_mask]` "
                    "(or positionally as a list, `layer(inputs, mask)`). Received: "
                    f"a list of {len(query)} tensors and "
                    f"{'value' if value is not None else 'key'}="
                    f"{utils.describe(value if value is not None else key)}"
                )
            )
        if not 1 <= len(query) <= 3:
            raise ValueError(
                self._error(
                    "the layer accepts an inputs list of length 2 or 3, namely "
                    "[query, value] or [query, value, key] (or [query] for "
                    f"self-attention). Received length: {len(query)}"
                )
            )
        inputs = len(query)
        query, value, key = (list(query) + [None, None])[:3]
        if mask is not None:
            if not isinstance(mask, (list, tuple)):
                raise ValueError(
                    self._error(
                        "with a list input, the layer mask must be a list, "
                        "namely [query_mask, value_mask] (either may be None). "
                        f"Received: mask={utils.describe(mask)}"
                    )
                )
            if not 1 <= len(mask) <= 3 or (len(mask) == 1 and inputs > 1):
                raise ValueError(
                    self._error(
                        "the layer accepts a mask list of length 2 or 3, namely "
                        "[query_mask, value_mask(, key_mask)]. Received length: "
                        f"{len(mask)}"
                    )
                )
            masks = (list(mask) + [None, None])[:3]
        return query, value, key, None, masks

    def _prepare(self, query, value, key, query_mask, value_mask, key_mask, attention_mask, mask):
        keras_masks = [None, None, None]
        if isinstance(query, (list, tuple)) and isinstance(query_mask, (list, tuple)):
            # Keras fills `query_mask` with the Keras masks of a list input's
            # tensors: they apply where `mask` gives none.
            keras_masks = (list(query_mask) + [None, None])[:3]
            query_mask = None
        # A positional mask list (`layer([q, v], [qm, vm])`): what Keras
        # filled in as `value_mask` are the masks of those masks.
        if all(isinstance(x, (list, tuple)) for x in (query, value, value_mask)):
            value_mask = None
        query, value, key, mask, list_masks = self._unpack_list_call(query, value, key, mask)
        list_masks = [
            given if given is not None else filled
            for given, filled in zip(list_masks, keras_masks, strict=False)
        ]
        for name, x in (("query", query), ("value", value), ("key", key)):
            self._check_tensor(name, x)
        if query is None:
            raise TypeError(self._error("`query` is required. Received: query=None"))
        for name, given, listed in (
            ("query_mask", query_mask, list_masks[0]),
            ("value_mask", value_mask, list_masks[1]),
            ("key_mask", key_mask, list_masks[2]),
        ):
            if given is not None and listed is not None:
                raise ValueError(
                    self._error(
                        f"`{name}` was given twice: as `{name}=` and in the "
                        "`mask` list. Received: both"
                    )
                )
        query_mask = query_mask if query_mask is not None else list_masks[0]
        value_mask = value_mask if value_mask is not None else list_masks[1]
        key_mask = key_mask if key_mask is not None else list_masks[2]
        if query_mask is None:
            query_mask = mask
        if value is None and value_mask is None:
            value_mask = query_mask  # self-attention: the keys are the queries
        query, value, key = self._resolve_inputs(query, value, key)
        query_shape, value_shape = tuple(query.shape), tuple(value.shape)
        self._check_input_shapes(query_shape, value_shape, tuple(key.shape))
        self._check_mask("query_mask", query_mask, query_shape[:-1])
        self._check_mask("value_mask", value_mask, value_shape[:-1])
        self._check_mask("key_mask", key_mask, value_shape[:-1])
        self._check_mask(
            "attention_mask",
            attention_mask,
            query_shape[:-1] + (value_shape[-2],),
            broadcast=True,
        )
        return query, value, key, query_mask, value_mask, key_mask

    # --------------------------------------------------------------- keras API
    def build(self, query_shape=None, value_shape=None, key_shape=None, **shapes):
        # Keras' `build(input_shape=[query_shape, value_shape(, key_shape)])`.
        input_shape = shapes.pop("input_shape", None)
        if shapes:
            raise TypeError(
                self._error(
                    "build takes query_shape, value_shape, key_shape (or "
                    f"Keras' input_shape). Received: {sorted(shapes)}"
                )
            )
        if query_shape is None:
            query_shape = input_shape
        if (
            isinstance(query_shape, (list, tuple))
            and query_shape
            and isinstance(query_shape[0], (list, tuple))
        ):  # list call: build([query_shape, value_shape(, key_shape)])
            query_shape, value_shape, key_shape = (list(query_shape) + [None] * 2)[:3]
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        query_shape, value_shape, key_shape = (
            tuple(s) for s in (query_shape, value_shape, key_shape)
        )
        self._check_input_shapes(query_shape, value_shape, key_shape)
        self.build_score(query_shape, key_shape)
        self._built_feature_dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self.built = True

    @utils.follows_contract
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
        use_causal_mask = validation.validate_call_flag(self, "use_causal_mask", use_causal_mask)
        return_attention_scores = validation.validate_call_flag(
            self, "return_attention_scores", return_attention_scores
        )
        query, value, key, query_mask, value_mask, key_mask = self._prepare(
            query, value, key, query_mask, value_mask, key_mask, attention_mask, mask
        )
        leading = None
        if len(query.shape) > 3:
            # (B..., T, F) -> (B', T, F): the leading axes are all batch.
            leading = tuple(ops.shape(query)[:-2])
            query_mask, value_mask, key_mask, attention_mask = self._flatten_masks(
                query, value, query_mask, value_mask, key_mask, attention_mask
            )
            query, value, key = (
                ops.reshape(x, (-1,) + tuple(ops.shape(x)[-2:])) for x in (query, value, key)
            )
        # One description of what each query sees, as the multi-head family
        # builds it; `_attend` reads every mask from it.
        mask = attention_masks.AttentionMask.from_tensors(
            query_mask=query_mask,
            key_mask=masking.merge_masks(value_mask, key_mask),
            attention_mask=attention_mask,
            causal=use_causal_mask,
        )
        output, weights = self._attend(query, value, key, mask, training)
        if leading is not None:
            output = ops.reshape(output, leading + tuple(ops.shape(output)[1:]))
            weights = ops.reshape(weights, leading + tuple(ops.shape(weights)[1:]))
        self._record_attention(weights)
        if return_attention_scores:
            return output, weights
        return output

    @staticmethod
    def _flatten_masks(query, value, query_mask, value_mask, key_mask, attention_mask):
        """The masks of `(B..., T, F)` inputs, flattened like the inputs."""
        lead = tuple(ops.shape(query)[:-2])
        tq, tv = ops.shape(query)[-2], ops.shape(value)[-2]

        def flat(mask, shape):
            if mask is None:
                return None
            mask = ops.broadcast_to(masking.to_bool_mask(mask), lead + shape)
            return ops.reshape(mask, (-1,) + shape)

        return (
            flat(query_mask, (tq,)),
            flat(value_mask, (tv,)),
            flat(key_mask, (tv,)),
            flat(attention_mask, (tq, tv)),
        )

    def _attend(self, query, value, key, mask, training):
        """Scores, masked softmax and weighted sum over `(B, T, F)` inputs;
        `mask` is the call's `AttentionMask`."""
        combined = mask.dense(ops.shape(query)[1], ops.shape(key)[1])  # (B|1, 1, Tq, Tv)
        combined = None if combined is None else combined[:, 0]
        # Scores and the weighted sum run in the compute dtype: integer
        # inputs are cast, as Keras' own layers do.
        query, value, key = (ops.cast(x, self.compute_dtype) for x in (query, value, key))
        # Masked positions are zeroed before any matmul, so that whatever
        # they hold (NaN, Inf) contributes nothing (0 * NaN would be NaN).
        query = masking.zero_masked(query, mask.query_mask)
        value = masking.zero_masked(value, mask.key_mask)
        key = masking.zero_masked(key, mask.key_mask)
        # NaN/Inf at a key hidden only by `attention_mask` or the causal mask
        # reaches only the queries that see it.
        key, value = masking.confine_nonfinite(key, value)
        # `score` sees the compute dtype (a subclass mixes in its weights);
        # the built-in dot scores form their logits in float32 themselves.
        weights = ops.cast(
            masking.masked_softmax(self.score(query, key), combined),
            self.compute_dtype,
        )
        # As keras.layers.Attention, the weights returned are those applied
        # to the values: after dropout when training.
        weights = self._dropout_layer(weights, training=training)
        output = score_ops.weighted_sum(weights, value)
        # A masked query row is zero whatever the values hold.
        return masking.zero_masked(output, mask.query_mask), weights

    def compute_output_shape(self, query_shape=None, value_shape=None, key_shape=None, **shapes):
        if query_shape is None:
            query_shape = shapes.pop("input_shape", None)
        if (
            isinstance(query_shape, (list, tuple))
            and query_shape
            and isinstance(query_shape[0], (list, tuple))
        ):  # Keras' compute_output_shape([query_shape, value_shape(, key_shape)])
            query_shape, value_shape = (list(query_shape) + [None])[:2]
        value_shape = query_shape if value_shape is None else value_shape
        return tuple(query_shape[:-1]) + (value_shape[-1],)

    def compute_output_spec(self, *args, **kwargs):
        call = utils.call_arguments(self, args, kwargs)
        return_attention_scores = call.return_attention_scores
        return_attention_scores = validation.validate_call_flag(
            self, "return_attention_scores", return_attention_scores
        )
        query, value, key, _, _, _ = self._prepare(
            call.query,
            call.value,
            call.key,
            call.query_mask,
            call.value_mask,
            call.key_mask,
            call.attention_mask,
            call.mask,
        )
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key.shape),
            dtype=self.compute_dtype,
        )
        if not return_attention_scores:
            return output
        scores = keras.KerasTensor(
            tuple(query.shape[:-1]) + (value.shape[-2],), dtype=self.compute_dtype
        )
        return output, scores
