"""The kernel selector as a table: one pure function, its docstring checked."""

import re

import pytest
from jax import export as jax_export

from keras_attention.layers.machinery import kernel_selector
from keras_attention.layers.machinery.kernel_selector import Kernel
from keras_attention.layers.machinery.kernel_selector import KernelRequest
from keras_attention.layers.machinery.kernel_selector import decide

GIB = 2**30
# A CPU call of 8 heads at L = 1024, batch 2: dense working set 256 MiB.
BASE = dict(batch_size=2, num_heads=8, query_length=1024, key_length=1024, memory_budget=4 * GIB)


# A JAX symbolic dimension (`jax.export`), as Keras' JAX backend passes an
# unknown batch when it traces a wrapper layer's `call` (#41).
SYMBOLIC_BATCH = jax_export.symbolic_shape("b")[0]


def request(**changes):
    return KernelRequest(**{**BASE, **changes})


# (changes to BASE, expected rule, expected kernel)
TABLE = [
    (dict(), "fits", Kernel.COMPOSITE),
    (dict(xla=True), "fits", Kernel.SHIFTED),
    (dict(xla=True, equal_head_dims=False), "fits", Kernel.SHIFTED),
    (dict(xla=True, weights_needed=True), "weights", Kernel.DENSE),
    (dict(xla=True, memory_efficient=False), "forced-materialised", Kernel.SHIFTED),
    (dict(equal_head_dims=False), "fits", Kernel.DENSE),
    (dict(sequence_parallel=True, weights_needed=True), "ring", Kernel.RING),
    (dict(weights_needed=True, fused_available=True), "weights", Kernel.DENSE),
    (dict(flash_attention=False, fused_available=True), "forced-materialised", Kernel.COMPOSITE),
    (
        dict(memory_efficient=False, query_length=65536, key_length=65536),
        "forced-materialised",
        Kernel.COMPOSITE,
    ),
    (dict(flash_attention=True, fused_available=True), "forced-flash-fused", Kernel.FUSED),
    (
        dict(flash_attention=True, fused_available=True, equal_head_dims=False),
        "forced-flash-blockwise",
        Kernel.BLOCKWISE,
    ),
    (dict(flash_attention=True), "forced-flash-blockwise", Kernel.BLOCKWISE),
    (dict(flash_attention=True, key_length=None), "forced-flash-dynamic", Kernel.COMPOSITE),
    (dict(fused_available=True), "fused", Kernel.FUSED),
    (dict(fused_available=True, flash_enabled=False), "fits", Kernel.COMPOSITE),
    (dict(fused_available=True, memory_efficient=True), "fused", Kernel.FUSED),
    (dict(query_length=None), "dynamic", Kernel.COMPOSITE),
    (dict(memory_efficient=True), "forced-blockwise", Kernel.BLOCKWISE),
    (dict(query_length=1, key_length=10**6), "single-query", Kernel.COMPOSITE),
    (dict(memory_efficient_threshold=1024), "length-threshold", Kernel.BLOCKWISE),
    (dict(memory_efficient_threshold=1025, memory_budget=1), "fits", Kernel.COMPOSITE),
    # Past the backend's crossover (JAX on CPU) blockwise is the faster kernel, budget or not.
    (dict(blockwise_faster_from=1024), "faster-blockwise", Kernel.BLOCKWISE),
    (dict(blockwise_faster_from=1025), "fits", Kernel.COMPOSITE),
    (dict(blockwise_faster_from=1024, memory_efficient_threshold=4096), "fits", Kernel.COMPOSITE),
    (dict(blockwise_faster_from=1024, query_length=1), "single-query", Kernel.COMPOSITE),
    # 2 x 8 x 8192^2 x 4 bytes x 4 tensors = 32 GiB > 4 GiB.
    (dict(query_length=8192, key_length=8192), "over-budget", Kernel.BLOCKWISE),
    (dict(query_length=8192, key_length=8192, memory_budget=64 * GIB), "fits", Kernel.COMPOSITE),
    (dict(query_length=8192, key_length=8192, memory_budget=None), "fits", Kernel.COMPOSITE),
    # Unknown batch: one example counted, and long keys go blockwise.
    (dict(batch_size=None, query_length=4096, key_length=4096), "fits", Kernel.COMPOSITE),
    (
        dict(batch_size=None, query_length=4096, key_length=8192, memory_budget=64 * GIB),
        "unknown-batch",
        Kernel.BLOCKWISE,
    ),
    (
        dict(batch_size=None, query_length=8192, key_length=4096, memory_budget=GIB),
        "over-budget",
        Kernel.BLOCKWISE,
    ),
    # JAX symbolic dimensions (a wrapper layer's traced `call`, #41) are unknown
    # sizes: never compared in Python, the same rows as None.
    (
        dict(batch_size=SYMBOLIC_BATCH, query_length=8192, key_length=8192),
        "unknown-batch",
        Kernel.BLOCKWISE,
    ),
    (dict(batch_size=SYMBOLIC_BATCH, query_length=4096, key_length=4096), "fits", Kernel.COMPOSITE),
    (dict(batch_size=SYMBOLIC_BATCH, memory_budget=1), "over-budget", Kernel.BLOCKWISE),
    (dict(key_length=SYMBOLIC_BATCH * 4), "dynamic", Kernel.COMPOSITE),
    # A score modifier: Keras' kernels cannot change the logits (#36).
    (dict(scores_modified=True), "fits", Kernel.DENSE),
    (dict(scores_modified=True, xla=True), "fits", Kernel.SHIFTED),
    (dict(scores_modified=True, fused_available=True), "fits", Kernel.DENSE),
    (
        dict(scores_modified=True, fused_available=True, flash_attention=True),
        "forced-flash-blockwise",
        Kernel.BLOCKWISE,
    ),
    (dict(scores_modified=True, fused_available=True, query_length=None), "dynamic", Kernel.DENSE),
    (
        dict(scores_modified=True, query_length=8192, key_length=8192),
        "over-budget",
        Kernel.BLOCKWISE,
    ),
    # Dropout in training (#50): the blockwise kernel drops weights itself, so
    # every row that picks it without dropout picks it with dropout; where a
    # materialised kernel runs, it is the one that drops (DENSE), XLA or not;
    # the fused kernels cannot drop.
    (dict(dropout=True), "fits", Kernel.DENSE),
    (dict(dropout=True, xla=True), "fits", Kernel.DENSE),
    (dict(dropout=True, fused_available=True), "fits", Kernel.DENSE),
    (dict(dropout=True, memory_efficient=False), "forced-materialised", Kernel.DENSE),
    (dict(dropout=True, memory_efficient=True), "forced-blockwise", Kernel.BLOCKWISE),
    (dict(dropout=True, blockwise_faster_from=1024), "faster-blockwise", Kernel.BLOCKWISE),
    (dict(dropout=True, memory_efficient_threshold=1024), "length-threshold", Kernel.BLOCKWISE),
    (dict(dropout=True, query_length=8192, key_length=8192), "over-budget", Kernel.BLOCKWISE),
    (
        dict(dropout=True, batch_size=None, query_length=8192, key_length=8192),
        "unknown-batch",
        Kernel.BLOCKWISE,
    ),
    (
        dict(dropout=True, fused_available=True, query_length=8192, key_length=8192),
        "over-budget",
        Kernel.BLOCKWISE,
    ),
    (
        dict(dropout=True, fused_available=True, flash_attention=True),
        "forced-flash-blockwise",
        Kernel.BLOCKWISE,
    ),
    (dict(dropout=True, weights_needed=True), "weights", Kernel.DENSE),
]


