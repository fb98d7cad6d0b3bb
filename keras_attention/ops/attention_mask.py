"""One description of what each query may see, consumed by every kernel.

A call restricts attention in many ways: padding masks of the queries and
the keys, an explicit `attention_mask` of any shape Keras accepts, the causal
mask, a sliding window, and, under a decoding cache, the absolute positions
of the new queries among the cached keys. `AttentionMask` holds all of them
in one normalised form:

- `query_mask` `(B|1, Tq)` and `key_mask` `(B|1, Tk)` booleans;
- `pair_mask` `(B|1, H|1, Tq, Tk)` boolean, for what varies along both axes
  (an explicit mask that is neither a key nor a query mask);
- the positional rules, on *absolute* positions: query row `i` is at
  position `query_offset + i` (the cache index while decoding), key `j` at
  position `j`; `causal` allows `key <= query`, `sliding_window=w` allows
  `|query - key| < w`, and `key_length` hides keys at positions
  `>= key_length` (cache slots not yet written).

Kernels never re-derive any of these: the dense kernels call `dense()`, the
blockwise ones `positional()` on their tile's positions and
`key_block_range()` to skip tiles, so the cache offset is right on every
kernel by construction. A row with nothing to attend to (every key hidden,
whatever the spelling) gets zero weights and a zero attention result.
"""

from keras import ops

from keras_attention.ops.masking import merge_masks
from keras_attention.ops.masking import to_bool_mask


