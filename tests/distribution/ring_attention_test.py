"""Ring attention (sequence parallelism) on 4 forced host devices (JAX).

The worker runs in its own process; here its figures are checked: outputs
and gradients against a NumPy float64 reference (padding, causal, cross-
attention, rows with no key), proof that the ring ran (shard_map and
ppermute in the jaxpr, in the backward pass too), causal block skipping
counted on the devices, and `MultiHeadAttention(sequence_parallel=...)`
against the exact single-device layer. Argument checks that need no
devices run in-process.
"""

import numpy as np
import pytest

import keras_attention as ka
from tests.distribution.subprocesses import run_worker

TOLERANCE = 1e-5
CASES = [
    "plain",
    "padding",
    "causal",
    "causal_contiguous",
    "causal_padding",
    "cross_attention",
    "fully_masked_rows",
]


@pytest.fixture(scope="module")
def results():
    return run_worker("tests.distribution.ring_worker", [], backend="jax", timeout=400)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_outputs_and_gradients_match_the_float64_reference(results, case):
    report = results["ops"][case]
    assert results["devices"] == 4
    assert report["finite"]
    assert report["scale"] > 0.5  # a non-trivial output
    assert report["output"] < TOLERANCE, report
    assert max(report["gradients"]) < TOLERANCE, report
    # #50: the ring's own row statistics, as every exact kernel's.
    assert report["logsumexp"] < TOLERANCE and report["no_key_rows"], report


@pytest.mark.slow
def test_the_ring_ran(results):
    jaxpr = results["jaxpr"]
    assert jaxpr["forward_has_shard_map"]
    # 3 hops on 4 devices, each moving keys and values (one ppermute each
    # of k and v, and of the key mask when given).
    assert jaxpr["forward_ppermutes"] >= 3
    assert jaxpr["backward_ppermutes"] > jaxpr["forward_ppermutes"]


@pytest.mark.slow
def test_causal_mask_skips_blocks_in_the_future_and_zigzag_balances_them(results):
    blocks = results["blocks"]
    # 4 query blocks x 4 key blocks, every tile computed.
    assert blocks["full"] == [4, 4, 4, 4]
    # Contiguous blocks under the causal rule: block i sees blocks 0..i.
    assert blocks["causal_contiguous"] == [1, 2, 3, 4]
    # Zigzag (the default under the causal rule): device i holds half-blocks
    # i and 7 - i of 8, and every device computes 2N + 1 = 9 half-tiles.
    assert blocks["causal"] == [9, 9, 9, 9]


@pytest.mark.slow
def test_multi_head_attention_sequence_parallel_matches_exact(results):
    layer = results["layer"]
    assert layer["kernel"] == "ring"
    assert layer["output"] < TOLERANCE
    assert layer["input_gradients"] < TOLERANCE
    assert layer["weight_gradients"] < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("call", ["documents", "prefix", "window"])
def test_rules_and_modifiers_on_the_ring_match_the_float64_reference(results, call):
    """Soft cap, ALiBi, a `score_mod`, learned sinks and a `mask_mod`, with
    packed documents, a prefix per example, or a causal sliding window with
    sink tokens, per ring tile (#36, #50)."""
    modified = results["layer"]["modified"][call]
    assert modified["kernel"] == "ring"
    assert modified["finite"]
    assert modified["output"] < TOLERANCE, modified


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, message",
    [
        (
            "indivisible",
            r"axis 'sequence' of size 4 \(DeviceMesh\(shape=\(1, 4\).*"
            r"Received: sequence_parallel='sequence', projected query "
            r"with shape \(2, 14, 4, 4\)",
        ),
        ("attention_mask", r"attention_mask of shape \(2, 16, 16\)"),
        ("scores", r"needs the weights"),
        (
            "unknown_axis",
            r"must name an axis of the device mesh DeviceMesh\(shape="
            r"\(1, 4\), axis_names=\('batch', 'sequence'\)\)\. "
            r"Received: sequence_parallel='context'",
        ),
        ("no_distribution", r"needs a keras.distribution"),
    ],
)
def test_bad_input_names_the_argument_the_mesh_and_the_shape(results, case, message):
    import re

    error = results["layer"]["errors"][case]
    assert error is not None and re.search(message, error), error
    assert "MultiHeadAttention (layer '" in error


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sequence_parallel=3), r"`sequence_parallel` must be None or the name"),
        (dict(sequence_parallel="sequence", dropout=0.1), r"does not support `dropout`"),
        (
            dict(sequence_parallel="sequence", flash_attention=False),
            r"does not support `flash_attention`",
        ),
    ],
)
def test_constructor_rejects_what_the_ring_cannot_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ka.MultiHeadAttention(2, 4, **kwargs)


def test_config_round_trip_keeps_the_axis():
    layer = ka.MultiHeadAttention(2, 4, sequence_parallel="sequence")
    config = layer.get_config()
    assert config["sequence_parallel"] == "sequence"
    assert ka.MultiHeadAttention.from_config(config).sequence_parallel == "sequence"


def test_other_backends_are_told_it_needs_jax():
    import keras

    if keras.backend.backend() == "jax":
        pytest.skip("the JAX path is tested in the worker")
    layer = ka.MultiHeadAttention(2, 4, sequence_parallel="sequence")
    x = np.zeros((1, 4, 8), "float32")
    with pytest.raises(ValueError, match=r"needs the JAX backend.*KERAS_BACKEND='tensorflow'"):
        layer(x, x)
