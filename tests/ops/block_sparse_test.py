"""Block-sparse attention against a NumPy dense reference (tests/sparse_reference.py)."""

import keras
import numpy as np
import pytest

from keras_attention.ops import block_sparse
from keras_attention.ops.attention_mask import AttentionMask
from tests.gradients import compiled_squared_sum_gradient
from tests.gradients import input_gradients
from tests.sparse_reference import reference_attention
from tests.sparse_reference import reference_gradients
from tests.sparse_reference import reference_pattern


def _inputs(batch, tq, tv, heads=2, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((batch, tq, heads, dim)).astype("float32"),
        rng.standard_normal((batch, tv, heads, dim)).astype("float32"),
        rng.standard_normal((batch, tv, heads, dim + 1)).astype("float32"),
    )


def _mask(kwargs):
    """Keras' spellings in `kwargs` (causal, query/key/attention masks)
    folded into the one `mask=` the kernel takes."""
    spellings = {
        name: kwargs.pop(name)
        for name in ("causal", "query_mask", "key_mask", "attention_mask")
        if name in kwargs
    }
    if spellings:
        kwargs["mask"] = AttentionMask.from_tensors(**spellings)
    return kwargs


def _on_jax_compiled(fn):
    """`fn` under `jax.jit` on JAX (as a model's `fit` and `predict` run the
    kernel: no branch of it depends on eager values), unchanged on
    TensorFlow. Op-by-op dispatch of the kernel's gathers and loops took
    most of this file's JAX time."""
    if keras.backend.backend() != "jax":
        return fn
    import jax

    return jax.jit(fn)


def _run(query, key, value, **kwargs):
    """The kernel on NumPy inputs (compiled on JAX: `_on_jax_compiled`)."""
    kwargs = _mask(kwargs)

    def attend(q, k, v):
        return block_sparse.block_sparse_attention(q, k, v, **kwargs)

    result = _on_jax_compiled(attend)(
        *(keras.ops.convert_to_tensor(x) for x in (query, key, value))
    )
    if isinstance(result, tuple):
        return tuple(keras.ops.convert_to_numpy(r) for r in result)
    return keras.ops.convert_to_numpy(result)