@pytest.mark.parametrize("changes, rule, kernel", TABLE)
def test_selector_table(changes, rule, kernel):
    assert decide(request(**changes)) == (rule, kernel)
    assert kernel_selector.select_kernel(request(**changes)) is kernel


def test_every_rule_of_the_docstring_is_reached_by_the_table():
    rules = {rule for _, rule, _ in TABLE}
    documented = re.findall(r"^\| ([a-z-]+) \|", kernel_selector.__doc__, re.M)
    documented = [r for r in documented if r not in ("rule", "---")]
    assert set(documented) == rules
    # The docstring's kernel column matches what each rule returns.
    rows = dict(re.findall(r"^\| ([a-z-]+) \| .* \| ([A-Z]+) \|$", kernel_selector.__doc__, re.M))
    for _, rule, kernel in TABLE:
        expected = rows[rule]
        if expected == "MATERIALISED":
            assert kernel in (Kernel.COMPOSITE, Kernel.DENSE, Kernel.SHIFTED), rule
        else:
            assert kernel.name == expected, rule


def test_docstring_rules_are_in_the_order_the_code_tries_them():
    documented = [
        r
        for r in re.findall(r"^\| ([a-z-]+) \|", kernel_selector.__doc__, re.M)
        if r not in ("rule", "---")
    ]
    import inspect

    source = inspect.getsource(kernel_selector.decide)
    positions = [source.rindex(f'"{rule}"') for rule in documented]
    assert positions == sorted(positions)


