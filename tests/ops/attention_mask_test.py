"""`AttentionMask`'s positional rules and the key ranges the ring kernel skips by.

The rules are checked against a NumPy statement of each one on absolute positions
(query row `i` at `query_offset + i`, key `j` at `j`). `key_range` (the
ring kernel's skip) is checked to be sound (no visible key outside the range: a kernel
that skipped it would be wrong) and tight (its first and last key are visible).
"""

import itertools

import numpy as np
import pytest
from keras import ops

from keras_attention.ops.attention_mask import AttentionMask

KEYS = 24

# name -> the constructor's positional arguments.
RULES = {
    "causal": dict(causal=True),
    "window": dict(sliding_window=3),
    "causal window": dict(causal=True, sliding_window=4),
    "decoding offset": dict(causal=True, query_offset=9),
    "offset window": dict(sliding_window=2, query_offset=5),
    "unwritten cache slots": dict(causal=True, query_offset=6, key_length=11),
    "key length only": dict(key_length=7),
    "window past the keys": dict(sliding_window=5, query_offset=20, key_length=22),
    "prefix": dict(causal=True, prefix_length=6),
    "prefix under a window": dict(causal=True, prefix_length=9, sliding_window=3),
    "sinks beside a window": dict(causal=True, sliding_window=3, sink_tokens=2),
    "sinks, decoding": dict(causal=True, sliding_window=4, sink_tokens=5, query_offset=10),
    "sinks, no causal": dict(sliding_window=2, sink_tokens=4, query_offset=3, key_length=20),
}


def visible(rule, query_positions, key_positions):
    """NumPy: `(Tq, Tk)` whether each query position sees each key position."""
    q, k = np.asarray(query_positions)[:, None], np.asarray(key_positions)[None, :]
    allowed = np.ones(np.broadcast_shapes(q.shape, k.shape), bool)
    if rule.get("causal"):
        allowed &= (k <= q) | (k < rule.get("prefix_length", 0))
    if rule.get("sliding_window") is not None:
        allowed &= (np.abs(q - k) < rule["sliding_window"]) | (k < rule.get("sink_tokens", 0))
    if rule.get("key_length") is not None:
        allowed &= k < rule["key_length"]
    return allowed


@pytest.mark.parametrize("name", sorted(RULES))
def test_dense_form_is_each_rule_on_absolute_positions(name):
    rule = RULES[name]
    queries = 4
    dense = AttentionMask(**rule).dense(queries, KEYS)
    offset = rule.get("query_offset", 0)
    expected = visible(rule, np.arange(queries) + offset, np.arange(KEYS))
    np.testing.assert_array_equal(ops.convert_to_numpy(dense)[0, 0], expected)


@pytest.mark.parametrize("name", sorted(RULES))
def test_key_ranges_are_sound_and_tight(name):
    rule = RULES[name]
    mask = AttentionMask(**rule)
    offset = rule.get("query_offset", 0)
    keys = np.arange(KEYS)
    for first, size in itertools.product(range(8), (1, 3)):
        rows = np.arange(first, first + size) + offset
        seen = visible(rule, rows, keys).any(axis=0)
        start, stop = mask.key_range(int(rows[0]), int(rows[-1]))
        stop = KEYS if stop is None else min(stop, KEYS)
        where = np.flatnonzero(seen)
        context = (name, rows.tolist(), start, stop)
        if where.size:
            assert (start, stop) == (where[0], where[-1] + 1), context
        else:
            assert start >= stop, context


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_tile_plan_of_each_rule_is_exact(name):
    """The plan's full / partial / skipped tiles from each rule's bounds, on
    11 queries x 24 keys in tiles of 4 x 5 (both padded)."""
    from keras_attention.ops import tile_plan
    from tests.ops.kernel_contract_test import exact_tile_kinds

    rule = RULES[name]
    rows = np.arange(11) + rule.get("query_offset", 0)
    plan = tile_plan(AttentionMask(**rule), 11, KEYS, block_size=4, key_block_size=5)
    expected = exact_tile_kinds(visible(rule, rows, np.arange(KEYS))[None, None], 4, 5)
    np.testing.assert_array_equal(ops.convert_to_numpy(plan.tiles()), expected)


