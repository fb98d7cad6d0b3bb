"""Shared checks of the MultiHeadAttention subclasses that swap the kernel.

`SparseAttention`, `PerformerAttention` and `LinformerAttention` reuse every
projection of `MultiHeadAttention` and supply only their kernel, `_attend`.
This base adds what they have in common: MultiHeadAttention's kernel hook
`_compute_attention` repeats grouped key/value heads, builds the attention
dropout and calls `_attend`; the parent's memory-efficient
switches mean nothing for them (their kernels are linear in memory already),
so non-default values are rejected instead of silently ignored, and call
options a kernel cannot honour (a decoding cache, causal cross-attention...)
raise a clear error both eagerly and when building a functional model.
"""

from keras_attention.layers.multi_head_attention import (
    DEFAULT_MEMORY_EFFICIENT_THRESHOLD,
)
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.ops import multi_head


class KernelVariantAttention(MultiHeadAttention):
    """Base of the multi-head layers with their own attention kernel."""

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
        key = multi_head.repeat_key_value_heads(key, self.num_heads)
        value = multi_head.repeat_key_value_heads(value, self.num_heads)
        # `None` when dropout cannot act (`dropout=0`, or not training): it
        # lets block-sparse attention take its memory-linear recomputing path.
        dropout = None
        if self.dropout > 0 and training is not None and training is not False:

            def dropout(weights):
                return self._dropout_layer(weights, training=training)

        result = self._attend(
            query,
            key,
            value,
            query_mask=query_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            dropout=dropout,
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
        """The kernel: `output`, or `(output, weights)` with `return_weights`.

        `query` is `(B, Tq, H, D)`, `key`/`value` `(B, Tv, H, D)` with the
        heads already repeated; `dropout` is a callable on the weights or
        `None`. Options a kernel cannot honour are rejected earlier by
        `_check_call_options`; masked query rows are zeroed by the caller.
        """
        raise NotImplementedError

    def _reject_memory_efficient_options(self, default_block_size=None):
        for argument, value, default in (
            ("memory_efficient", self.memory_efficient, "auto"),
            (
                "memory_efficient_threshold",
                self.memory_efficient_threshold,
                DEFAULT_MEMORY_EFFICIENT_THRESHOLD,
            ),
        ):
            if value != default:
                raise ValueError(
                    f"{type(self).__name__}: `{argument}` selects "
                    "MultiHeadAttention's exact kernel and has no effect here "
                    f"(this kernel is linear in memory). Leave it at {default!r}. "
                    f"Received: {argument}={value!r}"
                )

    def _check_call_options(
        self, query, value, attention_mask, use_causal_mask, cache, cache_update_index
    ):
        """Raises for call options the kernel cannot honour. Override to add."""
        if cache is not None or cache_update_index is not None:
            raise ValueError(
                self._error(
                    "a decoding `cache` is not supported by this kernel; use "
                    "MultiHeadAttention for incremental decoding. Received: "
                    f"cache={'a tensor' if cache is not None else None}, "
                    f"cache_update_index={cache_update_index!r}"
                )
            )