PATTERNS = [
    dict(window_blocks=3, global_blocks=1, random_blocks=2, tokens=()),
    dict(window_blocks=2, global_blocks=0, random_blocks=0, tokens=()),
    dict(window_blocks=3, global_blocks=0, random_blocks=0, tokens=(0, 17, 30)),
    dict(window_blocks=1, global_blocks=2, random_blocks=3, tokens=(11,)),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_matches_dense_attention_under_equivalent_mask(pattern, causal):
    batch, tq, tv, bs = 2, 37, 37, 4  # odd length, padded internally
    query, key, value = _inputs(batch, tq, tv)
    plan = np.random.default_rng(5).integers(0, 2**20, (3, pattern["random_blocks"]))
    key_mask = np.ones((batch, tv), bool)
    key_mask[1, 29:] = False  # padding of the second example
    allowed = (
        reference_pattern(
            tq,
            tv,
            bs,
            pattern["window_blocks"],
            pattern["global_blocks"],
            plan,
            pattern["tokens"],
            causal,
        )[None]
        & key_mask[:, None, :]
    )
    expected, expected_weights = reference_attention(query, key, value, allowed)
    output, weights = _run(
        query,
        key,
        value,
        block_size=bs,
        window_blocks=pattern["window_blocks"],
        global_blocks=pattern["global_blocks"],
        random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
        global_tokens=pattern["tokens"],
        causal=causal,
        key_mask=key_mask,
        return_weights=True,
    )
    np.testing.assert_allclose(output, expected, atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-5)


def test_pattern_is_sparse_and_not_trivially_dense():
    # Guards the test above: the chosen patterns really drop keys.
    allowed = reference_pattern(37, 37, 4, 3, 1, np.array([[1, 2]] * 3))
    assert 0.2 < allowed.mean() < 0.8


@pytest.mark.parametrize("pair_mask", [True, False], ids=["pair mask", "key mask"])
def test_cross_attention_with_different_lengths_and_attention_mask(pair_mask, monkeypatch):
    """13 queries, 22 keys: a random pair mask or a key mask, both on the
    engine's sweep over the pattern's 4 x 7 tiles (#50: the pair mask is cut
    per tile, as in the blockwise kernel)."""
    batch, tq, tv, bs = 2, 13, 22, 4
    query, key, value = _inputs(batch, tq, tv, seed=1)
    plan = np.array([[7, 3], [2, 9]])
    attention_mask = np.random.default_rng(2).random((batch, tq, tv)) > 0.3
    if not pair_mask:
        attention_mask = np.broadcast_to(attention_mask[:, :1], attention_mask.shape)
    allowed = reference_pattern(tq, tv, bs, 3, 1, plan, (5,)) & attention_mask
    expected, _ = reference_attention(query, key, value, allowed)
    ran = _spy_rows(monkeypatch)
    output = _run(
        query,
        key,
        value,
        block_size=bs,
        window_blocks=3,
        global_blocks=1,
        random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
        global_tokens=(5,),
        **dict(attention_mask=attention_mask) if pair_mask else dict(key_mask=attention_mask[:, 0]),
    )
    assert ran == ["recomputing"]
    np.testing.assert_allclose(output, expected, atol=1e-5)


@pytest.mark.parametrize("mod", [None, "shared", "per head"])
def test_packed_documents_and_a_mask_mod_join_the_pattern(mod, monkeypatch):
    """Segment ids and a `mask_mod` (#36), one for every head or a head's
    own, restrict the pattern's keys further, values and gradients against
    the NumPy reference of the pattern AND the rules. All are evaluated per
    tile by the engine's sweep (#50): no dense `(Tq, Tv)` mask is built
    (`AttentionMask.dense` is made to fail)."""
    batch, length, bs = 2, 21, 4
    query, key, value = _inputs(batch, length, length, seed=3)
    plan = np.array([[4, 1]] * 6)
    ids = np.array([[0] * 8 + [1] * 13, [0] * 3 + [1] * 12 + [2] * 6], "int32")
    rows, cols = np.arange(length)[:, None], np.arange(length)[None]
    per_head = int(mod == "per head")

    def mask_mod(batch, head, q_idx, k_idx):
        return keras.ops.not_equal((q_idx + k_idx + batch + head * per_head) % 5, 0)

    allowed = reference_pattern(length, length, bs, 3, 1, plan, (9,), causal=True) & (
        ids[:, :, None] == ids[:, None, :]
    )
    if mod is not None:
        head = np.arange(query.shape[2])[None, :, None, None] * per_head
        allowed = allowed[:, None] & (
            (rows + cols + np.arange(batch)[:, None, None, None] + head) % 5 != 0
        )

    def no_dense(*args, **kwargs):
        raise AssertionError("the engine's path must not build a dense mask")

    monkeypatch.setattr(AttentionMask, "dense", no_dense)
    ran = _spy_rows(monkeypatch)
    mask = AttentionMask(
        causal=True,
        query_segment_ids=ids,
        key_segment_ids=ids,
        mask_mod=None if mod is None else mask_mod,
    )

    def attend(q, k, v):
        return block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=bs,
            window_blocks=3,
            global_blocks=1,
            random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
            global_tokens=(9,),
            mask=mask,
        )

    cotangent = np.random.default_rng(4).standard_normal(value.shape).astype("float32")
    expected, _ = reference_attention(query, key, value, allowed)
    output = _on_jax_compiled(attend)(query, key, value)
    assert ran and set(ran) == {"recomputing"}
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
    grads = input_gradients(attend, [query, key, value], cotangent, jit=True)
    expected_grads = reference_gradients(query, key, value, allowed, cotangent)
    for got, want in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize(
    "mask, message",
    [
        (dict(causal=True, prefix_length=3), "prefix lengths and per-head masks are not"),
        (dict(key_positions=np.arange(9)[None] + 4), "`key_positions`\\) are not supported"),
    ],
    ids=["prefix", "key positions"],
)
def test_what_the_pattern_cannot_hold_is_refused(mask, message):
    query, key, value = _inputs(1, 9, 9)
    with pytest.raises(ValueError, match=message):
        _run(query, key, value, block_size=4, window_blocks=1, mask=AttentionMask(**mask))


