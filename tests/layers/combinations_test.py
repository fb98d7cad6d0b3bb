"""MultiHeadAttention with its options drawn together, against float64 NumPy.

One property: a kernel (forced or chosen) x every spelling of a mask (bool and
float, all-False rows, left and right padding) x causal x sliding window x
grouped heads x gate x attention axes x (no cache | a prefill then single
steps through a cache) x (no weights | all | selected heads and rows) x dtype
x mode (TF eager, tf.function, XLA; JAX eager, jax.jit). Every weight and
bias is drawn at random: zero biases hide the masked-row contract. The
reference below is written from the definitions, not from our ops.

CI runs a fixed, derandomised slice per backend (`ci` profile); set
`KERAS_ATTENTION_HYPOTHESIS=long` for many more examples.
"""

import os
from unittest import mock

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attention import MultiHeadAttention
from keras_attention.layers import multi_head_attention as mha_module
from keras_attention.layers.machinery import kernel_selector
from keras_attention.layers.machinery.kernel_selector import Kernel
from keras_attention.ops import dense_attention
from tests.attention_reference import SOFT_CAP
from tests.attention_reference import mask_mod
from tests.attention_reference import positional
from tests.attention_reference import reference
from tests.attention_reference import score_mod

# Every layer compiled on each backend (jax.jit on JAX): `make test` runs it on both.
pytestmark = pytest.mark.both_backends

BACKEND = keras.backend.backend()
MODES = {"tensorflow": ("eager", "function", "xla"), "jax": ("eager", "jit")}[BACKEND]
TOLERANCE = {"float32": 2e-4, "float16": 2e-2, "bfloat16": 8e-2}

