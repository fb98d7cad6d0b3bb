"""Which heads and query rows `return_attention_scores` returns.

`MultiHeadAttention(...)(..., return_attention_scores=True,
attention_scores_heads=..., attention_scores_query_range=...)` returns the
exact weights of those heads and rows only, computed after the kernel
(`ops.dense_attention.selected_weights`) in `O(heads x rows x Tv)` memory.
"""

import numbers

from keras_attention import validation
from keras_attention.layers.machinery import utils


def static_int(value):
    """A Python int from an int, a NumPy integer or a concrete 0-d tensor
    (Keras turns NumPy call arguments into tensors); None otherwise."""
    value = validation.as_python_scalar(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    return utils.concrete_int(value)


class ScoresSelection:
    """Which heads and query rows `return_attention_scores` returns."""

    def __init__(self, layer, heads, query_range):
        self.heads = None
        if heads is not None:
            items = heads if isinstance(heads, (list, tuple)) else [heads]
            if hasattr(heads, "shape") and len(heads.shape) == 1:
                items = [heads[i] for i in range(heads.shape[0])]
            picked = [static_int(h) for h in items]
            if not picked or not all(h is not None and 0 <= h < layer.num_heads for h in picked):
                raise ValueError(
                    layer._error(
                        "`attention_scores_heads` must be a head index or a "
                        f"non-empty list of indices in [0, {layer.num_heads}). "
                        f"Received: attention_scores_heads={heads!r}"
                    )
                )
            self.heads = picked
        self.query_range = None
        if query_range is not None:
            bounds = None
            if isinstance(query_range, (tuple, list)) and len(query_range) == 2:
                bounds = [static_int(x) for x in query_range]
            if bounds is None or None in bounds or not 0 <= bounds[0] < bounds[1]:
                raise ValueError(
                    layer._error(
                        "`attention_scores_query_range` must be (start, stop) "
                        "with 0 <= start < stop. Received: "
                        f"attention_scores_query_range={query_range!r}"
                    )
                )
            self.query_range = tuple(bounds)

    def check_length(self, layer, query_length):
        if self.query_range and query_length is not None and self.query_range[1] > query_length:
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
