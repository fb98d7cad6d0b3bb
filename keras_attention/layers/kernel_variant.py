"""Shared checks of the MultiHeadAttention subclasses that swap the kernel.

`SparseAttention`, `PerformerAttention` and `LinformerAttention` reuse every
projection of `MultiHeadAttention` and override only `_compute_attention`.
This base adds what they have in common: the parent's memory-efficient
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

    def _kernel_inputs(self, key, value, training):
        """The common preamble of `_compute_attention` in the subclasses.

        Returns `(key, value, dropout)`: key and value heads repeated up to
        `num_heads` (grouped-query attention), and the attention dropout as a
        callable on the weights, or `None` when it cannot act (`dropout=0`,
        or not training). Kernels take `None` as "no dropout", which lets
        block-sparse attention use its memory-linear recomputing path.
        """
        key = multi_head.repeat_key_value_heads(key, self.num_heads)
        value = multi_head.repeat_key_value_heads(value, self.num_heads)
        dropout = None
        if self.dropout > 0 and training is not None and training is not False:

            def dropout(weights):
                return self._dropout_layer(weights, training=training)

        return key, value, dropout

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
