"""Property-based fuzzing of every public layer with hostile inputs (issue 11).

Configurations x shapes (0 and 1 included) x masks (random, all-False rows,
all-False batch; on the attention layers also causal and random
`attention_mask`) x dtypes (float32, float16, bfloat16, mixed policies, int32
inputs) x NaN placement, on whichever backend runs the suite (`make test`
runs it on TensorFlow and on JAX), called eagerly and compiled (built from
symbolic inputs with an unknown batch, then `tf.function`, `tf.function(
jit_compile=True)` or `jax.jit`). Every call must either

- return outputs of the documented shape, finite unless a NaN went into an
  unmasked position (on the attention layers: finite in every row that
  neither holds nor, through the masks, sees a NaN), with masked query rows
  exactly zero and returned weights zero on masked rows and keys; or
- raise our `ValueError`/`TypeError` naming the class the user built, while
  building or tracing when compiled.

Any other exception (a backend's InvalidArgumentError, ZeroDivisionError,
...) fails the test. Shapes are drawn from a few values so JAX recompiles
little; `derandomize=True` keeps runs reproducible. Run with
`--hypothesis-show-statistics` to see the example count and timing.
"""

import collections

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_attention as ka
from tests.testing import PUBLIC_LAYERS
from tests.testing import to_numpy

# Every layer compiled on each backend (jax.jit on JAX): `make test` runs it on both.
pytestmark = pytest.mark.both_backends

# JAX compiles each eager op per shape and dtype: fewer examples keep it near
# 60 s on a loaded 2-core CPU (TensorFlow runs 300 in 12-16 s).
MAX_EXAMPLES = 300 if keras.backend.backend() == "tensorflow" else 150
EXAMPLES_RUN = []  # one entry per example, read by the closing check
# Compiled calls: tf.function (graph) and XLA on TensorFlow, jax.jit on JAX.
# Each example traces (and compiles) a fresh layer: 160 take 25-38 s on
# TensorFlow, 150 take ~46 s on JAX (2 cores, load average 4-8).
COMPILED_MODES = ["tf_function", "xla"] if keras.backend.backend() == "tensorflow" else ["jit"]
COMPILED_EXAMPLES = 160 if keras.backend.backend() == "tensorflow" else 150
COMPILED_RUN = []