# About 40 s on TensorFlow and 60 s on JAX (eager JAX dispatches slowly) on
# CI's 2 cores.
settings.register_profile(
    "ci",
    max_examples={"tensorflow": 150, "jax": 60}[BACKEND],
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("KERAS_ATTENTION_HYPOTHESIS", "ci")

MASKS = (
    "none",
    "key_left_padding",
    "key_right_padding",
    "query_padding",
    "pair_bool",
    "pair_float",
    "pair_2d",
    "key_as_attention_mask",
    "query_as_attention_mask",
    "per_head",
    "all_false_query_row",
    "all_false_value_mask",
    "causal_left_padding",
)


MODIFIERS = (None, None, None, "soft_cap", "alibi", "sinks", "score_mod", "all")

# #37's projections: rotary (each scaling, partial), QK-norm, the query scale
# and biases on some projections only. Small wavelengths, so that positions
# 0..8 turn the features visibly, and a trained length that puts these head
# sizes' frequencies in every band of YaRN and Llama 3.
ROTARY = {
    "plain": {"max_wavelength": 100.0},
    "linear": {"max_wavelength": 100.0, "scaling": "linear", "scaling_factor": 2.0},
    "dynamic": {"max_wavelength": 100.0, "scaling": "dynamic", "scaling_factor": 3.0},
    "yarn": {
        "max_wavelength": 100.0,
        "scaling": "yarn",
        "scaling_factor": 4.0,
        "original_max_length": 16,
    },
    "llama3": {
        "max_wavelength": 100.0,
        "scaling": "llama3",
        "scaling_factor": 8.0,
        "original_max_length": 16,
    },
    "partial": {"max_wavelength": 100.0, "rotary_fraction": 0.5},
    "interleaved": {"max_wavelength": 100.0, "interleaved": True},
}
QK_NORM_EPSILON = 1e-3


# ------------------------------------------------------------------- cases
@st.composite
def cases(draw):
    case = dict(
        kernel=draw(st.sampled_from(("auto", "blockwise", "materialised", "fused"))),
        heads=draw(st.sampled_from(((2, 2), (4, 2), (4, 1), (3, 3)))),
        key_dim=draw(st.sampled_from((2, 4))),
        gate=draw(st.booleans()),
        dtype=draw(st.sampled_from(("float32", "float16", "bfloat16"))),
        mode=draw(st.sampled_from(MODES)),
        batch=draw(st.integers(1, 2)),
        block_size=draw(st.integers(2, 4)),
        seed=draw(st.integers(0, 2**16)),
    )
    if case["kernel"] == "fused" and BACKEND == "jax":
        # The fused kernel is faked on this CPU: JAX's CPU dot product has no
        # half-precision inputs with float32 accumulation (a GPU's has).
        case["dtype"] = "float32"
    layout = draw(st.sampled_from(("sequence", "sequence", "sequence", "image", "batch_axis")))
    case["layout"] = layout
    case["cache"] = layout == "sequence" and draw(st.booleans())
    case["weights"] = draw(
        st.sampled_from(("none", "all", "selected") if layout == "sequence" else ("none", "all"))
    )
    positional_rules = layout == "sequence"
    case["causal"] = positional_rules and draw(st.booleans())
    case["window"] = draw(st.sampled_from((None, 1, 2, 3))) if positional_rules else None
    if layout == "sequence":
        case["query_length"] = draw(st.integers(1, 7))
        self_attention = case["cache"] or draw(st.booleans())
        case["key_length"] = case["query_length"] if self_attention else draw(st.integers(1, 7))
        case["self_attention"] = self_attention
        masks = (
            (
                "none",
                "key_left_padding",
                "key_right_padding",
                "causal_left_padding",
                "all_false_value_mask",
            )
            if case["cache"]
            else MASKS
        )
    else:
        case["query_length"] = case["key_length"] = None
        case["self_attention"] = draw(st.booleans())
        masks = ("none", "key_right_padding", "query_padding", "pair_bool", "all_false_query_row")
    case["mask"] = draw(st.sampled_from(masks))
    if case["cache"]:
        length = case["query_length"]
        case["prefill"] = draw(st.integers(1, length))
        case["extra_slots"] = draw(st.integers(0, 2))
    case["modifier"] = draw(st.sampled_from(MODIFIERS))
    # The mask rules of #36: sink tokens beside a window, a `mask_mod`, packed
    # documents and a prefix length per example (through a cache too: every
    # rule is on absolute positions).
    rules = ("none",)
    if layout == "sequence":
        rules += ("none", "sink_tokens", "mask_mod", "segments", "prefix")
    case["rule"] = draw(st.sampled_from(rules))
    if case["rule"] == "sink_tokens":
        case["window"] = case["window"] or 1
        case["sink_tokens"] = draw(st.integers(1, 3))
    rotary = (None,)
    if layout == "sequence":
        rotary += (None,) + tuple(
            r for r in ROTARY if r not in ("partial", "dynamic") or case["key_dim"] == 4
        )
    case["rotary"] = draw(st.sampled_from(rotary))
    case["qk_norm"] = draw(st.booleans())
    case["query_scale"] = draw(st.sampled_from((None, None, 0.7)))
    case["use_bias"] = draw(st.sampled_from((True, True, False, ("query", "key", "value"))))
    # #38: a head mask per head or per example, 0/1 or soft (the cache path
    # has its own test in head_mask_test.py).
    case["head_mask"] = None
    if not case["cache"]:
        case["head_mask"] = draw(st.sampled_from((None, None, "per_head", "per_example")))
    return case


def _projection(case):
    """The reference's `projection` of a case."""
    return {
        "rotary": ROTARY.get(case["rotary"]),
        "qk_norm": QK_NORM_EPSILON if case["qk_norm"] else None,
        "query_scale": case["query_scale"],
        "use_bias": case["use_bias"],
    }


def _document_positions(ids):
    """Each token's position inside its document (packed sequences restart
    their rotary positions per document)."""
    positions = np.zeros(ids.shape, "int32")
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            positions[b, t] = positions[b, t - 1] + 1 if ids[b, t] == ids[b, t - 1] else 0
    return positions


def _shapes(case, rng):
    """Inputs and their flat `(B', T, F)` views for the reference."""
    batch, features = case["batch"], 6
    if case["layout"] == "sequence":
        q_shape = (batch, case["query_length"], features)
        k_shape = (batch, case["key_length"], features)
        axes = None
    elif case["layout"] == "image":  # (B, 2, 3, F), attention over the pixels
        q_shape = k_shape = (batch, 2, 3, features)
        if not case["self_attention"]:
            k_shape = (batch, 3, 2, features)
        axes = (1, 2)
    else:  # (B, 2, T, F), attention over axis 2, axis 1 joins the batch
        q_shape, k_shape = (batch, 2, 3, features), (batch, 2, 4, features)
        if case["self_attention"]:
            k_shape = q_shape
        axes = (2,)
    query = rng.normal(size=q_shape)
    key_value = query if case["self_attention"] else rng.normal(size=k_shape)
    return query, key_value, axes


def _flat(x, layout):
    """`(B, ..., F)` -> `(B', T, F)` as the layer flattens (and masks)."""
    if layout == "sequence":
        return x
    if layout == "image":
        return x.reshape(x.shape[0], -1, *x.shape[3:])
    return x.reshape(-1, *x.shape[2:])


def _masks(case, rng, q_len, k_len, batch, num_heads):
    """`(call kwargs, allowed (B, H, Tq, Tk) over flat positions)`."""
    kind = case["mask"]
    allowed = np.ones((batch, num_heads, q_len, k_len), bool)
    kwargs = {}
    lengths = rng.integers(0, k_len + 1, size=batch)
    if kind == "key_left_padding" or kind == "causal_left_padding":
        valid = np.arange(k_len)[None] >= (k_len - np.maximum(lengths, 1))[:, None]
        kwargs["value_mask"] = valid
        allowed &= valid[:, None, None, :]
    elif kind == "key_right_padding":
        valid = np.arange(k_len)[None] < lengths[:, None]
        kwargs["value_mask"] = valid.astype("float32")  # 0/1 floats count too
        allowed &= valid[:, None, None, :]
    elif kind == "all_false_value_mask":
        kwargs["value_mask"] = np.zeros((batch, k_len), bool)
        allowed[:] = False
    elif kind in ("query_padding", "all_false_query_row"):
        valid = rng.random((batch, q_len)) > 0.3
        if kind == "all_false_query_row":
            valid = np.ones((batch, q_len), bool)
            valid[0, rng.integers(q_len)] = False
        kwargs["query_mask"] = valid
        allowed &= valid[:, None, :, None]
    elif kind in ("pair_bool", "pair_float", "pair_2d"):
        pair = rng.random((batch, q_len, k_len)) > 0.4
        pair[0, rng.integers(q_len)] = False  # one row with nothing to see
        if kind == "pair_2d":
            pair = pair[:1]
            kwargs["attention_mask"] = pair[0]
        else:
            kwargs["attention_mask"] = pair.astype("float32") if kind == "pair_float" else pair
        allowed &= pair[:, None]
    elif kind == "key_as_attention_mask":  # (B, 1, Tk): a key mask
        keys = rng.random((batch, 1, k_len)) > 0.3
        kwargs["attention_mask"] = keys
        allowed &= keys[:, None]
    elif kind == "query_as_attention_mask":  # (B, Tq, 1): a query mask
        rows = rng.random((batch, q_len, 1)) > 0.3
        kwargs["attention_mask"] = rows
        allowed &= rows[:, None]
    elif kind == "per_head":
        pair = rng.random((batch, num_heads, q_len, k_len)) > 0.4
        kwargs["attention_mask"] = pair
        allowed &= pair
    return kwargs, allowed


def _layout_masks(case, kwargs, q_shape, k_shape):
    """The flat masks of `_masks` reshaped to the inputs' own axes."""
    if case["layout"] == "sequence":
        return kwargs
    shaped = {}
    for name, mask in kwargs.items():
        if name == "query_mask":
            shaped[name] = mask.reshape(q_shape[:-1])
        elif name == "value_mask":
            shaped[name] = mask.reshape(k_shape[:-1])
        else:  # (B', Tq, Tk) -> (B, <q axes>, <k axes>) or (B, N, Tq, Tk)
            if case["layout"] == "image":
                shaped[name] = mask.reshape(q_shape[:1] + q_shape[1:3] + k_shape[1:3])
            else:
                shaped[name] = mask.reshape(q_shape[:2] + mask.shape[1:])
    return shaped


# -------------------------------------------------------------- running
def _runner(mode):
    """`run(function, *tensors)` in eager mode, tf.function, XLA or jax.jit."""
    if mode == "eager":
        return lambda fn, *args: fn(*args)
    if BACKEND == "jax":
        import jax

        return lambda fn, *args: jax.jit(fn)(*args)
    import tensorflow as tf

    cache = {}

    def run(fn, *args):
        if fn not in cache:
            cache[fn] = tf.function(fn, jit_compile=mode == "xla")
        return cache[fn](*args)

    return run


def _spied(fused):
    """Patches that record every kernel the layer runs (and fake a fused
    kernel's presence for the `fused` case)."""
    ran = []

    def spy(kernel, original):
        def wrapped(*args, **kwargs):
            if kernel is Kernel.FUSED and kwargs.get("flash_attention") is False:
                ran.append(Kernel.COMPOSITE)
            else:
                ran.append(kernel)
            return original(*args, **kwargs)

        return wrapped

    patches = [
        mock.patch.object(
            dense_attention, "dense_attention", spy(Kernel.DENSE, dense_attention.dense_attention)
        ),
        mock.patch.object(
            dense_attention,
            "shifted_attention",
            spy(Kernel.SHIFTED, dense_attention.shifted_attention),
        ),
        mock.patch.object(
            dense_attention,
            "composite_attention",
            spy(Kernel.FUSED, dense_attention.composite_attention),
        ),
        mock.patch.object(
            mha_module,
            "memory_efficient_attention",
            spy(Kernel.BLOCKWISE, mha_module.memory_efficient_attention),
        ),
    ]
    if fused:
        patches.append(mock.patch.object(kernel_selector, "fused_kernel_available", lambda: True))
    return ran, patches


def _expected_kernels(case):
    """The kernels each forced choice may run (an independent statement of
    what the options mean, not a call of the selector)."""
    full_weights = case["weights"] == "all"
    if full_weights:
        return {Kernel.DENSE}
    # TensorFlow's XLA runs our normalise-last kernel, else Keras' composite,
    # which cannot change the logits: ours then (and never the fused one).
    materialised = {Kernel.SHIFTED} if case["mode"] == "xla" else {Kernel.COMPOSITE}
    if case["modifier"] is not None and case["mode"] != "xla":
        materialised = {Kernel.DENSE}
    if case["kernel"] == "blockwise":
        return {Kernel.BLOCKWISE}
    if case["kernel"] == "fused":
        return materialised if case["modifier"] is not None else {Kernel.FUSED}
    return materialised  # "materialised", and "auto" at these tiny lengths


def _options(case):
    heads, kv_heads = case["heads"]
    options = dict(
        num_heads=heads,
        key_dim=case["key_dim"],
        use_gate=case["gate"],
        num_key_value_heads=kv_heads,
        sliding_window=case["window"],
        dtype=case["dtype"],
        block_size=case["block_size"],
    )
    if case["layout"] != "sequence":
        options["attention_axes"] = _shapes(case, np.random.default_rng(0))[2]
    if case["kernel"] == "blockwise":
        options["memory_efficient"] = True
    elif case["kernel"] == "materialised":
        options["memory_efficient"] = False
    if case["rule"] == "sink_tokens":
        options["sink_tokens"] = case["sink_tokens"]
    if case["rule"] == "mask_mod":
        options["mask_mod"] = mask_mod
    modifier = case["modifier"]
    if modifier in ("soft_cap", "all"):
        options["logit_soft_cap"] = SOFT_CAP
    if modifier in ("alibi", "all"):
        options["alibi"] = True
    if modifier in ("sinks", "all"):
        options["attention_sinks"] = True
    if modifier in ("score_mod", "all"):
        options["score_mod"] = score_mod
    if case["rotary"] is not None:
        options["rotary"] = dict(ROTARY[case["rotary"]])
    if case["qk_norm"]:
        options.update(qk_norm=True, qk_norm_epsilon=QK_NORM_EPSILON)
    options.update(query_scale=case["query_scale"], use_bias=case["use_bias"])
    return options


def _randomise(layer, rng):
    """Every weight and bias drawn at random (zero biases hide bugs)."""
    layer.set_weights([rng.normal(scale=0.5, size=w.shape) for w in layer.get_weights()])
    return {
        w.path.split("/", 1)[1]: keras.ops.convert_to_numpy(w.value).astype("float64")
        for w in layer.weights
    }


def check(case):
    rng = np.random.default_rng(case["seed"])
    heads, kv_heads = case["heads"]
    dtype, tol = case["dtype"], TOLERANCE[case["dtype"]]
    query, key_value, _ = _shapes(case, rng)
    layer = MultiHeadAttention(**_options(case))
    layer.build(query.shape, key_value.shape)
    weights = _randomise(layer, rng)
    flat_q, flat_kv = _flat(query, case["layout"]), _flat(key_value, case["layout"])
    batch, q_len, k_len = flat_q.shape[0], flat_q.shape[1], flat_kv.shape[1]
    run = _runner(case["mode"])
    ran, patches = _spied(case["kernel"] == "fused")

    def cast(x):
        return keras.ops.convert_to_tensor(np.asarray(x, dtype))

    select = {}
    if case["weights"] == "selected":
        chosen = sorted(rng.choice(heads, size=rng.integers(1, heads + 1), replace=False))
        select = dict(attention_scores_heads=[int(h) for h in chosen])
        if not case["cache"]:  # rows too (a cache's steps have one row each)
            start = int(rng.integers(0, case["query_length"]))
            select["attention_scores_query_range"] = (
                start,
                int(rng.integers(start + 1, case["query_length"] + 1)),
            )
    returns_weights = case["weights"] != "none"
    for patch in patches:
        patch.start()
    try:
        if case["cache"]:
            # Weights are compared step by step inside.
            outputs, expected = _run_cache(case, layer, weights, flat_q, rng, run, cast, select)
            returns_weights = False
        else:
            mask_kwargs, allowed = _masks(case, rng, q_len, k_len, batch, heads)
            if case["self_attention"] and "query_mask" in mask_kwargs:
                # One input: the keys are the queries, so the layer masks them
                # with the same mask, as Keras' mask of a self-attention input
                # (MultiHeadAttention's documented `value_mask` default).
                allowed &= mask_kwargs["query_mask"][:, None, None, :]
            rule_kwargs, prefix = _rule_inputs(case, rng, batch, q_len, k_len)
            query_positions = key_positions = None
            if "segment_ids" in rule_kwargs:
                query_ids = rule_kwargs["segment_ids"]
                key_ids = rule_kwargs.get("key_segment_ids", query_ids)
                allowed &= query_ids[:, None, :, None] == key_ids[:, None, None, :]
                if case["rotary"] is not None:
                    query_positions = _document_positions(query_ids)
                    rule_kwargs["position_ids"] = query_positions
                    if case["self_attention"]:  # the keys are the queries
                        key_positions = query_positions
                    else:  # cross-attention: the keys' own, restarting per document
                        key_positions = _document_positions(key_ids)
                        rule_kwargs["key_position_ids"] = key_positions
            positions = positional(
                np.arange(q_len),
                np.arange(k_len),
                case["causal"] or prefix is not None,
                case["window"],
                prefix=prefix,
                sink_tokens=case.get("sink_tokens"),
                mask_mod=case["rule"] == "mask_mod",
                batch=batch,
                heads=heads,
            )
            allowed = allowed & positions
            head_mask = _head_mask(case, rng, query.shape[0], heads)
            expected, expected_scores = reference(
                weights,
                _cast_like(flat_q, dtype),
                _cast_like(flat_kv, dtype),
                allowed,
                heads,
                kv_heads,
                case["gate"],
                case["modifier"],
                projection=_projection(case),
                query_positions=query_positions,
                key_positions=key_positions,
                # The layout folds other axes into the batch, batch-major.
                head_mask=(
                    head_mask
                    if head_mask is None or head_mask.ndim == 1
                    else np.repeat(head_mask, batch // head_mask.shape[0], axis=0)
                ),
            )
            call_masks = _layout_masks(case, mask_kwargs, query.shape, key_value.shape)
            call_masks.update(rule_kwargs)
            if head_mask is not None:
                call_masks["head_mask"] = head_mask
            names = sorted(call_masks)
            value = None if case["self_attention"] else cast(key_value)

            def fn(q, *masks):
                kw = dict(zip(names, masks, strict=True))
                args = (q,) if value is None else (q, value)
                return layer(
                    *args,
                    use_causal_mask=case["causal"],
                    return_attention_scores=returns_weights,
                    **select,
                    **kw,
                )

            result = run(
                fn, cast(query), *[keras.ops.convert_to_tensor(call_masks[n]) for n in names]
            )
            outputs, scores = result if returns_weights else (result, None)
            outputs = _flat(keras.ops.convert_to_numpy(outputs).astype("float64"), case["layout"])
            if scores is not None:
                scores = keras.ops.convert_to_numpy(scores).astype("float64")
                if case["layout"] != "sequence":
                    scores = _flat_scores(scores, case)
    finally:
        for patch in reversed(patches):
            patch.stop()
    scale = 1.0 + np.abs(expected).max()
    np.testing.assert_allclose(outputs, expected, atol=tol * scale, rtol=tol)
    assert np.all(np.isfinite(outputs))
    if returns_weights:
        if select:
            r0, r1 = select["attention_scores_query_range"]
            expected_scores = expected_scores[:, select["attention_scores_heads"]][:, :, r0:r1]
        np.testing.assert_allclose(scores, expected_scores, atol=tol, rtol=tol)
    # The kernel that ran is the one the options ask for (proof, not trust).
    assert ran and set(ran) <= _expected_kernels(case), (ran, case)


def _head_mask(case, rng, batch, heads):
    """`(H,)` 0/1 or `(B, H)` soft values in quarters (exact in half
    precision), or None."""
    kind = case.get("head_mask")  # hand-made cases (the rotary pins) have none
    if kind is None:
        return None
    if kind == "per_head":
        return rng.integers(0, 2, size=(heads,)).astype("float32")
    return rng.integers(0, 5, size=(batch, heads)).astype("float32") / 4


def _rule_inputs(case, rng, batch, q_len, k_len):
    """`(call kwargs, prefix or None)` of the call-level rules: sorted
    segment ids (packed documents), or one prefix length per example."""
    if case["rule"] == "segments":
        query_ids = np.sort(rng.integers(0, 3, size=(batch, q_len)), axis=1).astype("int32")
        query_ids[:, q_len // 2 :] += 3  # at least two documents from 2 tokens on
        kwargs = {"segment_ids": query_ids}
        if not case["self_attention"]:
            key_ids = np.sort(rng.integers(0, 3, size=(batch, k_len)), axis=1).astype("int32")
            kwargs["key_segment_ids"] = key_ids
        return kwargs, None
    if case["rule"] == "prefix":
        prefix = rng.integers(0, k_len + 1, size=batch).astype("int32")
        return {"prefix_length": prefix}, prefix
    return {}, None


def _cast_like(x, dtype):
    """The inputs as the layer sees them (rounded to its dtype)."""
    return np.asarray(np.asarray(x, dtype), np.float64)


def _flat_scores(scores, case):
    """Keras' `(B, <batch axes>, H, <q axes>, <k axes>)` -> `(B', H, Tq, Tk)`."""
    if case["layout"] == "image":
        b, h = scores.shape[:2]
        return scores.reshape(b, h, 6, -1)
    return scores.reshape(-1, *scores.shape[2:])


def _run_cache(case, layer, weights, x, rng, run, cast, select):
    """A prefill at index 0, then one step at a time, against the reference
    of the same queries at their absolute positions."""
    heads, kv_heads = case["heads"]
    batch, length = x.shape[0], x.shape[1]
    max_length = length + case["extra_slots"]
    mask_kwargs, allowed = _masks(case, rng, length, length, batch, heads)
    # Cache slots past the input are never written: hidden from every query.
    key_mask = None
    if "value_mask" in mask_kwargs:
        key_mask = np.zeros((batch, max_length), "float32")
        key_mask[:, :length] = mask_kwargs["value_mask"]
    cache = cast(np.zeros((batch, 2, max_length, kv_heads, case["key_dim"])))
    xq = _cast_like(x, case["dtype"])
    outputs, expected = [], []
    returns_weights = case["weights"] != "none"
    chunks = [(0, case["prefill"])] + [(t, t + 1) for t in range(case["prefill"], length)]
    rule_kwargs, prefix = _rule_inputs(case, rng, batch, length, length)
    causal = case["causal"] or prefix is not None  # a prefix implies the causal rule
    ids = rule_kwargs.get("segment_ids")
    positions = None
    if ids is not None:  # the cache's keys: ids for every slot (unwritten ones stay hidden)
        key_ids = np.concatenate([ids, np.repeat(ids[:, -1:], max_length - length, 1)], 1)
        if case["rotary"] is not None:  # rotary positions restart per document
            positions = _document_positions(ids)
            key_positions = np.concatenate(
                [positions, np.zeros((batch, max_length - length), "int32")], 1
            )

    names = ["value_mask"] if key_mask is not None else []
    names += ["prefix_length"] if prefix is not None else []
    names += ["segment_ids", "key_segment_ids"] if ids is not None else []
    names += ["position_ids"] if positions is not None else []

    def fn(q, cache, index, *extra):
        kw = dict(zip(names, extra, strict=True))
        return layer(
            q,
            cache=cache,
            cache_update_index=index,
            use_causal_mask=case["causal"],
            return_attention_scores=returns_weights,
            **select,
            **kw,
        )

    for start, stop in chunks:
        extra = () if key_mask is None else (key_mask,)
        if prefix is not None:
            extra += (prefix,)
        if ids is not None:
            extra += (ids[:, start:stop], key_ids)
        if positions is not None:
            extra += (positions[:, start:stop],)
        result = run(
            fn,
            cast(x[:, start:stop]),
            cache,
            keras.ops.convert_to_tensor(np.int32(start)),
            *[keras.ops.convert_to_tensor(e) for e in extra],
        )
        out, cache = result[0], result[-1]
        # Query rows at absolute positions start..stop-1 see written keys only.
        seen = positional(
            np.arange(start, stop),
            np.arange(max_length),
            causal,
            case["window"],
            key_length=stop,  # unwritten slots: hidden (a prefix sees forward)
            prefix=prefix,
            sink_tokens=case.get("sink_tokens"),
            mask_mod=case["rule"] == "mask_mod",
            batch=batch,
            heads=heads,
        )
        seen = seen & np.ones((batch, heads, 1, 1), bool)
        if key_mask is not None:
            seen = seen & (key_mask[:, None, None, :] > 0)
        if ids is not None:
            seen = seen & (ids[:, None, start:stop, None] == key_ids[:, None, None, :])
        padded = np.zeros((batch, max_length, x.shape[-1]))
        padded[:, :length] = xq
        want, want_scores = reference(
            weights,
            xq[:, start:stop],
            padded,
            seen,
            heads,
            kv_heads,
            case["gate"],
            case["modifier"],
            rows=np.arange(start, stop),
            projection=_projection(case),
            query_positions=None if positions is None else positions[:, start:stop],
            key_positions=None if positions is None else key_positions,
        )
        outputs.append(keras.ops.convert_to_numpy(out).astype("float64"))
        expected.append(want)
        if returns_weights:
            if select:
                want_scores = want_scores[:, select["attention_scores_heads"]]
            np.testing.assert_allclose(
                keras.ops.convert_to_numpy(result[1]).astype("float64"),
                want_scores,
                atol=TOLERANCE[case["dtype"]],
                rtol=TOLERANCE[case["dtype"]],
            )
    return np.concatenate(outputs, 1), np.concatenate(expected, 1)


@settings.get_profile(PROFILE)
@given(cases())
def test_options_drawn_together_match_numpy(case):
    check(case)


@pytest.mark.parametrize("cache", [False, True])
def test_rotary_positions_restart_per_document(cache):
    """Packed documents with rotary positions restarting per document (#37),
    every projection option on, through a prefill and cached steps too: a
    fixed case, as the drawn slice rarely pairs segments with rotary."""
    case = dict(
        kernel="blockwise",
        heads=(4, 2),
        key_dim=4,
        gate=True,
        dtype="float32",
        mode="eager",
        batch=2,
        block_size=3,
        seed=7,
        layout="sequence",
        cache=cache,
        weights="none",
        causal=True,
        window=None,
        query_length=7,
        key_length=7,
        self_attention=True,
        mask="none",
        prefill=3,
        extra_slots=1,
        modifier="soft_cap",
        rule="segments",
        rotary="yarn",
        qk_norm=True,
        query_scale=0.7,
        use_bias=("query", "key", "value"),
    )
    check(case)


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_issue_reproducers(memory_efficient):
    """The two reproducers of the one-core issue, with random biases."""
    rng = np.random.default_rng(0)
    x = rng.random((1, 6, 8)).astype("float32")
    layer = MultiHeadAttention(
        2,
        4,
        sliding_window=2,
        memory_efficient=memory_efficient,
        block_size=2,
        bias_initializer="random_normal",
    )
    full = np.asarray(layer(x, use_causal_mask=True))
    cache, steps = np.zeros((1, 2, 6, 2, 4), "float32"), []
    for t in range(6):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t, use_causal_mask=True)
        steps.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-6)
    rows = np.ones((1, 6, 1), bool)
    rows[0, 2] = False
    folded = np.asarray(layer(x, x, attention_mask=rows))
    spelled = np.asarray(layer(x, x, attention_mask=np.broadcast_to(rows, (1, 6, 6))))
    np.testing.assert_allclose(folded, spelled, atol=1e-6)
    np.testing.assert_allclose(
        folded[0, 2], keras.ops.convert_to_numpy(layer.output_dense.bias), atol=1e-6
    )


@pytest.mark.parametrize(
    "spelling, inputs",
    [
        ("layer(x)", "numpy"),
        ("layer(x, x)", "numpy"),
        ("layer(x, x, x)", "numpy"),
        ("layer(x, x)", "mixed_float16"),  # Keras casts each input on its own
        ("layer(x, x, x)", "functional"),
        ("cross", "numpy"),
        ("cross, read-only cache", "numpy"),
    ],
)
def test_rotary_keys_sit_at_the_stated_positions_in_every_spelling(spelling, inputs):
    """#49: the keys are the queries on one input or on the same tensor as
    query and value (Keras' `layer(x, x)`, whose NumPy inputs Keras turns
    into two tensors), and then take the queries' `position_ids` as they
    take their `segment_ids`; cross-attention's keys sit at their own
    `key_position_ids` (a read-only cache's at `precompute_key_value`'s).
    Against the float64 reference, documents restarting positions."""
    rng = np.random.default_rng(49)
    cross = spelling.startswith("cross")
    ids = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], "int32")
    key_ids = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], "int32") if cross else ids
    positions, key_positions = _document_positions(ids), _document_positions(key_ids)
    x = rng.normal(size=(2, 6, 6))
    y = rng.normal(size=(2, 5, 6)) if cross else x
    dtype = "float16" if inputs == "mixed_float16" else "float32"
    layer = MultiHeadAttention(
        num_heads=2,
        key_dim=4,
        rotary=dict(ROTARY["plain"]),
        dtype="mixed_float16" if inputs == "mixed_float16" else None,
    )
    layer.build(x.shape, y.shape)
    weights = _randomise(layer, rng)
    allowed = np.broadcast_to(
        ids[:, None, :, None] == key_ids[:, None, None, :], (2, 2, 6, 5 + (not cross))
    )
    expected, _ = reference(
        weights,
        _cast_like(x, dtype),
        _cast_like(y, dtype),
        allowed,
        2,
        2,
        False,
        projection={"rotary": ROTARY["plain"]},
        query_positions=positions,
        key_positions=key_positions,
    )
    q = x.astype("float32")
    rules = dict(position_ids=positions, segment_ids=ids)
    if inputs == "mixed_float16":
        q = keras.ops.convert_to_tensor(q)
    if spelling == "cross":
        out = layer(
            q, y.astype("float32"), key_position_ids=key_positions, key_segment_ids=key_ids, **rules
        )
    elif spelling == "cross, read-only cache":
        cache = layer.precompute_key_value(y.astype("float32"), key_position_ids=key_positions)
        out, _ = layer(q, cache=cache, key_segment_ids=key_ids, **rules)
    elif inputs == "functional":
        tokens = keras.Input((6, 6))
        documents, places = keras.Input((6,), dtype="int32"), keras.Input((6,), dtype="int32")
        model = keras.Model(
            [tokens, documents, places],
            layer(tokens, tokens, tokens, segment_ids=documents, position_ids=places),
        )
        out = model([q, ids, positions])
    else:
        out = layer(*(q,) * spelling.count("x"), **rules)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out).astype("float64"),
        expected,
        atol=TOLERANCE[dtype] * (1 + np.abs(expected).max()),
        rtol=TOLERANCE[dtype],
    )