class AttentionMask:
    """What each query may see (see the module docstring).

    Args:
        query_mask: `(B|1, Tq)` boolean (or 0/1), or None.
        key_mask: `(B|1, Tk)` boolean (or 0/1), or None.
        pair_mask: `(B|1, Tq, Tk)` or `(B|1, H|1, Tq, Tk)` boolean, or None.
        causal: query at position `p` sees keys at positions `<= p`.
        sliding_window: query at `p` sees keys at `|p - k| < sliding_window`.
        query_offset: absolute position of query row 0 (int or scalar int
            tensor); 0 outside decoding.
        key_length: keys at positions `>= key_length` are hidden (int or
            scalar int tensor), or None.
    """

    def __init__(
        self,
        *,
        query_mask=None,
        key_mask=None,
        pair_mask=None,
        causal=False,
        sliding_window=None,
        query_offset=0,
        key_length=None,
    ):
        self.query_mask = to_bool_mask(query_mask)
        self.key_mask = to_bool_mask(key_mask)
        pair_mask = to_bool_mask(pair_mask)
        if pair_mask is not None and len(pair_mask.shape) == 3:
            pair_mask = ops.expand_dims(pair_mask, 1)
        self.pair_mask = pair_mask
        self.causal = bool(causal)
        self.sliding_window = sliding_window
        self.query_offset = query_offset
        self.key_length = key_length

    # ------------------------------------------------------------ queries
    @property
    def has_positional(self):
        """Whether a rule depends on positions (causal, window, key length)."""
        return self.causal or self.sliding_window is not None or (self.key_length is not None)

    @property
    def is_empty(self):
        """Nothing is masked at all."""
        return (
            self.query_mask is None
            and self.key_mask is None
            and self.pair_mask is None
            and not self.has_positional
        )

    @property
    def per_head(self):
        """Whether the pair mask differs between heads."""
        return self.pair_mask is not None and self.pair_mask.shape[1] != 1

    @property
    def causal_only(self):
        """Only the plain causal rule from position 0: a fused kernel's
        `is_causal=True` computes exactly this."""
        return (
            self.causal
            and self.query_mask is None
            and self.key_mask is None
            and self.pair_mask is None
            and self.sliding_window is None
            and self.key_length is None
            and isinstance(self.query_offset, int)
            and self.query_offset == 0
        )

    def replace(self, **changes):
        """A copy with some fields changed."""
        fields = dict(
            query_mask=self.query_mask,
            key_mask=self.key_mask,
            pair_mask=self.pair_mask,
            causal=self.causal,
            sliding_window=self.sliding_window,
            query_offset=self.query_offset,
            key_length=self.key_length,
        )
        fields.update(changes)
        return AttentionMask(**fields)

    # --------------------------------------------------------- positions
    def query_positions(self, start, size):
        """Absolute positions of query rows `start .. start + size - 1`."""
        offset = self.query_offset
        if not isinstance(offset, int):
            offset = ops.cast(offset, "int32")
        return offset + start + ops.arange(size, dtype="int32")

    def positional(self, rows, cols):
        """`(len(rows), len(cols))` boolean of the positional rules, or None.

        `rows` and `cols` are absolute positions (int32 vectors).
        """
        return self.allows(ops.expand_dims(rows, 1), ops.expand_dims(cols, 0))

    def allows(self, rows, cols):
        """The positional rules for query positions `rows` and key positions
        `cols`, elementwise with broadcasting (None when there are none)."""
        if not self.has_positional:
            return None
        rows, cols = ops.cast(rows, "int32"), ops.cast(cols, "int32")
        allowed = None
        if self.causal:
            allowed = ops.greater_equal(rows, cols)
        if self.sliding_window is not None:
            band = ops.less(ops.abs(rows - cols), self.sliding_window)
            allowed = merge_masks(allowed, band)
        if self.key_length is not None:
            shape = ops.shape(ops.zeros_like(rows) + ops.zeros_like(cols))
            allowed = merge_masks(allowed, ops.broadcast_to(ops.less(cols, self.key_length), shape))
        return allowed

    def key_range(self, first_row, last_row):
        """`(start, stop)`: the key positions query rows at absolute
        positions `first_row .. last_row` may see lie in `[start, stop)`;
        `stop` is None when unbounded. Ints when the positions are."""
        start, stop = 0, None
        if self.causal:
            stop = last_row + 1
        if self.sliding_window is not None:
            reach = self.sliding_window - 1
            start = _maximum(first_row - reach, 0)
            if not self.causal:
                stop = last_row + reach + 1
        if self.key_length is not None:
            stop = self.key_length if stop is None else _minimum(stop, self.key_length)
        return start, stop

    def key_block_range(self, first_row, last_row, key_block, num_key_blocks):
        """`(start, stop)` key blocks of `key_block` keys that those rows may
        see (see `key_range`); tiles outside are all masked."""
        start, stop = self.key_range(first_row, last_row)
        if stop is None:
            stop_block = num_key_blocks
        else:
            # No key at all (e.g. a window wholly past the written cache): no
            # block, rather than the one that rounding `stop` up would give.
            stop_block = _minimum((stop + key_block - 1) // key_block, num_key_blocks)
            empty = stop <= start
            stop_block = _select(empty, _minimum(start // key_block, stop_block), stop_block)
        return _minimum(start // key_block, stop_block), stop_block  # never a negative range

    # -------------------------------------------------------------- dense
    def dense(self, query_length, key_length):
        """The merged boolean `(B|1, H|1, Tq, Tk)` mask, or None."""
        parts = []
        if self.query_mask is not None:
            parts.append(self.query_mask[:, None, :, None])
        if self.key_mask is not None:
            parts.append(self.key_mask[:, None, None, :])
        if self.pair_mask is not None:
            parts.append(self.pair_mask)
        if self.has_positional:
            rows = self.query_positions(0, query_length)
            cols = ops.arange(key_length, dtype="int32")
            parts.append(self.positional(rows, cols)[None, None])
        return merge_masks(*parts)

    def rows(self, start, stop):
        """The description of query rows `start:stop` only (static ints)."""
        return self.replace(
            query_mask=None if self.query_mask is None else self.query_mask[:, start:stop],
            pair_mask=None if self.pair_mask is None else self.pair_mask[:, :, start:stop],
            query_offset=self.query_offset + start,
        )

    def heads(self, indices):
        """The description for the query heads `indices` only."""
        if not self.per_head:
            return self
        return self.replace(pair_mask=ops.take(self.pair_mask, indices, axis=1))


def _minimum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return ops.minimum(a, b)


def _select(condition, a, b):
    if isinstance(condition, bool):
        return a if condition else b
    return ops.where(condition, a, b)


def _maximum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return ops.maximum(a, b)


def from_keras_mask(attention_mask, use_causal_mask=False):
    """The description of a Keras-style call's one merged mask.

    `attention_mask` is anything broadcastable to `(B, Tq, Tk)` (e.g.
    `(Tq, Tk)`, `(1, Tk)`) or `(B, H, Tq, Tk)`, boolean or 0/1, as
    `keras.layers.MultiHeadAttention._compute_attention` takes it (the form
    subclasses written for Keras pass).
    """
    if attention_mask is None:
        return AttentionMask(causal=use_causal_mask)
    mask = to_bool_mask(attention_mask)
    while len(mask.shape) < 3:
        mask = ops.expand_dims(mask, 0)
    return AttentionMask(pair_mask=mask, causal=use_causal_mask)