def test_fully_masked_rows_are_zero_not_nan():
    query, key, value = _inputs(1, 9, 9)
    key_mask = np.zeros((1, 9), bool)
    output, weights = _run(
        query,
        key,
        value,
        block_size=4,
        window_blocks=3,
        global_blocks=1,
        key_mask=key_mask,
        return_weights=True,
    )
    assert np.all(output == 0) and np.all(weights == 0)


def test_global_blocks_longer_than_sequence_are_ignored():
    query, key, value = _inputs(1, 5, 5)
    allowed = np.ones((1, 5, 5), bool)
    expected, _ = reference_attention(query, key, value, allowed)
    output = _run(query, key, value, block_size=4, window_blocks=1, global_blocks=4)
    np.testing.assert_allclose(output, expected, atol=1e-5)


def test_block_plan_counts_a_repeated_block_once():
    plan = keras.ops.convert_to_tensor(np.array([[0, 1, 1]], "int32"))
    index, valid = block_sparse.block_plan(2, 2, window_blocks=1, global_blocks=1, random_plan=plan)
    index = keras.ops.convert_to_numpy(index)
    valid = keras.ops.convert_to_numpy(valid)
    for row, ok in zip(index, valid, strict=True):
        assert sorted(row[ok]) == [0, 1]


def test_causal_random_blocks_lie_in_the_past():
    plan = keras.ops.convert_to_tensor(
        np.random.default_rng(0).integers(0, 1000, (8, 4)).astype("int32")
    )
    index, valid = block_sparse.block_plan(8, 8, window_blocks=2, random_plan=plan, causal=True)
    index = keras.ops.convert_to_numpy(index)
    valid = keras.ops.convert_to_numpy(valid)
    for i, (row, ok) in enumerate(zip(index, valid, strict=True)):
        assert np.all(row[ok] <= i)


def test_compiles_and_differentiates():
    query, key, value = _inputs(1, 21, 21)
    plan = keras.ops.convert_to_tensor(np.array([[3, 4]], "int32"))
    kwargs = dict(
        block_size=4,
        window_blocks=3,
        global_blocks=1,
        random_plan=plan,
        global_tokens=(9,),
        causal=True,
    )

    def attend(q):
        return block_sparse.block_sparse_attention(q, key, value, **_mask(dict(kwargs)))

    grad = compiled_squared_sum_gradient(attend, query)
    assert np.all(np.isfinite(grad)) and np.any(grad != 0)


# The memory-linear path (no dropout callable, no dense weights, no explicit
# attention mask): chunks of query blocks under a recomputing custom
# gradient. Its outputs and gradients are checked against dense softmax
# attention under the equivalent mask, with hand-written NumPy gradients.
RECOMPUTE_CASES = [
    # pattern, causal, block size (10 query blocks of 4 tokens at T = 37)
    (PATTERNS[0], False, 4),  # BigBird: window + global blocks + random
    (PATTERNS[0], True, 4),
    (PATTERNS[1], True, 4),  # local only, causal window
    (PATTERNS[2], True, 4),  # Longformer global tokens
    (PATTERNS[3], False, 8),
    (PATTERNS[1], True, 64),  # one block larger than the sequence
]