# name -> factory(dtype); a name before "-" is the layer class, whose kind
# (PUBLIC_LAYERS) decides the inputs it takes. LAYERS: name -> (factory, kind).
FACTORIES = {
    "AdditiveAttention": lambda d: ka.AdditiveAttention(dtype=d),
    "LuongAttention": lambda d: ka.LuongAttention(score_mode="general", dtype=d),
    "LuongAttention-dot": lambda d: ka.LuongAttention(
        score_mode="dot", divide_by_sqrt_dim=True, dtype=d
    ),
    "LowRankAttention": lambda d: ka.LowRankAttention(rank=2, dtype=d),
    "MultiHeadAttention": lambda d: ka.MultiHeadAttention(2, 4, dtype=d),
    "MultiHeadAttention-blockwise": lambda d: ka.MultiHeadAttention(
        2, 4, num_key_value_heads=1, memory_efficient=True, block_size=2, dtype=d
    ),
    "SparseAttention": lambda d: ka.SparseAttention(
        2,
        4,
        block_size=2,
        window_blocks=1,
        global_blocks=0,
        random_blocks=1,
        seed=0,
        dtype=d,
    ),
    "PerformerAttention": lambda d: ka.PerformerAttention(2, 4, num_features=8, seed=0, dtype=d),
    "LinformerAttention": lambda d: ka.LinformerAttention(
        2, 4, projected_length=2, max_length=4, dtype=d
    ),
    "AttentionPooling": lambda d: ka.AttentionPooling(dtype=d),
    "SqueezeExcitation": lambda d: ka.SqueezeExcitation(ratio=2, dtype=d),
    "CBAM": lambda d: ka.CBAM(ratio=2, kernel_size=3, dtype=d),
    "TransformerEncoderBlock": lambda d: ka.TransformerEncoderBlock(2, 4, 8, seed=0, dtype=d),
    "TransformerDecoderBlock": lambda d: ka.TransformerDecoderBlock(2, 4, 8, seed=0, dtype=d),
    "PositionEmbedding": lambda d: ka.PositionEmbedding(4, dtype=d),
    "SinusoidalPositionEncoding": lambda d: ka.SinusoidalPositionEncoding(dtype=d),
    "RotaryEmbedding": lambda d: ka.RotaryEmbedding(max_wavelength=100.0, dtype=d),
}
LAYERS = {name: (make, PUBLIC_LAYERS[name.split("-")[0]]) for name, make in FACTORIES.items()}
WEIGHTLESS = {"PerformerAttention"}  # returns approximate, unmasked-normalised
FEATURES = 8
POLICIES = ["float32", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16", "int32-inputs"]


def _mask(draw, kind, batch, length, rng):
    if kind == "none" or batch == 0 or length == 0:
        return None
    if kind == "random":
        mask = rng.random((batch, length)) < 0.6
    elif kind == "all_false_rows":
        mask = np.ones((batch, length), bool)
        mask[::2] = False
    else:  # all_false_batch
        mask = np.zeros((batch, length), bool)
    return mask


@st.composite
def cases(draw):
    return dict(
        layer=draw(st.sampled_from(sorted(LAYERS))),
        # Hypothesis favours the first choices: the general case comes first,
        # so that enough examples meet NaN behind per-query masks.
        batch=draw(st.sampled_from([2, 1, 0])),
        query_length=draw(st.sampled_from([3, 1, 0])),
        key_length=draw(st.sampled_from([3, 1, 0])),
        query_mask=draw(st.sampled_from(["none", "random", "all_false_rows", "all_false_batch"])),
        value_mask=draw(st.sampled_from(["none", "random", "all_false_rows", "all_false_batch"])),
        policy=draw(st.sampled_from(POLICIES)),
        nan=draw(st.sampled_from(["unmasked", "masked", "none"])),
        # Per-query masks on the attention layers: a NaN key hidden by them
        # must reach only the queries that see it.
        per_query=draw(st.sampled_from(["attention_mask", "none", "causal"])),
        scores=draw(st.booleans()),
        seed=draw(st.integers(0, 3)),
        # A few deliberately invalid calls: must be our error, naming things.
        corrupt=draw(st.sampled_from(["none"] * 6 + ["mask_length", "rank"])),
    )


POISONED = []  # (batch, time) of the query positions given a NaN
KEY_POISONED = []  # (batch, time) of the unmasked key positions given a NaN


def _poison(x, mask, where, rng, is_query=False, is_key=False):
    """Puts a NaN at a masked (or unmasked) time step of `x`.

    Returns whether it went into an unmasked position (then NaN may spread).
    """
    if where == "none" or x.size == 0:
        return False
    if mask is None:
        candidates = np.argwhere(np.ones(x.shape[:2], bool)) if where == "unmasked" else []
    else:
        candidates = np.argwhere(~mask if where == "masked" else mask)
    if len(candidates) == 0:
        return False
    b, t = candidates[rng.integers(len(candidates))]
    x[(b, t) + tuple(rng.integers(n) for n in x.shape[2:])] = np.nan
    if is_query:
        POISONED.append((b, t))
    if is_key and where == "unmasked":
        KEY_POISONED.append((b, t))
    return where == "unmasked"


def _inputs(case, rng):
    """(args, kwargs, query_mask, key_mask, nan_unmasked) for the case's kind."""
    kind = LAYERS[case["layer"]][1]
    batch, tq, tv = case["batch"], case["query_length"], case["key_length"]
    query = rng.standard_normal((batch, tq, FEATURES)).astype("float32")
    value = rng.standard_normal((batch, tv, FEATURES)).astype("float32")
    query_mask = _mask(None, case["query_mask"], batch, tq, rng)
    value_mask = _mask(None, case["value_mask"], batch, tv, rng)
    if kind == "feature_map":
        side = 1 if tq == 1 else (0 if tq == 0 else 2)
        query = rng.standard_normal((batch, side, 2, 4)).astype("float32")
        return [query], {}, None, None, _poison(query, None, case["nan"], rng)
    if kind in ("sequence", "pooling", "encoder"):
        nan = _poison(query, query_mask, case["nan"], rng, is_query=True)
        kwargs = {}
        if kind == "pooling":
            kwargs["mask"] = query_mask
        elif kind == "encoder":
            kwargs["padding_mask"] = query_mask
        if kind == "sequence":
            query_mask = None
        return [query], kwargs, query_mask, query_mask, nan
    if case["per_query"] == "causal" and kind == "attention":
        # Self-attention: the query is also the key and value.
        nan = _poison(query, query_mask, case["nan"], rng, is_query=True, is_key=True)
        kwargs = dict(query_mask=query_mask, use_causal_mask=True)
        return [query], kwargs, query_mask, query_mask, nan
    nan = _poison(query, query_mask, case["nan"], rng, is_query=True)
    nan = _poison(value, value_mask, case["nan"], rng, is_key=True) or nan
    if kind == "decoder":
        kwargs = dict(decoder_padding_mask=query_mask, encoder_padding_mask=value_mask)
        return [query, value], kwargs, query_mask, value_mask, nan
    kwargs = dict(query_mask=query_mask, value_mask=value_mask)
    if case["per_query"] == "attention_mask":
        kwargs["attention_mask"] = rng.random((batch, tq, tv)) < 0.6
    return [query, value], kwargs, query_mask, value_mask, nan


def _rows_that_may_be_nan(args, kwargs, key_mask):
    """`(B, Tq)`: attention rows that hold or see an unmasked NaN (NumPy).

    A row may be NaN if its query is, or if the masks (key mask,
    `attention_mask`, causal) let it see a NaN key; a layer's own structure
    (sparse blocks) only hides more keys.
    """
    batch, q_len = args[0].shape[:2]
    k_len = args[-1].shape[1]
    allowed = np.ones((batch, q_len, k_len), bool)
    if key_mask is not None:
        allowed &= key_mask[:, None, :]
    if kwargs.get("attention_mask") is not None:
        allowed &= kwargs["attention_mask"]
    if kwargs.get("use_causal_mask"):
        allowed &= np.tril(np.ones((q_len, k_len), bool))
    rows = np.zeros((batch, q_len), bool)
    for b, t in POISONED:
        rows[b, t] = True
    for b, t in KEY_POISONED:
        rows[b] |= allowed[b, :, t]
    return rows


def _expected_shape(case, args):
    kind = LAYERS[case["layer"]][1]
    if kind == "pooling":
        return (args[0].shape[0], args[0].shape[-1])
    return tuple(args[0].shape)


def _symbolic(x):
    """A Keras input like `x` with an unknown batch, as `keras.Input` gives."""
    return keras.KerasTensor((None,) + tuple(x.shape[1:]), dtype=str(x.dtype))


def _compiled_call(layer, args, kwargs, mode):
    """Calls `layer` as a compiled model would: built from symbolic inputs
    (unknown batch), then traced with the arrays as traced arguments.

    `tf_function` / `xla`: `tf.function` (with `jit_compile=True` for `xla`)
    over an input signature whose batch is unknown; `jit`: `jax.jit` over
    `stateless_call`, the variables passed in. Our errors must come while
    building or tracing: an exception raised by running the compiled
    program would be a backend's.
    """
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    static = {k: v for k, v in kwargs.items() if k not in arrays}
    layer(*[_symbolic(a) for a in args], **{k: _symbolic(v) for k, v in arrays.items()}, **static)
    if mode == "jit":
        import jax

        def pure(trainable, non_trainable, args, arrays):
            outputs, _ = layer.stateless_call(trainable, non_trainable, *args, **arrays, **static)
            return outputs

        return jax.jit(pure)(
            [v.value for v in layer.trainable_variables],
            [v.value for v in layer.non_trainable_variables],
            list(args),
            arrays,
        )
    import tensorflow as tf

    def spec(x):
        return tf.TensorSpec((None,) + tuple(x.shape[1:]), x.dtype)

    function = tf.function(
        lambda args, arrays: layer(*args, **arrays, **static),
        input_signature=[[spec(a) for a in args], {k: spec(v) for k, v in arrays.items()}],
        jit_compile=mode == "xla",
    )
    return function(list(args), arrays)


def _check_case(case, mode):
    POISONED.clear()
    KEY_POISONED.clear()
    rng = np.random.default_rng(case["seed"])
    factory, kind = LAYERS[case["layer"]]
    integer_inputs = case["policy"] == "int32-inputs"
    policy = "float32" if integer_inputs else case["policy"]
    layer = factory(policy)
    class_name = type(layer).__name__
    args, kwargs, query_mask, key_mask, nan_unmasked = _inputs(case, rng)
    if integer_inputs:
        args = [np.nan_to_num(a * 3).astype("int32") for a in args]
        nan_unmasked = False
        POISONED.clear()
        KEY_POISONED.clear()
    argument = None
    if case["corrupt"] == "rank" and kind != "sequence":  # those take (..., T, d)
        args[0] = args[0][..., 0]
        argument = "query" if kind == "attention" else "inputs"
    elif case["corrupt"] == "mask_length" and kind in ("attention", "pooling", "encoder"):
        argument = {"attention": "query_mask", "pooling": "mask", "encoder": "padding_mask"}[kind]
        kwargs[argument] = np.ones((args[0].shape[0], args[0].shape[1] + 1), bool)
    want_scores = case["scores"] and kind == "attention"
    if want_scores:
        kwargs["return_attention_scores"] = True
    try:
        if mode == "eager":
            result = layer(*args, **kwargs)
        else:
            result = _compiled_call(layer, args, kwargs, mode)
    except (ValueError, TypeError) as error:
        assert class_name in str(error), f"error names another class: {error}"
        if argument is not None:
            assert argument in str(error), f"error names no argument: {error}"
        assert "Received" in str(error), f"error shows no value: {error}"
        case["outcome"] = f"raised {type(error).__name__}"
        case["message"] = str(error)
        return
    case["outcome"] = "returned"
    assert case["corrupt"] == "none" or argument is None, f"accepted bad input {case}"
    output, weights = result if want_scores else (result, None)
    assert tuple(output.shape) == _expected_shape(case, args)
    output = to_numpy(output)
    may_be_nan = np.zeros(output.shape[:2], bool)
    if kind == "attention":
        # Exactly: rows that neither hold nor see a NaN are finite.
        may_be_nan = _rows_that_may_be_nan(args, kwargs, key_mask)
        assert np.all(np.isfinite(output[~may_be_nan])), f"NaN spread: {case}"
    elif not nan_unmasked:
        finite = np.isfinite(output)
        if kind in ("encoder", "decoder", "sequence"):
            # A padded position's NaN stays where it went in (the residual
            # carries it); it reaches no other position.
            for b, t in POISONED:
                finite[b, t] = True
        assert np.all(finite), f"non-finite output for {case}"
    if kind == "attention" and query_mask is not None:
        # Masked query rows are exactly zero (not for the blocks: they add the residual).
        np.testing.assert_array_equal(output[~query_mask], 0.0)
    if weights is not None and case["layer"] not in WEIGHTLESS:
        weights = to_numpy(weights)
        if weights.ndim == 4:  # (B, H, Tq, Tv) -> (B, Tq, H, Tv)
            weights = weights.transpose(0, 2, 1, 3)
        clean = weights[~may_be_nan]  # rows that neither hold nor see a NaN
        assert np.all(np.isfinite(clean))
        if key_mask is not None and weights.size:
            # Zero wherever a key is masked.
            keys = key_mask[:, None, :] if weights.ndim == 3 else key_mask[:, None, None, :]
            masked = np.broadcast_to(~keys, weights.shape)[~may_be_nan]
            assert np.all(clean[masked] == 0)


def _fuzz_settings(max_examples):
    """Reproducible runs (`derandomize`), no deadline: tracing varies."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _every_layer(test):
    """One general example per layer besides the drawn ones: every layer is
    fuzzed whatever the derandomised draws hit (they moved when a layer was
    added and missed one)."""
    for name in sorted(LAYERS, reverse=True):
        test = example(
            dict(
                layer=name,
                batch=2,
                query_length=3,
                key_length=3,
                query_mask="random",
                value_mask="random",
                policy=POLICIES[0],
                nan="unmasked",
                per_query="none",
                scores=False,
                seed=0,
                corrupt="none",
            )
        )(test)
    return test


@_fuzz_settings(MAX_EXAMPLES)
@_every_layer
@given(cases())
def test_every_public_layer_survives_hostile_inputs(case):
    EXAMPLES_RUN.append(case)
    _check_case(case, "eager")


@_fuzz_settings(COMPILED_EXAMPLES)
@given(cases(), st.sampled_from(COMPILED_MODES))
def test_every_public_layer_survives_hostile_inputs_compiled(case, mode):
    case["mode"] = mode
    COMPILED_RUN.append(case)
    _check_case(case, mode)


def test_the_fuzzer_ran_its_examples():
    """The closing note's count: every example ran (none filtered away)."""
    if not EXAMPLES_RUN:
        pytest.skip("run together with the fuzz test")
    outcomes = collections.Counter(case.get("outcome", "failed") for case in EXAMPLES_RUN)
    print(
        f"fuzz: {len(EXAMPLES_RUN)} examples on {keras.backend.backend()}:",
        dict(outcomes.most_common()),
    )
    assert len(EXAMPLES_RUN) >= MAX_EXAMPLES
    layers = {case["layer"] for case in EXAMPLES_RUN}
    assert len(layers) == len(LAYERS), sorted(set(LAYERS) - layers)
    if not COMPILED_RUN:
        pytest.skip("run together with the compiled fuzz test")
    for mode in COMPILED_MODES:
        run = [case for case in COMPILED_RUN if case["mode"] == mode]
        outcomes = collections.Counter(case.get("outcome", "failed") for case in run)
        print(f"fuzz, {mode}: {len(run)} examples:", dict(outcomes.most_common()))
        assert run and "failed" not in outcomes
    assert len(COMPILED_RUN) >= COMPILED_EXAMPLES
