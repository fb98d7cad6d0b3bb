"""A multi-head call's checks that need no computation: its input shapes,
call-level rules (segment ids, prefix), rotary positions, weight selection
and tile plan. Each runs on eager and symbolic inputs alike, so a functional
model gets the error a call would, and names the layer (`layer._error`)."""

import numbers

import keras
import numpy as np
from keras import ops

from keras_attention import validation
from keras_attention.layers.machinery import scores_selection
from keras_attention.layers.machinery import utils
from keras_attention.ops import tiling


def check_shapes(layer, query_shape, value_shape, key_shape):
    """Keras' rules, with errors that name the layer and the shapes."""
    for name, shape in (
        ("query_shape", query_shape),
        ("value_shape", value_shape),
        ("key_shape", key_shape),
    ):
        if (
            shape is not None
            and not isinstance(shape, (tuple, list))
            and not (hasattr(shape, "__len__") and hasattr(shape, "__getitem__"))
        ):
            raise ValueError(
                layer._error(
                    f"`{name}` must be a shape (a tuple of dimensions). Received: {name}={shape!r}"
                )
            )
    query_shape, value_shape = tuple(query_shape), tuple(value_shape)
    key_shape = value_shape if key_shape is None else tuple(key_shape)
    if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
        raise ValueError(
            layer._error(
                "All dimensions of `value` and `key`, except the last one, "
                f"must be equal. Received: value_shape={value_shape} and "
                f"key_shape={key_shape}"
            )
        )
    for name, shape in (("query", query_shape), ("value", value_shape)):
        if len(shape) < 3:
            raise ValueError(
                layer._error(
                    f"`{name}` must have rank >= 3 (batch, time..., "
                    f"features). Received: {name} with shape {shape}"
                )
            )
    if len(value_shape) != len(query_shape):
        raise ValueError(
            layer._error(
                "`query` and `value` must have the same rank, and all "
                "dimensions except the attention axes and the last one "
                f"must be equal. Received: query_shape={query_shape} and "
                f"value_shape={value_shape}"
            )
        )
    layout = layer._layout(len(query_shape))
    for axis in layout.batch_axes:
        q, v = query_shape[axis], value_shape[axis]
        if q is not None and v is not None and q != v:
            raise ValueError(
                layer._error(
                    "All dimensions of `query` and `value` outside the "
                    "attention axes, except the last one, must be equal. "
                    f"Received: query_shape={query_shape} and "
                    f"value_shape={value_shape}"
                )
            )
    built = getattr(layer, "_built_feature_dims", None)
    if built is not None:
        for name, shape, dim in zip(
            ("query", "value", "key"), (query_shape, value_shape, key_shape), built, strict=True
        ):
            if shape[-1] is not None and shape[-1] != dim:
                raise ValueError(
                    layer._error(
                        f"`{name}` has {shape[-1]} features but the layer "
                        f"was built for {dim}. Received: {name} with shape "
                        f"{shape}"
                    )
                )
    return layout


def rule_changes(
    layer, layout, query_shape, key_length, self_attention, segment_ids, key_segment_ids, prefix
):
    """The `AttentionMask` fields of `segment_ids`, `key_segment_ids` and
    `prefix_length`, checked (also on symbolic inputs). `self_attention`:
    whether the keys are the queries (`BaseAttention._keys_are_queries`,
    False with a cache), the one case where `key_segment_ids` default to
    `segment_ids`."""
    if segment_ids is None and key_segment_ids is None and prefix is None:
        return {}
    if layout is not None and not getattr(layout, "trivial", True):
        raise ValueError(
            layer._error(
                "`segment_ids` and `prefix_length` are positions along one "
                "sequence axis: they need rank-3 inputs (batch, time, features). "
                f"Received: query with shape {query_shape}"
            )
        )
    batch, length = query_shape[0], query_shape[1]
    changes = {}
    if key_segment_ids is not None and segment_ids is None:
        raise ValueError(
            layer._error(
                "`key_segment_ids` needs `segment_ids` (the queries'). Received: segment_ids=None"
            )
        )
    if segment_ids is not None:
        segment_ids = check_ids(layer, "segment_ids", segment_ids, (batch, length))
        if key_segment_ids is None:
            if not self_attention:
                raise ValueError(
                    layer._error(
                        "`key_segment_ids` are needed when the keys are not "
                        "the queries (cross-attention or a cache); the keys "
                        "are the queries when the layer is called on one "
                        "input, or on the same tensor as query and value. "
                        f"Received: {length} queries, {key_length} keys, "
                        "key_segment_ids=None"
                    )
                )
            key_segment_ids = segment_ids
        key_segment_ids = check_ids(layer, "key_segment_ids", key_segment_ids, (batch, key_length))
        changes.update(query_segment_ids=segment_ids, key_segment_ids=key_segment_ids)
    if prefix is not None:
        changes.update(prefix_length=check_prefix(layer, prefix, batch), causal=True)
    return changes


def check_ids(layer, name, ids, expected):
    if isinstance(ids, (list, tuple)):
        ids = np.asarray(ids)
    layer._check_tensor(name, ids)
    shape = tuple(ids.shape)
    dtype = str(getattr(ids.dtype, "name", ids.dtype))
    fits = len(shape) == 2 and all(
        e is None or d is None or e == d for d, e in zip(shape, expected, strict=True)
    )
    if not fits or "int" not in dtype:
        raise ValueError(
            layer._error(
                f"`{name}` must be integers shaped (batch, length) = {expected}. "
                f"Received: {name} with shape {shape} and dtype {dtype}"
            )
        )
    return ids if isinstance(ids, keras.KerasTensor) else ops.convert_to_tensor(ids)