def _padded_pattern_case(pattern, causal, bs, batch=2, length=37):
    """Inputs, a random plan, a key mask hiding example 1's last keys, and
    the NumPy pattern's `(B, T, T)` allowed pairs."""
    query, key, value = _inputs(batch, length, length)
    plan = np.random.default_rng(5).integers(0, 2**20, (3, pattern["random_blocks"]))
    key_mask = np.ones((batch, length), bool)
    key_mask[1, 29:] = False
    shape = (pattern["window_blocks"], pattern["global_blocks"], plan, pattern["tokens"], causal)
    allowed = reference_pattern(length, length, bs, *shape)[None] & key_mask[:, None, :]
    return query, key, value, plan, key_mask, allowed


@pytest.mark.parametrize("pattern, causal, bs", RECOMPUTE_CASES)
def test_recomputing_path_matches_dense_outputs_and_gradients(pattern, causal, bs):
    batch, length = 2, 37
    query, key, value, plan, key_mask, allowed = _padded_pattern_case(pattern, causal, bs)
    cotangent = (
        np.random.default_rng(9)
        .standard_normal((batch, length, 2, value.shape[-1]))
        .astype("float32")
    )

    def attend(q, k, v):
        return block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=bs,
            window_blocks=pattern["window_blocks"],
            global_blocks=pattern["global_blocks"],
            random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
            global_tokens=pattern["tokens"],
            mask=AttentionMask(causal=causal, key_mask=keras.ops.convert_to_tensor(key_mask)),
        )

    expected, _ = reference_attention(query, key, value, allowed)
    output = keras.ops.convert_to_numpy(_on_jax_compiled(attend)(query, key, value))
    np.testing.assert_allclose(output, expected, atol=1e-5)
    grads = input_gradients(attend, [query, key, value], cotangent, jit=True)
    expected_grads = reference_gradients(query, key, value, allowed, cotangent)
    for name, grad, want in zip("qkv", grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, want, atol=1e-4, err_msg=f"d{name}")


@pytest.mark.parametrize(
    "pattern, causal, return_weights",
    [
        # Global blocks (their rows through the blockwise kernel), random
        # blocks and a global token, causal: the recomputing path.
        (PATTERNS[3], True, False),
        (PATTERNS[2], False, True),  # tokens, the gathered path (dense weights asked for)
    ],
)
def test_dropout_inside_the_kernel_matches_the_reference_fed_its_mask(
    pattern, causal, return_weights
):
    """Dropout in the kernel (#50): values and gradients equal the dense
    float64 reference whose weights are dropped by `ops.dropout_keep_mask`
    (the blockwise kernel's bits, at absolute positions), on the recomputing
    path (chunks recompute their bits in the backward) and on the gathered
    one; the weights returned are before dropout."""
    from keras_attention.ops import dropout_keep_mask

    batch, length, bs, rate, seed = 2, 37, 4, 0.3, 77
    query, key, value, plan, key_mask, allowed = _padded_pattern_case(pattern, causal, bs)
    keep = keras.ops.convert_to_numpy(dropout_keep_mask(seed, batch, 2, length, length, rate))
    dropped = keep / (1.0 - rate)
    cotangent = np.random.default_rng(9).standard_normal((batch, length, 2, 5)).astype("float32")

    def attend(q, k, v):
        return block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=bs,
            window_blocks=pattern["window_blocks"],
            global_blocks=pattern["global_blocks"],
            random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
            global_tokens=pattern["tokens"],
            mask=AttentionMask(causal=causal, key_mask=keras.ops.convert_to_tensor(key_mask)),
            dropout_rate=rate,
            dropout_seed=seed,
            return_weights=return_weights,
        )

    # Compiled on JAX: op by op takes 5-10x longer.
    run = _on_jax_compiled(attend)
    expected, weights = reference_attention(query, key, value, allowed, dropped)
    if return_weights:
        output, got_weights = (keras.ops.convert_to_numpy(x) for x in run(query, key, value))
        np.testing.assert_allclose(got_weights, weights, atol=1e-5)
        np.testing.assert_allclose(output, expected, atol=1e-5)
        return
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(run(query, key, value)), expected, atol=1e-5
    )
    grads = input_gradients(attend, [query, key, value], cotangent, jit=True)
    expected_grads = reference_gradients(query, key, value, allowed, cotangent, dropped)
    for name, grad, want in zip("qkv", grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, want, atol=1e-4, err_msg=f"d{name}")