def test_row_and_head_slices_keep_absolute_positions():
    rng = np.random.default_rng(0)
    pair = rng.random((2, 3, 6, 6)) < 0.7
    mask = AttentionMask(pair_mask=pair, causal=True, sliding_window=3, query_offset=2)
    full = ops.convert_to_numpy(mask.dense(6, 6))
    rows = ops.convert_to_numpy(mask.rows(2, 5).dense(3, 6))
    np.testing.assert_array_equal(rows, full[:, :, 2:5])
    heads = ops.convert_to_numpy(mask.heads(np.array([2, 0])).dense(6, 6))
    np.testing.assert_array_equal(heads, full[:, [2, 0]])
    expected = pair & visible(dict(causal=True, sliding_window=3), np.arange(6) + 2, np.arange(6))
    np.testing.assert_array_equal(full, expected)


def test_query_and_key_masks_join_the_positional_rules():
    query_mask = np.array([[True, False, True]])
    key_mask = np.array([[1, 1, 0, 1, 1]])
    dense = AttentionMask(query_mask=query_mask, key_mask=key_mask, causal=True, query_offset=2)
    expected = (
        query_mask[:, :, None]
        & key_mask.astype(bool)[:, None, :]
        & visible(dict(causal=True), np.arange(3) + 2, np.arange(5))
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(dense.dense(3, 5))[:, 0], expected)


def test_per_example_prefix_segments_and_mask_mod_in_the_dense_form():
    prefix = np.array([2, 5], "int32")
    segments = np.array([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2, 2]], "int32")

    def mask_mod(batch, head, q_idx, k_idx):
        return ops.not_equal((q_idx + 2 * k_idx + head + batch) % 3, 0)

    mask = AttentionMask(
        causal=True,
        prefix_length=prefix,
        query_segment_ids=segments,
        key_segment_ids=segments,
        mask_mod=mask_mod,
    )
    dense = ops.convert_to_numpy(mask.dense(7, 7, batch_size=2, heads=3))
    q, k = np.arange(7)[:, None], np.arange(7)[None, :]
    b = np.arange(2)[:, None, None, None]
    h = np.arange(3)[None, :, None, None]
    expected = (
        ((k <= q) | (k < prefix[:, None, None, None]))
        & (segments[:, None, :, None] == segments[:, None, None, :])
        & ((q + 2 * k + h + b) % 3 != 0)
    )
    np.testing.assert_array_equal(np.broadcast_to(dense, expected.shape), expected)
    with pytest.raises(ValueError, match="needs `batch_size` and `heads`"):
        mask.dense(7, 7)


@pytest.mark.parametrize("packed", [True, False], ids=["packed documents", "unsorted ids"])
def test_the_tile_plan_of_segment_ids_is_sound_and_tight_for_packed_documents(packed):
    """A tile is full when its rows and keys hold one and the same id in every
    example, skipped when no id is shared; sound for any ids, exact for
    packed documents (ids that never decrease)."""
    from keras_attention.ops import tile_plan
    from tests.ops.kernel_contract_test import exact_tile_kinds

    rng = np.random.default_rng(3)
    length, block = 29, 4
    if packed:
        ids = np.sort(rng.integers(0, 6, size=(2, length)), axis=1)
    else:
        ids = rng.integers(0, 4, size=(2, length))
    mask = AttentionMask(query_segment_ids=ids, key_segment_ids=ids)
    got = ops.convert_to_numpy(tile_plan(mask, length, block_size=block).tiles())
    exact = exact_tile_kinds((ids[:, :, None] == ids[:, None, :])[:, None], block, block)
    assert not np.any((got == 2) & (exact != 2)) and not np.any((got == 0) & (exact != 0))
    if packed:
        np.testing.assert_array_equal(got, exact)