@pytest.mark.both_backends
def test_a_default_layer_runs_blockwise_from_the_crossover_on_jax_cpu_and_matches_keras(
    monkeypatch,
):
    """At L = 1024 the default layer runs blockwise on JAX's CPU backend (faster
    there, benchmarks/RESULTS.md) and materialises elsewhere, with Keras' output;
    a causal call runs blockwise from 1024 on TensorFlow's CPU too."""
    import keras
    import numpy as np

    from keras_attention import MultiHeadAttention
    from tests.kernel_spy import spy_kernels

    jax_cpu = keras.backend.backend() == "jax" and __import__("jax").default_backend() == "cpu"
    x = np.random.default_rng(0).normal(size=(1, 1024, 8)).astype("float32")
    reference = keras.layers.MultiHeadAttention(2, 4, bias_initializer="random_normal", seed=1)
    expected = keras.ops.convert_to_numpy(reference(x, x))
    ours = MultiHeadAttention.from_keras(reference)
    ran = spy_kernels(monkeypatch)
    got = keras.ops.convert_to_numpy(ours(x, x))
    assert ran == [Kernel.BLOCKWISE if jax_cpu else Kernel.COMPOSITE]
    np.testing.assert_allclose(got, expected, atol=2e-5)
    # memory_efficient=False still materialises, crossover or not.
    ran.clear()
    MultiHeadAttention.from_keras(reference, memory_efficient=False)(x, x)
    assert ran == [Kernel.COMPOSITE]
    # A causal call skips half the blockwise tiles: blockwise from 1024 on
    # TensorFlow's CPU too (benchmarks/RESULTS.md, #37), still Keras' output.
    ran.clear()
    expected = keras.ops.convert_to_numpy(reference(x, x, use_causal_mask=True))
    got = keras.ops.convert_to_numpy(ours(x, x, use_causal_mask=True))
    assert ran == [Kernel.BLOCKWISE]
    assert ours.kernel_for(x.shape, use_causal_mask=True) is Kernel.BLOCKWISE
    np.testing.assert_allclose(got, expected, atol=2e-5)
    short = x[:, :512]
    assert ours.kernel_for(short.shape, use_causal_mask=True) is not Kernel.BLOCKWISE