def test_recomputing_path_gives_zero_rows_and_gradients_without_keys():
    query, key, value = _inputs(2, 21, 21)
    key_mask = np.ones((2, 21), bool)
    key_mask[1] = False  # the second example sees no key at all
    cotangent = np.ones((2, 21, 2, value.shape[-1]), "float32")

    def attend(q, k, v):
        return block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=4,
            window_blocks=3,
            global_blocks=1,
            global_tokens=(9,),
            mask=AttentionMask(key_mask=keras.ops.convert_to_tensor(key_mask)),
        )

    output = keras.ops.convert_to_numpy(_on_jax_compiled(attend)(query, key, value))
    assert np.all(output[1] == 0) and np.all(np.isfinite(output))
    assert np.any(output[0] != 0)
    grads = input_gradients(attend, [query, key, value], cotangent, jit=True)
    for grad in grads:
        assert np.all(np.isfinite(grad))
        assert np.all(grad[1] == 0)
        assert np.any(grad[0] != 0)


@pytest.mark.tf_only
def test_recomputing_path_runs_its_query_blocks_one_at_a_time_in_tf_graphs():
    # The memory-linear path is taken (it is the one with loops), and TF
    # graph mode runs its chunks serially (the default of ten chunks in
    # flight would hold ten chunks' scores); the global-row strip's exact
    # kernel may overlap two key steps.
    from tests.graph_loops import while_loop_parallelism

    query, key, value = _inputs(1, 37, 37)

    def attend(q, k, v):
        return block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=4,
            window_blocks=3,
            global_blocks=1,
            global_tokens=(9,),
        )

    found = while_loop_parallelism(attend, [query, key, value])
    assert len(found) >= 2 and max(found) <= 2, found


# ------------------------------------------------------- score modifiers
# Every `ScoreModifier` change (#50) on both paths of the kernel: the
# recomputing one (its own backward returns the sink logits' and the
# `score_mod` weights' gradients) and the gathered one (autodiff; taken here
# for the dense weights). The pattern holds window, global and random
# blocks and a global token, so the gathered keys, the token keys and the
# global rows (the blockwise kernel on the recomputing path) are all changed.
MODIFIERS = ["soft_cap", "alibi", "sinks", "score_mod", "learned_alibi", "all"]


def _score_modifier(modifier, sinks=None, slopes=None):
    from keras_attention.ops.score_modifier import ScoreModifier
    from keras_attention.ops.score_modifier import alibi_slopes
    from tests.attention_reference import SOFT_CAP
    from tests.attention_reference import learned_alibi
    from tests.attention_reference import modifier_names
    from tests.attention_reference import score_mod

    names = modifier_names(modifier)
    user, weights = None, ()
    if "score_mod" in names:
        user = score_mod
    elif "learned_alibi" in names:
        user, weights = learned_alibi, (slopes,)
    return ScoreModifier(
        soft_cap=SOFT_CAP if "soft_cap" in names else None,
        alibi_slopes=alibi_slopes(2) if "alibi" in names else None,
        sink_logits=sinks if "sinks" in names else None,
        score_mod=user,
        score_mod_weights=weights,
    )


def _spy_rows(monkeypatch):
    """The list each block-row path appends "recomputing" or "gathered" to."""
    ran = []
    for name, label in (
        ("_swept_attention", "recomputing"),
        ("_gathered_block_rows", "gathered"),
    ):
        original = getattr(block_sparse, name)

        def spy(*args, _original=original, _label=label, **kwargs):
            ran.append(_label)
            return _original(*args, **kwargs)

        monkeypatch.setattr(block_sparse, name, spy)
    return ran