def check_prefix(layer, prefix, batch):
    if isinstance(prefix, numbers.Integral) and not isinstance(prefix, bool):
        if prefix < 0:
            raise ValueError(
                layer._error(f"`prefix_length` must be >= 0. Received: prefix_length={prefix}")
            )
        return int(prefix)
    if isinstance(prefix, (list, tuple)):
        prefix = np.asarray(prefix)
    if not hasattr(prefix, "shape") or "int" not in str(
        getattr(prefix.dtype, "name", prefix.dtype)
    ):
        raise TypeError(
            layer._error(
                "`prefix_length` must be an int or one int per example, shape "
                f"(batch,). Received: prefix_length={utils.describe(prefix)}"
            )
        )
    shape = tuple(prefix.shape)
    if shape == ():
        return check_prefix(layer, int(np.asarray(prefix)), batch)
    if len(shape) != 1 or None not in (shape[0], batch) and shape[0] != batch:
        raise ValueError(
            layer._error(
                f"`prefix_length` must be one int per example, shape ({batch},). "
                f"Received: prefix_length with shape {shape}"
            )
        )
    return prefix if isinstance(prefix, keras.KerasTensor) else ops.convert_to_tensor(prefix)


def check_position_ids(layer, position_ids, layout, query_shape, name="position_ids"):
    """`position_ids` (or `key_position_ids`, `name`) checked: `(B, T)`
    or `(T,)` integers, with `rotary`, on rank-3 inputs; returned as a
    tensor (`(1, T)` for `(T,)`), or None."""
    if layer.rotary is not None and layout is not None and not getattr(layout, "trivial", True):
        raise ValueError(
            layer._error(
                "`rotary` rotates by the position along one sequence axis: it "
                "needs rank-3 inputs (batch, time, features). Received: query "
                f"with shape {query_shape}"
            )
        )
    if position_ids is None:
        return None
    if layer.rotary is None:
        raise ValueError(
            layer._error(
                f"`{name}` are the rotary embedding's positions: the layer "
                f"has no `rotary`. Received: {name} with rotary=None"
            )
        )
    if isinstance(position_ids, (list, tuple)):
        position_ids = np.asarray(position_ids)
    shape = tuple(getattr(position_ids, "shape", ()))
    if len(shape) == 1:
        return check_ids(layer, name, position_ids[None, :], (1, query_shape[1]))
    return check_ids(layer, name, position_ids, (query_shape[0], query_shape[1]))


def rotary_positions(
    layer, position_ids, key_position_ids, layout, query_shape, key_shape, self_attention
):
    """`(query positions, key positions)` of a call without a cache,
    checked (also on symbolic inputs); None means `0 .. T - 1`.

    The keys take the queries' `position_ids` when they are the queries
    (`self_attention`, the rule `segment_ids` follow too); otherwise
    their own `key_position_ids`, which `position_ids` then need."""
    queries = check_position_ids(layer, position_ids, layout, query_shape)
    keys = check_position_ids(layer, key_position_ids, None, key_shape, "key_position_ids")
    if keys is None and queries is not None:
        if not self_attention:
            raise ValueError(
                layer._error(
                    "`key_position_ids` are needed when the keys are not the "
                    "queries (cross-attention): `position_ids` place the "
                    "queries only. The keys are the queries when the layer "
                    "is called on one input, or on the same tensor as query "
                    "and value. Received: position_ids with shape "
                    f"{tuple(queries.shape)}, key_position_ids=None, keys "
                    f"with shape {key_shape}"
                )
            )
        keys = queries
    return queries, keys


def refuse_cached_key_positions(layer, key_position_ids, cache_update_index):
    """With a cache the keys sit where they were written: `position_ids`
    place the keys a call writes (they are its queries), and
    `precompute_key_value(key_position_ids=...)` a read-only cache's."""
    if key_position_ids is None:
        return
    where = (
        "`precompute_key_value(..., key_position_ids=...)` rotates a read-only cache's keys"
        if cache_update_index is None
        else "`position_ids` rotate the keys this call writes (they are its queries)"
    )
    raise ValueError(
        layer._error(
            "`key_position_ids` are not taken with a `cache`: the cache holds "
            f"keys rotated where they were written; {where}. Received: "
            "key_position_ids with a cache"
        )
    )


def check_tile_plan(layer, plan, query_length=None, key_length=None):
    """`plan` if it is a `TilePlan` for these lengths (or None)."""
    if plan is not None and not isinstance(plan, tiling.TilePlan):
        raise TypeError(
            layer._error(
                "`tile_plan` must be a TilePlan (keras_attention.ops.tile_plan) or "
                f"None. Received: tile_plan={validation.describe(plan)}"
            )
        )
    if plan is not None and query_length is not None:
        plan.check(layer, query_length, key_length)
    return plan


def selection(layer, query, options):
    """The call's `ScoresSelection` (heads and rows of the weights to
    return), or None when it selects none."""
    heads, query_range = options.attention_scores_heads, options.attention_scores_query_range
    if heads is None and query_range is None:
        return None
    if not options.return_attention_scores:
        raise ValueError(
            layer._error(
                "`attention_scores_heads` / `attention_scores_query_range` "
                "select returned weights: pass return_attention_scores=True. "
                f"Received: attention_scores_heads={heads!r}, "
                f"attention_scores_query_range={query_range!r}"
            )
        )
    if hasattr(query, "shape") and len(query.shape) != 3:
        raise ValueError(
            layer._error(
                "selected attention scores need rank-3 inputs. Received: "
                f"query with shape {tuple(query.shape)}"
            )
        )
    selection = scores_selection.ScoresSelection(layer, heads, query_range)
    if hasattr(query, "shape"):
        selection.check_length(layer, query.shape[1])
    return selection
