"""Fuzzing the public ops' arguments (issue 39).

Each op is called with every argument drawn from a pool of valid values and
wrong ones (wrong types, ranks, sizes that do not match another argument,
options out of range or misspelt). The pools say, apart from the code, which
values are wrong. Every example must either return the documented shape, when
all arguments are valid, or raise our ValueError/TypeError naming the op and
one of the wrong arguments, before any backend call: never a backend's error,
and never when all are valid. The issue's reproducers are pinned with
`@example`. `derandomize=True`: a fixed slice that CI runs.
"""

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attention import ops as ka_ops
from keras_attention.ops import ring
from keras_attention.ops.attention_mask import AttentionMask

FUZZ = settings(
    max_examples=25,  # each op: ~1 s on TensorFlow, favor and block_plan ~5 s on JAX (2 cores)
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def x(*shape, dtype="float32"):
    return np.random.default_rng(len(shape)).uniform(0.1, 1.0, size=shape).astype(dtype)


def mask(*shape):
    return np.ones(shape, bool)


# Wrong in type for any tensor argument: a string, a nested list, a number, None.
NOT_TENSORS = ["abc", [[1.0, 2.0]], 3, None]

# op -> (function, {argument: [(value, valid)]}, output shape when all are valid)
SPECS = {
    "dot_score": (
        lambda a: ka_ops.dot_score(a["query"], a["key"], scale=a["scale"]),
        {
            "query": [(x(2, 3, 4), True), (x(2, 4), False)] + [(v, False) for v in NOT_TENSORS],
            "key": [(x(2, 5, 4), True), (x(2, 5, 3), False), (x(5, 4), False), ("k", False)],
            "scale": [(None, True), (0.5, True), (np.float32(2), True)]
            + [(float("nan"), False), ("2", False), (True, False), (x(2), False)],
        },
        (2, 3, 5),
    ),
    "general_score": (
        lambda a: ka_ops.general_score(a["query"], a["key"], a["kernel"]),
        {
            "query": [(x(2, 3, 4), True), (x(3, 4), False), (None, False)],
            "key": [(x(2, 5, 6), True), (x(2, 5, 6, 1), False), ("k", False)],
            "kernel": [(x(4, 6), True), (x(6, 4), False), (x(4), False), ([[1.0]], False)],
        },
        (2, 3, 5),
    ),
    "weighted_sum": (
        lambda a: ka_ops.weighted_sum(a["weights"], a["value"]),
        {
            "weights": [(x(2, 3, 5), True), (x(3, 5), False), ("w", False)],
            "value": [(x(2, 5, 7), True), (x(2, 4, 7), False), (x(5, 7), False), (7, False)],
        },
        (2, 3, 7),
    ),
    "causal_mask": (
        lambda a: ka_ops.causal_mask(a["query_length"], a["key_length"]),
        {
            "query_length": [(3, True), (np.int64(3), True), (0, True)]
            + [(-1, False), (2.5, False), ("3", False), (None, False), (True, False)],
            "key_length": [(4, True), (np.int32(4), True)]
            + [(-4, False), (4.0, False), ("4", False), (None, False)],
        },
        None,  # (1, Tq, Tk): checked below from the drawn lengths
    ),
    "masked_softmax": (
        lambda a: ka_ops.masked_softmax(a["logits"], mask=a["mask"], axis=a["axis"]),
        {
            "logits": [(x(2, 3, 5), True)] + [(v, False) for v in NOT_TENSORS],
            "mask": [(None, True), (mask(2, 3, 5), True), (mask(1, 1, 5), True)]
            + [(mask(2, 3, 4), False), (np.array([["a"]]), False), ("m", False)],
            "axis": [(-1, True), (2, True), (0, True)] + [(3, False), (-4, False), ("1", False)],
        },
        (2, 3, 5),
    ),
    "merge_masks": (
        lambda a: ka_ops.merge_masks(a["masks[0]"], a["masks[1]"]),
        {
            "masks[0]": [(None, True), (mask(2, 3), True), (np.ones((2, 3), "int32"), True)]
            + [("abc", False), (np.array(["t", "f"]), False), ([True], False)],
            "masks[1]": [(None, True), (mask(1, 3), True), (mask(2, 3), True)]
            # (A (2, 4) mask is wrong only beside a (2, 3) one: the walk test pins it.)
            + [(np.array([["x"]]), False), (3, False)],
        },
        None,  # a mask of the broadcast shape, or None
    ),
    "random_projection": (
        lambda a: ka_ops.random_projection(
            a["num_features"], a["dim"], orthogonal=a["orthogonal"], seed=a["seed"]
        ),
        {
            "num_features": [(4, True), (np.int64(6), True)]
            + [(0, False), (-1, False), (2.0, False), ("4", False), (None, False)],
            "dim": [(3, True), (np.int32(2), True)] + [(0, False), (1.5, False), (True, False)],
            "orthogonal": [(True, True), (False, True), (np.bool_(True), True)]
            + [("yes", False), (None, False), (2, False)],
            "seed": [(None, True), (0, True), ((1, 2), True)]
            + [("1", False), (1.5, False), ((1, -2), False)],
        },
        None,  # (num_features, dim)
    ),
    "block_plan": (
        lambda a: ka_ops.block_plan(
            a["num_query_blocks"],
            a["num_key_blocks"],
            window_blocks=a["window_blocks"],
            global_blocks=a["global_blocks"],
            causal=a["causal"],
        ),
        {
            "num_query_blocks": [(3, True), (np.int64(2), True), (-1, False), ("3", False)],
            "num_key_blocks": [(3, True), (1, True), (-2, False), (3.5, False)],
            "window_blocks": [(1, True), (0, True), (-1, False), ("1", False), (None, False)],
            "global_blocks": [(0, True), (1, True), (-1, False), (1.0, False)],
            "causal": [(False, True), (np.bool_(True), True), ("no", False), (None, False)],
        },
        None,  # (num_query_blocks, slots)
    ),
    "linear_attention": (
        lambda a: ka_ops.linear_attention(a["query_features"], a["key_features"], a["value"]),
        {
            "query_features": [(x(1, 2, 3, 4), True), (x(2, 3, 4), False), ("q", False)],
            "key_features": [(x(1, 2, 5, 4), True), (x(1, 2, 5, 6), False), (None, False)],
            "value": [(x(1, 2, 5, 7), True), (x(1, 2, 4, 7), False), ([[1.0]], False)],
        },
        (1, 2, 3, 7),
    ),
    "favor_attention": (
        lambda a: ka_ops.favor_attention(
            a["query"],
            x(1, 4, 2, 3),
            x(1, 4, 2, 3),
            a["projection"],
            kernel=a["kernel"],
            causal=a["causal"],
            chunk_size=a["chunk_size"],
        ),
        {
            "query": [(x(1, 4, 2, 3), True), (x(4, 2, 3), False), ("q", False)],
            "projection": [(x(8, 3), True), (x(8, 5), False), (x(8), False), (None, False)],
            "kernel": [("softmax", True), ("relu", True)]
            + [("Softmax", False), ("gelu", False), (None, False), (1, False)],
            "causal": [(False, True), (True, True), ("no", False)],
            "chunk_size": [(2, True), (128, True), (0, False), (2.5, False), (None, False)],
        },
        (1, 4, 2, 3),
    ),
}


def _arguments(spec):
    """A strategy of `(arguments, wrong argument names)` for one op."""
    pools = spec[1]
    return st.fixed_dictionaries({name: st.sampled_from(pool) for name, pool in pools.items()}).map(
        lambda drawn: (
            {name: value for name, (value, _) in drawn.items()},
            {name for name, (_, valid) in drawn.items() if not valid},
        )
    )


def _expected_shape(op, arguments):
    if op == "causal_mask":
        return (1, int(arguments["query_length"]), int(arguments["key_length"]))
    if op == "merge_masks":
        given = [m for m in (arguments["masks[0]"], arguments["masks[1]"]) if m is not None]
        return np.broadcast_shapes(*(m.shape for m in given)) if given else None
    if op == "random_projection":
        return (int(arguments["num_features"]), int(arguments["dim"]))
    if op == "block_plan":
        return int(arguments["num_query_blocks"])
    return SPECS[op][2]


def _check(op, arguments, wrong):
    function = SPECS[op][0]
    if wrong:
        with pytest.raises((ValueError, TypeError)) as raised:
            function(arguments)
        message = str(raised.value)
        assert message.startswith(f"{op}: "), message
        assert any(f"`{name}`" in message or f"{name} with" in message for name in wrong), (
            wrong,
            message,
        )
        assert "Received" in message, message
        return
    result = function(arguments)
    expected = _expected_shape(op, arguments)
    if op == "block_plan":
        index, valid = result
        assert tuple(index.shape)[0] == expected == tuple(valid.shape)[0]
        return
    if expected is None:
        assert result is None
        return
    assert tuple(result.shape) == tuple(expected)
    if "float" in str(result.dtype):
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(result)))