@pytest.mark.parametrize("path", ["recomputing", "gathered"])
@pytest.mark.parametrize("modifier", MODIFIERS)
def test_every_score_modifier_on_both_paths_values_and_gradients(modifier, path, monkeypatch):
    """Values and the gradients w.r.t. q, k, v, the sink logits and the
    learned ALiBi slopes equal the float64 NumPy reference of the pattern
    with the modifier (tests/sparse_reference.py)."""
    from tests.attention_reference import modifier_names

    batch, length, bs = 2, 21, 4
    pattern = dict(window_blocks=3, global_blocks=1, random_blocks=2, tokens=(9,))
    query, key, value, plan, key_mask, allowed = _padded_pattern_case(
        pattern, False, bs, length=length
    )
    query, key = query * 2.0, key * 2.0  # logits large enough for the soft cap to bite
    rng = np.random.default_rng(11)
    weights = {
        "sinks": rng.standard_normal(2).astype("float32"),
        "slopes": np.array([0.3, 0.7], "float32"),
    }
    names = modifier_names(modifier)
    learned = [n for n, used in (("sinks", "sinks"), ("slopes", "learned_alibi")) if used in names]
    cotangent = rng.standard_normal((batch, length, 2, value.shape[-1])).astype("float32")

    def attend(q, k, v, *learned_values):
        given = dict(zip(learned, learned_values, strict=True))
        result = block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=bs,
            window_blocks=3,
            global_blocks=1,
            random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
            global_tokens=pattern["tokens"],
            mask=AttentionMask(key_mask=keras.ops.convert_to_tensor(key_mask)),
            modifier=_score_modifier(modifier, given.get("sinks"), given.get("slopes")),
            return_weights=path == "gathered",
        )
        return result[0] if path == "gathered" else result

    ran = _spy_rows(monkeypatch)
    arrays = [query, key, value] + [weights[n] for n in learned]
    expected, _ = reference_attention(
        query, key, value, allowed, modifier=modifier, weights=weights
    )
    output = keras.ops.convert_to_numpy(attend(*arrays))
    assert ran == [path]
    np.testing.assert_allclose(output, expected, atol=2e-5)
    grads = input_gradients(attend, arrays, cotangent, jit=True)
    *expected_grads, expected_learned = reference_gradients(
        query, key, value, allowed, cotangent, modifier=modifier, weights=weights
    )
    expected_grads += [expected_learned[n] for n in learned]
    for name, grad, want in zip(["dq", "dk", "dv"] + learned, grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, want, atol=1e-4, rtol=1e-4, err_msg=name)


