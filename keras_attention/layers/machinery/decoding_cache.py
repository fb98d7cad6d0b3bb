"""MultiHeadAttention's decoding cache: a call's cache checked, written and read.

A call with `cache=` (and `cache_update_index=` to write the query's keys and
values) attends over the cache instead of `value` / `key`: `check_cache` and
`prepare_cached` validate it (eager or symbolic), `cached_call` writes the
new keys and values (by position, or into a window's ring buffer with sink
slots, `ops.cache`) and returns the call's inputs for the kernels with the
absolute positions of queries and keys in its `AttentionMask`.
"""

import keras
from keras import ops

from keras_attention.layers.machinery import call_checks
from keras_attention.layers.machinery import call_options
from keras_attention.layers.machinery import scores_selection
from keras_attention.ops import cache as ring_cache
from keras_attention.ops import masking


def ring_sinks(layer, query, cache, cache_update_index):
    """With a `sliding_window`, the pinned sink slots (0 without sink
    tokens) of a cache addressed as a ring buffer (`ops.cache.ring_slots`):
    one with fewer slots than positions keeps the sinks and the last
    keys, each step equal to the full cache's. None (the cache is
    addressed by position) without a window, when a static index shows
    nothing wraps, or when the ring is shorter than the window plus the
    new tokens (`sliding_window - 1 + Tq` slots after the sinks): a call
    with more new tokens than that is written by position, as before."""
    slots, steps = ring_cache.cache_slots(cache), query.shape[1]
    if not ring_holds(layer, slots, steps):
        return None
    index = scores_selection.static_int(cache_update_index)
    if index is not None and index + steps <= slots:
        return None
    return layer.sink_tokens or 0


def ring_holds(layer, slots, steps):
    """Whether `slots` hold the sinks, the window and `steps` new tokens."""
    if layer.sliding_window is None or slots is None or steps is None:
        return False
    return slots - (layer.sink_tokens or 0) >= layer.sliding_window - 1 + steps


def check_cacheable(layer):
    if layer._value_dim != layer._key_dim:
        raise ValueError(
            layer._error(
                "a key/value cache needs `value_dim == key_dim`. Received: "
                f"key_dim={layer._key_dim}, value_dim={layer._value_dim}"
            )
        )
    if layer.sequence_parallel is not None:
        raise ValueError(
            layer._error(
                f"`sequence_parallel={layer.sequence_parallel!r}` (ring "
                "attention) does not support a decoding `cache`: decode "
                "without sequence parallelism. Received: a cache"
            )
        )


def check_cache(layer, query, value, key, cache, cache_update_index):
    check_cacheable(
        layer,
    )
    if ring_cache.is_pair(cache):
        shapes = [tuple(getattr(part, "shape", ())) for part in cache]
        if len(shapes) != 2 or shapes[0] != shapes[1] or len(shapes[0]) != 4:
            raise ValueError(
                layer._error(
                    "a `cache` pair must be (keys, values) of one shape (batch, "
                    "max_length, num_key_value_heads, key_dim). Received: cache "
                    f"with shapes {shapes}"
                )
            )
        shape = shapes[0][:1] + (2,) + shapes[0][1:]  # as the stacked form
    elif not hasattr(cache, "shape"):
        raise TypeError(
            layer._error(
                f"`cache` must be a tensor or a (keys, values) pair. Received: cache={cache!r}"
            )
        )
    else:
        shape = tuple(cache.shape)
    expected = (query.shape[0], 2, None, layer._num_key_value_heads, layer._key_dim)
    if len(shape) != 5 or not all(
        got is None or want is None or got == want
        for got, want in zip(shape, expected, strict=True)
    ):
        raise ValueError(
            layer._error(
                "`cache` must have shape (batch, 2, max_length, "
                f"num_key_value_heads, key_dim) = {expected} (None = any). "
                f"Received: cache with shape {shape}"
            )
        )
    if cache_update_index is None:
        if value is not None or key is not None:
            raise ValueError(
                layer._error(
                    "a read-only `cache` (cache_update_index=None) holds the "
                    "keys and values; do not pass `value` or `key` too. "
                    f"Received: value={value is not None}, key={key is not None}"
                )
            )
        return
    if key is not None or (value is not None and value is not query):
        raise ValueError(
            layer._error(
                "`cache_update_index` is for layer-attention decoding: `value` "
                "and `key` must be None (or `value` the query itself). "
                f"Received: value={value is not None}, key={key is not None}"
            )
        )
    if isinstance(cache_update_index, (bool, float)):
        raise TypeError(
            layer._error(
                "`cache_update_index` must be an int or an int tensor. "
                f"Received: cache_update_index={cache_update_index!r}"
            )
        )
    index = scores_selection.static_int(cache_update_index)
    max_length, steps = shape[2], query.shape[1]
    if index is not None and (
        index < 0
        or (
            max_length is not None
            and steps is not None
            and index + steps > max_length
            and not ring_holds(layer, max_length, steps)
        )
    ):
        # A concrete index is checked; only a compiled loop's symbolic
        # index is clamped by the update slice.
        raise ValueError(
            layer._error(
                "`cache_update_index` plus the query length "
                f"({steps}) must fit in the cache length ({max_length}). "
                f"Received: cache_update_index={index}"
            )
        )