@pytest.mark.parametrize("op", sorted(SPECS))
def test_every_op_returns_or_refuses_naming_a_wrong_argument(op):
    @FUZZ
    @given(_arguments(SPECS[op]))
    def run(drawn):
        _check(op, *drawn)

    run()


# ----------------------------------------------------------- ring attention
# JAX only, and its devices: the checks run before any of it, so an abstract
# mesh (no devices) shows them on every backend; valid arguments pass them.


def _mesh(size):
    from jax.sharding import AbstractMesh

    try:
        return AbstractMesh((size,), ("sequence",))
    except TypeError:  # JAX before 0.5 (the compat floor, 0.4.38): ((name, size), ...)
        return AbstractMesh((("sequence", size),))


BALANCES = [("auto", True), ("zigzag", True), ("contiguous", True)] + [
    (b, False) for b in ("foo", None, 2, "ZIGZAG", "Zigzag", True)
]


@FUZZ
@given(
    balance=st.sampled_from(BALANCES),
    length=st.sampled_from([2, 3, 4, 6]),
    mesh_size=st.sampled_from([1, 2, 4]),
    mask=st.sampled_from([(None, True), ("causal", True), ("no", False), (True, False)]),
)
# The reproducers: a balance typo ran contiguous blocks silently; a
# length the mesh does not divide gave JAX's raw shard_map error.
@example(balance=("foo", False), length=4, mesh_size=2, mask=(None, True))
@example(balance=(None, False), length=4, mesh_size=2, mask=(None, True))
@example(balance=(2, False), length=4, mesh_size=2, mask=(None, True))
@example(balance=("ZIGZAG", False), length=4, mesh_size=2, mask=(None, True))
@example(balance=("auto", True), length=3, mesh_size=2, mask=(None, True))
def test_ring_attention_checks_its_arguments_before_jax(balance, length, mesh_size, mask):
    (balance, balance_ok), (mask, mask_ok) = balance, mask
    if mask == "causal":
        mask = AttentionMask(causal=True)
    divides = length % mesh_size == 0
    q = x(1, length, 1, 2)
    arguments = (q, q, q, _mesh(mesh_size), "sequence", None, None, mask, balance)
    if balance_ok and mask_ok and divides:
        ring._check_arguments(*arguments)
        return
    with pytest.raises((ValueError, TypeError)) as raised:
        ring._check_arguments(*arguments)
    message = str(raised.value)
    assert message.startswith("ring_attention: "), message
    if not balance_ok:
        assert "`balance` must be one of ('auto', 'zigzag', 'contiguous')" in message
    elif not mask_ok:
        assert "`mask` must be an AttentionMask" in message
    else:
        assert f"of size {mesh_size}" in message and "must divide the query length" in message


def test_ring_attention_itself_refuses_a_balance_typo():
    """Through the public function (not only its check), before JAX runs."""
    q = x(1, 4, 1, 2)
    with pytest.raises(ValueError, match=r"^ring_attention: `balance` must be one of"):
        ring.ring_attention(q, q, q, mesh=_mesh(2), balance="zig-zag")