def test_score_modifiers_with_dropout_inside_the_recomputing_path():
    """Every modifier and dropout (#50) together on the recomputing path:
    the reference fed the kernel's own keep mask, values and gradients."""
    from keras_attention.ops import dropout_keep_mask

    batch, length, bs, rate, seed = 2, 21, 4, 0.3, 5
    pattern = dict(window_blocks=3, global_blocks=1, random_blocks=2, tokens=(9,))
    query, key, value, plan, key_mask, allowed = _padded_pattern_case(
        pattern, True, bs, length=length
    )
    keep = keras.ops.convert_to_numpy(dropout_keep_mask(seed, batch, 2, length, length, rate))
    dropped = keep / (1.0 - rate)
    weights = {"sinks": np.array([0.4, -0.8], "float32")}
    cotangent = np.random.default_rng(2).standard_normal((batch, length, 2, 5)).astype("float32")

    def attend(q, k, v, sinks):
        return block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=bs,
            window_blocks=3,
            global_blocks=1,
            random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
            global_tokens=pattern["tokens"],
            mask=AttentionMask(causal=True, key_mask=keras.ops.convert_to_tensor(key_mask)),
            modifier=_score_modifier("all", sinks),
            dropout_rate=rate,
            dropout_seed=seed,
        )

    arrays = [query, key, value, weights["sinks"]]
    expected, _ = reference_attention(
        query, key, value, allowed, dropped, modifier="all", weights=weights
    )
    run = attend
    if keras.backend.backend() == "jax":
        import jax

        run = jax.jit(attend)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(run(*arrays)), expected, atol=2e-5)
    grads = input_gradients(attend, arrays, cotangent, jit=True)
    *expected_grads, expected_learned = reference_gradients(
        query, key, value, allowed, cotangent, dropped, modifier="all", weights=weights
    )
    expected_grads.append(expected_learned["sinks"])
    for name, grad, want in zip(("dq", "dk", "dv", "dsinks"), grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, want, atol=1e-4, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("return_weights", [False, True], ids=["recomputing", "gathered"])
def test_rows_without_keys_stay_zero_with_every_modifier(return_weights):
    """A row that sees no key gives zeros (the sink has a zero value), never
    NaN, and passes no gradient to q, k, v or the sink logits."""
    query, key, value = _inputs(2, 21, 21)
    key_mask = np.ones((2, 21), bool)
    key_mask[1] = False

    def attend(q, k, v, sinks):
        result = block_sparse.block_sparse_attention(
            q,
            k,
            v,
            block_size=4,
            window_blocks=3,
            global_blocks=1,
            global_tokens=(9,),
            mask=AttentionMask(key_mask=keras.ops.convert_to_tensor(key_mask[: q.shape[0]])),
            modifier=_score_modifier("all", sinks),
            return_weights=return_weights,
        )
        return result[0] if return_weights else result

    sinks = np.array([0.5, -1.0], "float32")
    output = keras.ops.convert_to_numpy(attend(query, key, value, sinks))
    assert np.all(output[1] == 0) and np.all(np.isfinite(output)) and np.any(output[0] != 0)
    cotangent = np.ones((2, 21, 2, value.shape[-1]), "float32")
    grads = input_gradients(attend, [query, key, value, sinks], cotangent, jit=True)
    for grad in grads[:3]:
        assert np.all(np.isfinite(grad)) and np.all(grad[1] == 0) and np.any(grad[0] != 0)
    # Only example 0 reaches the sinks: the reference's, whose example 1 sees nothing.
    allowed = reference_pattern(21, 21, 4, 3, 1, None, (9,))[None] & key_mask[:, None, :]
    weights = {"sinks": sinks}
    expected, _ = reference_attention(query, key, value, allowed, modifier="all", weights=weights)
    np.testing.assert_allclose(output, expected, atol=2e-5)
    *_, learned = reference_gradients(
        query, key, value, allowed, cotangent, modifier="all", weights=weights
    )
    np.testing.assert_allclose(grads[3], learned["sinks"], atol=1e-4, rtol=1e-4)


def test_statistics_off_the_engines_path_are_refused_by_name():
    """Statistics come from the tiled engine's sweep: a call that takes the
    gathered path (dense weights here) is told why, before any backend op."""
    query, key, value = _inputs(1, 9, 9)
    both = dict(return_weights=True, return_statistics=True)
    with pytest.raises(
        ValueError, match=r"block_sparse_attention: `return_statistics=True` needs.*weights=True"
    ):
        _run(query, key, value, block_size=4, window_blocks=1, **both)


def test_a_bad_scores_argument_is_named():
    from keras_attention.ops.score_modifier import ScoreModifier

    query, key, value = _inputs(1, 9, 9)
    with pytest.raises(TypeError, match="block_sparse_attention.*`modifier`.*modifier=1.5"):
        _run(query, key, value, block_size=4, window_blocks=1, modifier=1.5)
    with pytest.raises(ValueError, match="block_sparse_attention.*sink_logits.*\\(3,\\)"):
        _run(
            query,
            key,
            value,
            block_size=4,
            window_blocks=1,
            modifier=ScoreModifier(sink_logits=keras.ops.zeros((3,))),
        )


# ------------------------------------------------------ the pattern's plan
def _documents(length, starts=(0, 13, 26)):
    """int32 `(T,)` ids of documents starting at `starts` (contiguous)."""
    return np.searchsorted(np.asarray(starts), np.arange(length), side="right") - 1


@pytest.mark.parametrize("documents", [False, True], ids=["padding", "packed documents"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_patterns_tile_plan_is_each_tiles_exact_kind(pattern, causal, documents):
    """`ops.sparse_tile_plan`: the tiles the pattern opens (window, global
    and random blocks, global tokens' columns, global rows' whole rows) are
    visited, full exactly where the pattern and the mask (causal, a key mask
    with padding, packed documents) let every pair through, and skipped
    where nothing is: the NumPy classification of the float64 reference's
    pattern (4 x 4 tiles, 37 tokens: the last block is padded)."""
    from keras_attention import ops as ka_ops
    from tests.ops.kernel_contract_test import exact_tile_kinds

    batch, length, bs = 2, 37, 4
    plan = np.random.default_rng(5).integers(0, 2**20, (3, pattern["random_blocks"]))
    key_mask = np.ones((batch, length), bool)
    key_mask[1, 29:] = False
    shape = (pattern["window_blocks"], pattern["global_blocks"], plan, pattern["tokens"], causal)
    allowed = reference_pattern(length, length, bs, *shape)[None] & key_mask[:, None, :]
    fields = dict(causal=causal, key_mask=keras.ops.convert_to_tensor(key_mask))
    if documents:
        ids = np.broadcast_to(_documents(length), (batch, length))
        allowed = allowed & (ids[:, :, None] == ids[:, None, :])
        fields.update(query_segment_ids=ids, key_segment_ids=ids)
    tile_plan = ka_ops.sparse_tile_plan(
        AttentionMask(**fields),
        length,
        block_size=bs,
        window_blocks=pattern["window_blocks"],
        global_blocks=pattern["global_blocks"],
        random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
        global_tokens=pattern["tokens"],
    )
    kinds = exact_tile_kinds(allowed[:, None], bs, bs)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tile_plan.tiles()), kinds)
    assert all(np.any(kinds == kind) for kind in (0, 1, 2))  # every kind occurs


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(mask="causal"), TypeError, "sparse_tile_plan: `mask` must be .*mask='causal'"),
        (dict(query_length=0), ValueError, "sparse_tile_plan.*query_length=0"),
        (dict(block_size=-4), ValueError, "sparse_tile_plan.*block_size=-4"),
        (dict(global_tokens=(1, -2)), ValueError, r"sparse_tile_plan.*global_tokens=\(1, -2\)"),
        (
            dict(mask=AttentionMask(causal=True, prefix_length=3)),
            ValueError,
            "sparse_tile_plan: the pattern's plan takes rules that are the same",
        ),
    ],
)
def test_the_patterns_tile_plan_refuses_bad_arguments(kwargs, error, message):
    from keras_attention import ops as ka_ops

    arguments = dict(mask=None, query_length=8, block_size=4, window_blocks=1)
    arguments.update(kwargs)
    with pytest.raises(error, match=message):
        ka_ops.sparse_tile_plan(arguments.pop("mask"), arguments.pop("query_length"), **arguments)


def test_the_blockwise_kernel_given_the_patterns_plan_computes_block_sparse_attention():
    """The plan carries its pattern (`TilePlan.pattern`): the blockwise
    kernel restricted by it equals the float64 reference of the pattern."""
    from keras_attention import ops as ka_ops
    from keras_attention.ops.memory_efficient import memory_efficient_attention

    pattern = dict(window_blocks=1, global_blocks=1, random_blocks=1, tokens=(14,))
    query, key, value, plan, key_mask, allowed = _padded_pattern_case(pattern, True, 4, length=21)
    mask = AttentionMask(causal=True, key_mask=keras.ops.convert_to_tensor(key_mask))
    tile_plan = ka_ops.sparse_tile_plan(
        mask,
        21,
        block_size=4,
        window_blocks=1,
        global_blocks=1,
        random_plan=keras.ops.convert_to_tensor(plan.astype("int32")),
        global_tokens=(14,),
    )
    output = memory_efficient_attention(query, key, value, mask=mask, tile_plan=tile_plan)
    expected, _ = reference_attention(query, key, value, allowed)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(output), expected, atol=1e-5)
