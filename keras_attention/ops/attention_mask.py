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
  `>= key_length` (cache slots not yet written);
- `prefix_length` (with `causal`; an int or one per example): the keys of
  the prefix are seen by every query, bidirectional attention inside the
  prefix and causal after it (a prefix LM);
- `sink_tokens=n` (with `sliding_window`): the first `n` key positions stay
  visible to every query whatever the window (StreamingLLM,
  arXiv:2309.17453);
- `query_segment_ids` `(B|1, Tq)` / `key_segment_ids` `(B|1, Tk)` integers:
  a query sees the keys of its own segment only (documents packed into one
  sequence);
- `mask_mod(batch, head, q_idx, k_idx) -> bool`, a user rule written with
  `keras.ops` on broadcastable int32 index tensors (absolute positions);
- `key_positions` `(B|1, Tk)` integers: the absolute position of each key
  when it is not its index (a decoding cache whose slots wrap as a ring
  buffer); every rule and score modifier reads these positions.

Kernels never re-derive any of these: the dense kernels call `dense()`, the
blockwise ones `rules()` on their tile's indices and `segments()` on their
tile's ids, and skip the tiles of their `TilePlan` (`tiling.py`, built from
this description), so the cache offset is right on every kernel by
construction. A row with nothing to attend to (every key hidden,
whatever the spelling) gets zero weights and a zero attention result.
"""

from keras import ops

from keras_attention.ops import checks
from keras_attention.ops import mods
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
        prefix_length: with `causal`, keys at positions `< prefix_length`
            are seen by every query (int, or `(B,)` int tensor), or None.
        sink_tokens: with `sliding_window`, keys at positions
            `< sink_tokens` are exempt from the window, or None.
        query_segment_ids, key_segment_ids: `(B|1, Tq)` and `(B|1, Tk)`
            integers (both or neither): a query sees its segment's keys only.
        mask_mod: `mask_mod(batch, head, q_idx, k_idx) -> bool`, or None.
        key_positions: `(B|1, Tk)` integers, the keys' absolute positions
            (default: key `j` at position `j`).
        tile_plan: the `TilePlan` of this description (`ops.tile_plan`),
            built once and carried to the tiled kernels, or None (they build
            it). Not a rule: any other change (`replace`, `rows`) drops it.
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
        prefix_length=None,
        sink_tokens=None,
        query_segment_ids=None,
        key_segment_ids=None,
        mask_mod=None,
        key_positions=None,
        tile_plan=None,
    ):
        owner = "AttentionMask"
        if key_positions is not None:
            checks.tensor(owner, "key_positions", key_positions, rank=2)
            if "int" not in str(getattr(key_positions.dtype, "name", key_positions.dtype)):
                raise TypeError(
                    f"{owner}: `key_positions` must be integers. Received: key_positions "
                    f"with dtype {getattr(key_positions.dtype, 'name', key_positions.dtype)}"
                )
        self.key_positions = key_positions
        if tile_plan is not None and type(tile_plan).__name__ != "TilePlan":
            raise TypeError(
                f"{owner}: `tile_plan` must be a TilePlan (ops.tile_plan) or None. "
                f"Received: tile_plan={tile_plan!r}"
            )
        self.tile_plan = tile_plan
        checks.mask(owner, "query_mask", query_mask, rank=2)
        checks.mask(owner, "key_mask", key_mask, rank=2)
        checks.mask(owner, "pair_mask", pair_mask, rank=(3, 4))
        causal = checks.flag(owner, "causal", causal)
        sliding_window = checks.positive_int(
            owner, "sliding_window", sliding_window, allow_none=True
        )
        sink_tokens = checks.positive_int(owner, "sink_tokens", sink_tokens, allow_none=True)
        for name, ids in (
            ("query_segment_ids", query_segment_ids),
            ("key_segment_ids", key_segment_ids),
        ):
            if ids is not None:
                checks.tensor(owner, name, ids, rank=2)
                if "int" not in str(getattr(ids.dtype, "name", ids.dtype)):
                    raise TypeError(
                        f"{owner}: `{name}` must be integers. Received: {name} with "
                        f"dtype {getattr(ids.dtype, 'name', ids.dtype)}"
                    )
        if prefix_length is not None and not causal:
            raise ValueError(
                f"{owner}: `prefix_length` is a causal rule's prefix (bidirectional "
                "inside it, causal after): pass causal=True. Received: "
                f"prefix_length={prefix_length!r}, causal={causal!r}"
            )
        if (query_segment_ids is None) != (key_segment_ids is None):
            raise ValueError(
                f"{owner}: pass both `query_segment_ids` and `key_segment_ids`, or "
                f"neither. Received: query_segment_ids={query_segment_ids!r}, "
                f"key_segment_ids={key_segment_ids!r}"
            )
        mask_mod = mods.UserMod.wrap(mask_mod, "mask_mod", owner)
        self.prefix_length = prefix_length
        self.sink_tokens = sink_tokens
        self.query_segment_ids = query_segment_ids
        self.key_segment_ids = key_segment_ids
        self.mask_mod = mask_mod
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

    @classmethod
    def from_tensors(
        cls,
        *,
        query_mask=None,
        key_mask=None,
        attention_mask=None,
        causal=False,
        sliding_window=None,
        segment_ids=None,
        key_segment_ids=None,
        prefix_length=None,
        sink_tokens=None,
        mask_mod=None,
        query_offset=0,
        key_length=None,
    ):
        """The description of Keras' spellings of a mask (the one public way
        to build one from tensors).

        Args:
            query_mask: `(B, Tq)` booleans or 0/1 (a Keras mask), or None.
            key_mask: `(B, Tk)`, or None (Keras' `value_mask`).
            attention_mask: anything broadcastable to `(B, Tq, Tk)` (e.g.
                `(Tq, Tk)`, `(1, Tk)`) or a per-head `(B, H, Tq, Tk)`, as
                `keras.layers.MultiHeadAttention` takes it; or None.
            causal: Keras' `use_causal_mask`.
            sliding_window: `|q - k| < sliding_window`, or None.
            segment_ids: `(B, Tq)` integers (packed documents); the keys'
                default to them (self-attention).
            key_segment_ids: `(B, Tk)` integers, or None.
            prefix_length, sink_tokens, mask_mod, query_offset, key_length:
                as the constructor.
        """
        owner = "AttentionMask.from_tensors"
        checks.mask(owner, "attention_mask", attention_mask, rank=(1, 2, 3, 4))
        pair = to_bool_mask(attention_mask)
        if pair is not None:
            while len(pair.shape) < 3:
                pair = ops.expand_dims(pair, 0)
        if key_segment_ids is None:
            key_segment_ids = segment_ids
        elif segment_ids is None:
            raise ValueError(
                f"{owner}: `key_segment_ids` needs `segment_ids`. Received: segment_ids=None"
            )
        return cls(
            query_mask=query_mask,
            key_mask=key_mask,
            pair_mask=pair,
            causal=causal,
            sliding_window=sliding_window,
            query_offset=query_offset,
            key_length=key_length,
            prefix_length=prefix_length,
            sink_tokens=sink_tokens,
            query_segment_ids=segment_ids,
            key_segment_ids=key_segment_ids,
            mask_mod=mask_mod,
        )

    # ------------------------------------------------------------ queries
    @property
    def has_positional(self):
        """Whether a rule depends on positions (causal, window, key length)."""
        return self.causal or self.sliding_window is not None or (self.key_length is not None)

    @property
    def has_segments(self):
        return self.query_segment_ids is not None

    @property
    def batch_dependent_rules(self):
        """Whether a positional rule differs between examples (a prefix
        length per example) or a `mask_mod` is given: `rules()` needs the
        batch (and head) indices."""
        return self.mask_mod is not None or not (
            self.prefix_length is None or isinstance(self.prefix_length, int)
        )

    @property
    def has_rules(self):
        """Whether `rules()` masks anything."""
        return self.has_positional or self.mask_mod is not None

    @property
    def is_empty(self):
        """Nothing is masked at all."""
        return (
            self.query_mask is None
            and self.key_mask is None
            and self.pair_mask is None
            and not self.has_positional
            and not self.has_segments
            and self.mask_mod is None
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
            and self.prefix_length is None
            and not self.has_segments
            and self.mask_mod is None
            and isinstance(self.query_offset, int)
            and self.query_offset == 0
            and self.key_positions is None
        )

    def replace(self, **changes):
        """A copy with some fields changed (the tile plan dropped unless
        it is the only change: the plan was built for the old rules)."""
        plan = changes.pop("tile_plan", None if changes else self.tile_plan)
        fields = dict(
            query_mask=self.query_mask,
            key_mask=self.key_mask,
            pair_mask=self.pair_mask,
            causal=self.causal,
            sliding_window=self.sliding_window,
            query_offset=self.query_offset,
            key_length=self.key_length,
            prefix_length=self.prefix_length,
            sink_tokens=self.sink_tokens,
            query_segment_ids=self.query_segment_ids,
            key_segment_ids=self.key_segment_ids,
            mask_mod=self.mask_mod,
            key_positions=self.key_positions,
        )
        fields.update(changes)
        return AttentionMask(**fields, tile_plan=plan)

    # --------------------------------------------------------- positions
    def query_positions(self, start, size):
        """Absolute positions of query rows `start .. start + size - 1`."""
        offset = self.query_offset
        if not isinstance(offset, int):
            offset = ops.cast(offset, "int32")
        return offset + start + ops.arange(size, dtype="int32")

    def key_columns(self, key_length):
        """`(B|1, Tk)` int32: the absolute position of each key."""
        if self.key_positions is None:
            return ops.arange(key_length, dtype="int32")[None, :]
        return ops.cast(self.key_positions, "int32")

    def positional(self, rows, cols):
        """`(len(rows), len(cols))` boolean of the positional rules, or None.

        `rows` and `cols` are absolute positions (int32 vectors); for rules
        that are the same in every example (see `rules` otherwise).
        """
        return self.allows(ops.expand_dims(rows, 1), ops.expand_dims(cols, 0))

    def allows(self, rows, cols, batch=None):
        """The positional rules for query positions `rows` and key positions
        `cols`, elementwise with broadcasting (None when there are none);
        `batch` (broadcastable int32 example indices) reads a per-example
        prefix length."""
        if not self.has_positional:
            return None
        rows, cols = ops.cast(rows, "int32"), ops.cast(cols, "int32")
        allowed = None
        if self.causal:
            allowed = ops.greater_equal(rows, cols)
            if self.prefix_length is not None:
                prefix = self.prefix_length
                if not isinstance(prefix, int):
                    if batch is None:
                        raise ValueError(
                            "AttentionMask.allows: a per-example `prefix_length` needs "
                            "the batch indices. Received: batch=None"
                        )
                    prefix = ops.take(ops.cast(prefix, "int32"), batch)
                allowed = ops.logical_or(allowed, ops.less(cols, prefix))
        if self.sliding_window is not None:
            band = ops.less(ops.abs(rows - cols), self.sliding_window)
            if self.sink_tokens:
                band = ops.logical_or(band, ops.less(cols, self.sink_tokens))
            allowed = merge_masks(allowed, band)
        if self.key_length is not None:
            shape = ops.shape(ops.zeros_like(rows) + ops.zeros_like(cols))
            allowed = merge_masks(allowed, ops.broadcast_to(ops.less(cols, self.key_length), shape))
        return allowed

    def rules(self, batch, head, rows, cols):
        """Every rule that is a function of (example, head, query position,
        key position), elementwise on broadcastable int32 index tensors: the
        positional rules (a per-example prefix too) and `mask_mod`; None
        when there are none."""
        allowed = self.allows(rows, cols, batch)
        if self.mask_mod is not None:
            user = self.mask_mod(batch, head, ops.cast(rows, "int32"), ops.cast(cols, "int32"))
            allowed = merge_masks(allowed, user)
        return allowed

    @staticmethod
    def segments(query_ids, key_ids):
        """Whether each query id equals each key id, broadcasting."""
        return ops.equal(query_ids, key_ids)

    def _causal_stop(self, last_row):
        stop = last_row + 1
        if self.prefix_length is not None:
            prefix = self.prefix_length
            if not isinstance(prefix, int):
                prefix = ops.max(ops.cast(prefix, "int32"))
            stop = _maximum(stop, prefix)
        return stop

    def key_range(self, first_row, last_row):
        """`(start, stop)`: the key positions query rows at absolute
        positions `first_row .. last_row` may see lie in `[start, stop)`;
        `stop` is None when unbounded. Ints when the positions are. The hull
        of `key_ranges`."""
        ranges = self.key_ranges(first_row, last_row)
        if len(ranges) == 1:
            return ranges[0]
        (start, stop), (_, sink_stop) = ranges
        return 0, sink_stop if stop is None else _maximum(stop, sink_stop)

    def key_ranges(self, first_row, last_row):
        """The key position ranges `[(start, stop), ...]` those rows may see:
        one, and a second, `[0, sink stop)`, for sink tokens beside a window."""
        start, stop = 0, None
        if self.causal:
            stop = self._causal_stop(last_row)
        if self.sliding_window is not None:
            reach = self.sliding_window - 1
            start = _maximum(first_row - reach, 0)
            window_stop = last_row + reach + 1
            stop = window_stop if stop is None else _minimum(stop, window_stop)
        if self.key_length is not None:
            stop = self.key_length if stop is None else _minimum(stop, self.key_length)
        if not (self.sink_tokens and self.sliding_window is not None):
            return [(start, stop)]
        sink_stop = self.sink_tokens
        if self.causal:
            sink_stop = _minimum(sink_stop, self._causal_stop(last_row))
        if self.key_length is not None:
            sink_stop = _minimum(sink_stop, self.key_length)
        return [(start, stop), (0, sink_stop)]

    # -------------------------------------------------------------- dense
    def dense(self, query_length, key_length, batch_size=None, heads=None):
        """The merged boolean `(B|1, H|1, Tq, Tk)` mask, or None.

        `batch_size` and `heads` (the head numbers of the head axis, or
        their count) are needed by a per-example prefix and a `mask_mod`.
        """
        parts = []
        if self.query_mask is not None:
            parts.append(self.query_mask[:, None, :, None])
        if self.key_mask is not None:
            parts.append(self.key_mask[:, None, None, :])
        if self.pair_mask is not None:
            parts.append(self.pair_mask)
        if self.has_segments:
            parts.append(
                self.segments(
                    ops.cast(self.query_segment_ids, "int32")[:, None, :, None],
                    ops.cast(self.key_segment_ids, "int32")[:, None, None, :],
                )
            )
        if self.has_rules:
            rows = ops.reshape(self.query_positions(0, query_length), (1, 1, -1, 1))
            cols = self.key_columns(key_length)[:, None, None, :]
            batch = head = None
            if self.batch_dependent_rules:
                if batch_size is None or (self.mask_mod is not None and heads is None):
                    raise ValueError(
                        "AttentionMask.dense: a per-example prefix or a `mask_mod` needs "
                        f"`batch_size` and `heads`. Received: batch_size={batch_size!r}, "
                        f"heads={heads!r}"
                    )
                batch = ops.reshape(ops.arange(batch_size, dtype="int32"), (-1, 1, 1, 1))
                if heads is not None:
                    if isinstance(heads, int):
                        heads = ops.arange(heads, dtype="int32")
                    head = ops.reshape(ops.convert_to_tensor(heads, dtype="int32"), (1, -1, 1, 1))
            parts.append(self.rules(batch, head, rows, cols))
        return merge_masks(*parts)

    def rows(self, start, stop):
        """The description of query rows `start:stop` only (static ints)."""
        return self.replace(
            query_mask=None if self.query_mask is None else self.query_mask[:, start:stop],
            pair_mask=None if self.pair_mask is None else self.pair_mask[:, :, start:stop],
            query_offset=self.query_offset + start,
            query_segment_ids=(
                None if self.query_segment_ids is None else self.query_segment_ids[:, start:stop]
            ),
        )

    def heads(self, indices):
        """The description for the query heads `indices` only."""
        if not self.per_head:
            return self
        return self.replace(pair_mask=ops.take(self.pair_mask, indices, axis=1))


def block_extremes(ids, block, num_blocks):
    """`(min, max)` `(B, n)` of `(B, T)` integer ids over blocks of `block`
    (the last block padded with the last id)."""
    ids = ops.cast(ids, "int32")
    pad = num_blocks * block - ids.shape[1]
    if pad:
        ids = ops.concatenate([ids, ops.repeat(ids[:, -1:], pad, axis=1)], axis=1)
    blocks = ops.reshape(ids, (-1, num_blocks, block))
    return ops.min(blocks, axis=2), ops.max(blocks, axis=2)


def _minimum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return ops.minimum(a, b)


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
    return AttentionMask.from_tensors(attention_mask=attention_mask, causal=use_causal_mask)