def test_working_set_counts_logits_shaped_float32_tensors():
    r = request(batch_size=3, num_heads=2, query_length=5, key_length=7)
    assert r.dense_working_set() == kernel_selector.DENSE_WORKING_SET_TENSORS * 4 * 3 * 2 * 5 * 7
    xla = request(batch_size=3, num_heads=2, query_length=5, key_length=7, xla=True)
    assert xla.dense_working_set() == (
        kernel_selector.DENSE_WORKING_SET_TENSORS_XLA * 4 * 3 * 2 * 5 * 7
    )
    assert kernel_selector.DENSE_WORKING_SET_TENSORS_XLA > kernel_selector.DENSE_WORKING_SET_TENSORS


def test_keras_size_call_at_8192_stays_dense_in_a_16_gib_process(monkeypatch):
    """Fake memory readings: the call Keras' layer runs in 16 GiB (L = 8192,
    8 heads, batch 1, 7.3 GiB peak) is materialised, as Keras does; twice the
    length, which Keras cannot run there, goes blockwise; under TF XLA,
    where Keras' layer did not fit 16 GiB at 8192, blockwise too."""
    from keras_attention.layers.machinery import memory_budget

    monkeypatch.setattr(memory_budget, "_budget", None)
    monkeypatch.setattr(memory_budget, "available_memory", lambda: 15 * GIB)
    budget = memory_budget.attention_memory_budget()

    def at(length, **kw):
        return kernel_selector.select_kernel(
            request(
                batch_size=1,
                num_heads=8,
                query_length=length,
                key_length=length,
                memory_budget=budget,
                **kw,
            )
        )

    assert at(8192) is Kernel.COMPOSITE
    assert at(16384) is Kernel.BLOCKWISE
    assert at(8192, xla=True) is Kernel.BLOCKWISE
    assert at(4096, xla=True) is Kernel.SHIFTED


def test_layer_reads_the_budget_once_and_a_layer_budget_wins(monkeypatch):
    """Fake memory readings: the default is three quarters of what is available."""
    import numpy as np

    from keras_attention import MultiHeadAttention
    from keras_attention.layers.machinery import memory_budget
    from tests.kernel_spy import spy_kernels

    reads = []
    monkeypatch.setattr(memory_budget, "_budget", None)
    monkeypatch.setattr(memory_budget, "available_memory", lambda: reads.append(1) or 4 * GIB)
    assert memory_budget.attention_memory_budget() == 3 * GIB
    assert memory_budget.attention_memory_budget() == 3 * GIB and len(reads) == 1
    ran = spy_kernels(monkeypatch)
    x = np.random.default_rng(0).normal(size=(1, 64, 8)).astype("float32")
    # 1 x 2 heads x 64 x 64 x 4 bytes x 4 tensors = 128 KiB.
    MultiHeadAttention(2, 4, memory_budget=2**17)(x)
    MultiHeadAttention(2, 4, memory_budget=2**17 - 1)(x)
    memory_budget.set_attention_memory_budget(2**16)
    MultiHeadAttention(2, 4)(x)
    memory_budget.set_attention_memory_budget(None)
    MultiHeadAttention(2, 4)(x)  # back to 3/4 of the (fake) available memory
    assert ran == [Kernel.COMPOSITE, Kernel.BLOCKWISE, Kernel.BLOCKWISE, Kernel.COMPOSITE]
    with pytest.raises(ValueError, match="num_bytes=0"):
        memory_budget.set_attention_memory_budget(0)


def test_training_with_dropout_at_65536_tokens_stays_blockwise():
    """The issue's call (#50): dropout used to need the stored weights, which
    sent it to the dense kernel (137 GB of weights at this length)."""
    from keras_attention import MultiHeadAttention

    layer = MultiHeadAttention(num_heads=8, key_dim=64, dropout=0.1)
    assert layer.kernel_for((1, 65536, 512), training=True) is Kernel.BLOCKWISE
    assert layer.kernel_for((1, 65536, 512), training=False) is Kernel.BLOCKWISE
    # Short calls materialise as before, dropping with Keras' `Dropout`.
    assert layer.kernel_for((1, 64, 512), training=True) is Kernel.DENSE