def prepare_cached(layer, query, value, key, options):
    """Validation of a call with a cache (eager or symbolic); returns the
    query's mask (Keras' mask of a one-input call when none is given)."""
    layer._check_tensor("query", query)
    layer._check_rank("query", tuple(query.shape))
    call_checks.refuse_cached_key_positions(
        layer, options.key_position_ids, options.cache_update_index
    )
    cache, index = options.cache, options.cache_update_index
    check_cache(layer, query, value, key, cache, index)
    built = getattr(layer, "_built_feature_dims", None)
    if built is not None and query.shape[-1] not in (None, built[0]):
        raise ValueError(
            layer._error(
                f"`query` has {query.shape[-1]} features but the layer was "
                f"built for {built[0]}. Received: query with shape "
                f"{tuple(query.shape)}"
            )
        )
    query_mask = options.mask if options.query_mask is None else options.query_mask
    batch, steps = query.shape[0], query.shape[1]
    cache_length = ring_cache.cache_slots(cache)
    for name, given, expected in (
        ("query_mask", query_mask, (batch, steps)),
        ("value_mask", options.value_mask, (batch, cache_length)),
        ("key_mask", options.key_mask, (batch, cache_length)),
    ):
        layer._check_mask(name, given, expected)
    layer._check_mask(
        "attention_mask", options.attention_mask, (batch, steps, cache_length), broadcast=True
    )
    if options.cache_update_mask is not None and index is None:
        raise ValueError(
            layer._error(
                "`cache_update_mask` says which steps a call writes: pass "
                "`cache_update_index` too. Received: cache_update_mask with "
                "cache_update_index=None"
            )
        )
    layer._check_mask("cache_update_mask", options.cache_update_mask, (batch, steps))
    return query_mask


def refuse_without_cache(layer, options):
    """`cache_update_index` / `cache_update_mask` given with no `cache`."""
    for name, given in (
        ("cache_update_index", options.cache_update_index),
        ("cache_update_mask", options.cache_update_mask),
    ):
        if given is not None:
            raise ValueError(
                layer._error(
                    f"`{name}` needs a `cache`. Received: {name}="
                    f"{given if name == 'cache_update_index' else 'a mask'!r}, cache=None"
                )
            )


def cached_inputs(layer, query, value, key, options):
    """`(PreparedCall, key, value, new cache)` of a call with a cache: the
    query's keys/values are written at `cache_update_index` and the queries
    sit at that absolute position (the rotary embedding's too, unless
    `position_ids` say otherwise); `key` / `value` are the cache's."""
    query_mask = prepare_cached(layer, query, value, key, options)
    layout = layer._layout(3)
    rotary_positions = call_checks.check_position_ids(
        layer, options.position_ids, None, tuple(query.shape)
    )
    query = layer._to_compute_dtype(query)
    cache, cache_update_index = options.cache, options.cache_update_index
    positions = {}
    if cache_update_index is not None:
        index = ops.cast(cache_update_index, "int32")
        if rotary_positions is None and layer.rotary is not None:
            rotary_positions = index + ops.arange(ops.shape(query)[1], dtype="int32")
        step = ops.stack(layer._project_key_value(query, query, rotary_positions), axis=1)
        sinks = ring_sinks(layer, query, cache, cache_update_index)
        # With sinks, a window's ring buffer: slots wrap, positions stay absolute.
        cache = ring_cache.write_cache(cache, step, index, sinks, options.cache_update_mask)
        if sinks is not None:
            written = index + ops.shape(query)[1]
            slots = ring_cache.ring_positions(ring_cache.cache_slots(cache), written, sinks)
            positions["key_positions"] = slots[None, :]
        static_index = scores_selection.static_int(cache_update_index)
        positions["query_offset"] = static_index if static_index is not None else index
        if not options.use_causal_mask:  # every written position, none beyond
            positions["key_length"] = index + ops.shape(query)[1]
    key, value = ring_cache.keys_and_values(cache)  # (B, T_max, Hkv, D) each
    spec = layer._attention_mask(
        layout,
        query,
        None,
        masking.to_bool_mask(query_mask),
        masking.merge_masks(options.value_mask, options.key_mask),
        options.attention_mask,
        ops.shape(query)[1],
        ops.shape(key)[1],
        options.use_causal_mask and cache_update_index is not None,
        **positions,
    )
    spec = layer._call_mask(spec, options, layout, query, key.shape[1], self_attention=False)
    # The cache's masked positions contribute nothing, whatever they hold.
    key = masking.zero_masked(key, spec.key_mask)
    value = masking.zero_masked(value, spec.key_mask)
    prepared = call_options.PreparedCall(
        query=query,
        flat_query=query,
        mask=spec,
        layout=layout,
        value_shape=tuple(ops.shape(key))[:2] + (None,),
        query_positions=rotary_positions,
    )
    return prepared, key, value, cache


def output_spec(layer, query, value, key, options):
    """The `KerasTensor`s a call with a cache returns (its checks run)."""
    prepare_cached(layer, query, value, key, options)  # a cached query has rank 3
    call_checks.check_position_ids(layer, options.position_ids, None, tuple(query.shape))
    call_checks.rule_changes(
        layer,
        None,
        tuple(query.shape),
        ring_cache.cache_slots(options.cache),
        False,
        options.segment_ids,
        options.key_segment_ids,
        options.prefix_length,
    )
    dims = layer._output_shape or (query.shape[-1],)
    results = (keras.KerasTensor(tuple(query.shape[:-1]) + tuple(dims), dtype=layer.compute_dtype),)
    if options.return_attention_scores:
        slots = ring_cache.cache_slots(options.cache)
        shape = (query.shape[0], layer._num_heads, query.shape[1], slots)
        results += (keras.KerasTensor(shape, dtype=layer.compute_dtype),)
    cache = options.cache
    if ring_cache.is_pair(cache):
        return results + (tuple(keras.KerasTensor(c.shape, dtype=c.dtype) for c in cache),)
    return results + (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
