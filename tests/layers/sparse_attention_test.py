import keras
import numpy as np
import pytest

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import SparseAttention
from keras_attention.layers import capture_attention
from tests.attention_reference import SOFT_CAP
from tests.attention_reference import modifier_names
from tests.attention_reference import score_mod
from tests.sparse_reference import reference_attention
from tests.sparse_reference import reference_pattern
from tests.testing import random_inputs
from tests.testing import run_layer_contract_test
from tests.testing import to_numpy


def _exact_twin(layer, query, value=None, **kwargs):
    """An exact MultiHeadAttention with `layer`'s trainable weights."""
    config = {
        k: v
        for k, v in layer.get_config().items()
        if k
        in (
            "num_heads",
            "key_dim",
            "value_dim",
            "num_key_value_heads",
            "use_bias",
            "output_shape",
            "use_gate",
        )
    }
    exact = MultiHeadAttention(memory_efficient=False, **config, **kwargs)
    exact(query, value)
    exact.set_weights(
        [
            w.numpy() if hasattr(w, "numpy") else keras.ops.convert_to_numpy(w)
            for w in layer.trainable_weights
        ]
    )
    return exact


CASES = {
    "bigbird": dict(block_size=4, window_blocks=3, global_blocks=1, random_blocks=2),
    "longformer": dict(
        block_size=4, window_blocks=3, global_blocks=0, random_blocks=0, global_tokens=[0, 18]
    ),
    "local": dict(block_size=3, window_blocks=2, global_blocks=0, random_blocks=0),
    "grouped": dict(
        block_size=4, window_blocks=1, global_blocks=1, random_blocks=3, num_key_value_heads=1
    ),
}


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_exact_attention_under_the_equivalent_mask(case, causal):
    options = dict(CASES[case])
    batch, length = 2, 29  # odd: padded to whole blocks internally
    query = random_inputs((batch, length, 8), seed=1)
    layer = SparseAttention(num_heads=2, key_dim=4, seed=3, **options)
    padding = np.arange(length)[None, :] < np.array([[length], [20]])  # (B, T)
    output, scores = layer(
        query, query_mask=padding, use_causal_mask=causal, return_attention_scores=True
    )
    exact = _exact_twin(layer, query)
    allowed = reference_pattern(
        length,
        length,
        options["block_size"],
        options["window_blocks"],
        options["global_blocks"],
        keras.ops.convert_to_numpy(layer.random_plan),
        tuple(options.get("global_tokens") or ()),
        causal,
    )
    expected, expected_scores = exact(
        query,
        query_mask=padding,
        attention_mask=np.broadcast_to(allowed, (batch,) + allowed.shape),
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(to_numpy(output), to_numpy(expected), atol=1e-5)
    # Scores of padded query rows are not specified (those rows output zero).
    rows = padding[:, None, :, None]
    np.testing.assert_allclose(to_numpy(scores) * rows, to_numpy(expected_scores) * rows, atol=1e-5)


def test_trainable_weights_are_those_of_multi_head_attention():
    query, value = random_inputs((1, 9, 8)), random_inputs((1, 11, 6), seed=2)
    sparse = SparseAttention(2, 4, block_size=4, global_blocks=1, use_gate=True, seed=0)
    exact = MultiHeadAttention(2, 4, use_gate=True)
    sparse(query, value)
    exact(query, value)

    def strip(w):
        return w.path.split("/", 1)[1]

    assert [strip(w) for w in sparse.trainable_weights] == [
        strip(w) for w in exact.trainable_weights
    ]
    assert [w.shape for w in sparse.trainable_weights] == [w.shape for w in exact.trainable_weights]
    assert [strip(w) for w in sparse.non_trainable_weights] == ["random_plan"]


def test_random_plan_comes_from_the_seed_and_survives_saving(tmp_path):
    query = random_inputs((1, 40, 8))
    plans = []
    for seed in (1, 1, 2):
        layer = SparseAttention(2, 4, block_size=4, global_blocks=1, seed=seed)
        layer(query)
        plans.append(keras.ops.convert_to_numpy(layer.random_plan))
    np.testing.assert_array_equal(plans[0], plans[1])
    assert not np.array_equal(plans[0], plans[2])
    model = keras.Sequential(
        [keras.Input((40, 8)), SparseAttention(2, 4, block_size=4, global_blocks=1)]
    )
    path = str(tmp_path / "sparse.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded.layers[0].random_plan),
        keras.ops.convert_to_numpy(model.layers[0].random_plan),
    )
    np.testing.assert_array_equal(to_numpy(loaded(query)), to_numpy(model(query)))


def test_capture_records_the_dense_weights():
    query = random_inputs((1, 13, 8))
    layer = SparseAttention(2, 4, block_size=4, global_blocks=1, name="sparse", seed=0)
    _, scores = layer(query, return_attention_scores=True)
    with capture_attention(layer) as captured:
        layer(query)
    np.testing.assert_allclose(captured.scores["sparse"][0], to_numpy(scores), atol=1e-6)
    np.testing.assert_allclose(captured.scores["sparse"][0].sum(-1), 1.0, atol=1e-5)


def test_dropout_only_in_training():
    query = random_inputs((1, 12, 8))
    layer = SparseAttention(2, 4, block_size=4, global_blocks=1, dropout=0.5, seed=0)
    plain = layer(query)
    np.testing.assert_allclose(to_numpy(layer(query, training=False)), to_numpy(plain))
    assert not np.allclose(to_numpy(layer(query, training=True)), to_numpy(plain))


def test_dropout_stays_on_the_memory_linear_path(monkeypatch):
    """Training with dropout (#50): the recomputing kernel runs, dropping
    inside with the layer's rate and a seed drawn per call (each call its
    own mask). The values are the kernel's
    (tests/ops/block_sparse_test.py, against the reference fed its mask)."""
    from keras_attention.ops import block_sparse

    rates = []
    original = block_sparse._swept_attention

    def spy(*args, **kwargs):
        rates.append(kwargs["dropout_rate"])
        return original(*args, **kwargs)

    monkeypatch.setattr(block_sparse, "_swept_attention", spy)
    query = random_inputs((1, 16, 8))
    layer = SparseAttention(2, 4, block_size=4, window_blocks=1, random_blocks=0, dropout=0.5)
    first, second = (to_numpy(layer(query, training=True)) for _ in range(2))
    assert rates == pytest.approx([0.5, 0.5])
    assert np.all(np.isfinite(first)) and not np.allclose(first, second, atol=1e-3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=0), "block_size=0"),
        (dict(block_size=-4), "block_size=-4"),
        (dict(window_blocks=0), "window_blocks=0"),
        (dict(global_blocks=-1), "global_blocks=-1"),
        (dict(random_blocks=1.5), "random_blocks=1.5"),
        (dict(global_tokens=[1, -2]), "global_tokens=-2"),
        (dict(global_tokens="0"), "global_tokens='0'"),
        # MultiHeadAttention's kernel switches are not SparseAttention's.
        (dict(memory_efficient=False), "'memory_efficient': False"),
        # Its score modifiers are (#50), checked as MultiHeadAttention checks them.
        (dict(score_mod=lambda score: score), "`score_mod` is called as .* with 5 positional"),
        (dict(score_mod=3), "score_mod=3"),
        (dict(logit_soft_cap=0), "logit_soft_cap"),
        (dict(alibi=[0.5]), r"one slope per query head, shape \(2,\)"),
        (dict(attention_sinks="yes"), "attention_sinks='yes'"),
    ],
)
def test_invalid_constructor_arguments_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=f"SparseAttention.*{message}"):
        SparseAttention(2, 4, **kwargs)


# ----------------------------------------------- every length: the dense switch
def _spy_paths(monkeypatch):
    """The list each SparseAttention kernel run appends "dense" or "sparse" to."""
    from keras_attention.ops import block_sparse
    from keras_attention.ops import dense_attention

    ran = []
    for owner, name, label in (
        (dense_attention, "dense_attention", "dense"),
        (block_sparse, "block_sparse_attention", "sparse"),
    ):
        original = getattr(owner, name)

        def spy(*args, _original=original, _label=label, **kwargs):
            ran.append(_label)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    return ran


def _weight(layer, name):
    """The layer's weight `name` (`"query/kernel"`, `"sinks"`) as NumPy."""
    (found,) = [w for w in layer.weights if w.path.split("/", 1)[1] == name]
    return to_numpy(found)


def _numpy_sparse(layer, query, allowed, modifier=None):
    """NumPy: our projections' weights, dense attention under `allowed`, the
    logits changed by `modifier` (`tests/attention_reference.py`'s names)."""
    wq, bq, wk, bk, wv, bv, wo, bo = [
        _weight(layer, f"{name}/{kind}")
        for name in ("query", "key", "value", "attention_output")
        for kind in ("kernel", "bias")
    ]
    heads = [np.einsum("btf,fhd->bthd", query, w) + b for w, b in ((wq, bq), (wk, bk), (wv, bv))]
    learned = {"sinks": _weight(layer, "sinks")} if layer.attention_sinks else None
    attended, weights = reference_attention(*heads, allowed, modifier=modifier, weights=learned)
    return np.einsum("bthd,hdo->bto", attended, wo) + bo, weights


@pytest.mark.parametrize(
    "causal, length, path",
    [
        (False, 1, "dense"),
        (False, 12, "dense"),
        (False, 13, "sparse"),
        (True, 1, "dense"),
        (True, 16, "dense"),
        (True, 17, "sparse"),
    ],
)
def test_both_sides_of_the_dense_switch_match_the_pattern_reference(
    monkeypatch, causal, length, path
):
    # block 4, window 3, 1 global block: the pattern covers every key up to
    # 3 blocks (12 tokens); causal, up to 4 blocks (the window looks back 2
    # blocks and block 0 is global). One token more runs the sparse kernel.
    options = dict(block_size=4, window_blocks=3, global_blocks=1, random_blocks=1)
    layer = SparseAttention(2, 4, seed=5, bias_initializer="random_normal", **options)
    query = random_inputs((2, length, 8), seed=1)
    padding = np.arange(length)[None, :] < np.array([[length], [max(length - 3, 1)]])
    layer.build(query.shape)
    ran = _spy_paths(monkeypatch)
    output, scores = layer(
        query, query_mask=padding, use_causal_mask=causal, return_attention_scores=True
    )
    assert ran == [path]
    allowed = reference_pattern(
        length, length, 4, 3, 1, keras.ops.convert_to_numpy(layer.random_plan), (), causal
    )
    allowed = allowed[None] & padding[:, None, :] & padding[:, :, None]
    expected, expected_scores = _numpy_sparse(layer, query, allowed)
    # A padded query row is a zero attention result: the output bias.
    expected = np.where(padding[..., None], expected, to_numpy(layer.trainable_weights[-1]))
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(scores), expected_scores, atol=1e-5)
    assert layer.covers_every_key(length, length, causal) == (path == "dense")


@pytest.mark.parametrize("causal, length, path", [(False, 12, "dense"), (True, 21, "sparse")])
def test_packed_documents_on_both_sides_of_the_dense_switch(monkeypatch, causal, length, path):
    """`segment_ids` (#36): a query sees its own document's keys inside the
    pattern, against the NumPy reference; in a functional model too, and a
    wrong shape is named."""
    options = dict(block_size=4, window_blocks=3, global_blocks=1, random_blocks=1)
    layer = SparseAttention(2, 4, seed=5, bias_initializer="random_normal", **options)
    query = random_inputs((2, length, 8), seed=3)
    ids = (np.arange(length)[None, :] >= np.array([[5], [length - 6]])).astype("int32")
    layer.build(query.shape)
    ran = _spy_paths(monkeypatch)
    output = layer(query, use_causal_mask=causal, segment_ids=ids)
    assert ran == [path]
    allowed = reference_pattern(
        length, length, 4, 3, 1, keras.ops.convert_to_numpy(layer.random_plan), (), causal
    )
    allowed = allowed[None] & (ids[:, :, None] == ids[:, None, :])
    expected, _ = _numpy_sparse(layer, query, allowed)
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-5)
    inputs = keras.Input((length, 8)), keras.Input((length,), dtype="int32")
    model = keras.Model(inputs, layer(inputs[0], use_causal_mask=causal, segment_ids=inputs[1]))
    np.testing.assert_allclose(to_numpy(model([query, ids])), expected, atol=1e-5)
    with pytest.raises(ValueError, match="SparseAttention.*segment_ids.*shape"):
        layer(query, segment_ids=ids[:, :-1])


@pytest.mark.parametrize("length", [1, 10, 64, 65, 4096])
def test_defaults_run_at_every_length(monkeypatch, length):
    layer = SparseAttention(num_heads=2, key_dim=4, seed=0)
    query = random_inputs((1, length, 8), seed=2)
    layer.build(query.shape)
    ran = _spy_paths(monkeypatch)
    output = to_numpy(layer(query))
    assert output.shape == (1, length, 8) and np.isfinite(output).all()
    # Defaults (64-token blocks, window 3, 2 global): dense up to 4 blocks.
    assert ran == ["dense" if length <= 256 else "sparse"]
    if length <= 256:
        expected, _ = _numpy_sparse(layer, query, np.ones((1, length, length), bool))
        np.testing.assert_allclose(output, expected, atol=1e-5)
    assert not layer.covers_every_key(257, 257)


def test_more_global_blocks_than_the_sequence_has_is_exact_attention(monkeypatch):
    layer = SparseAttention(2, 4, block_size=4, global_blocks=3, seed=0)
    query = random_inputs((1, 7, 8))
    layer.build(query.shape)
    ran = _spy_paths(monkeypatch)
    expected, _ = _numpy_sparse(layer, query, np.ones((1, 7, 7), bool))
    np.testing.assert_allclose(to_numpy(layer(query)), expected, atol=1e-5)
    assert ran == ["dense"]
    assert tuple(layer(keras.Input((7, 8))).shape) == (None, 7, 8)


def test_global_token_outside_the_sequence_and_cache_are_rejected():
    with pytest.raises(ValueError, match="global_tokens.*length 7"):
        SparseAttention(2, 4, block_size=4, global_blocks=0, global_tokens=[9])(
            random_inputs((1, 7, 8))
        )
    layer = SparseAttention(2, 4, block_size=4, global_blocks=1)
    layer(random_inputs((1, 8, 8)))
    with pytest.raises((TypeError, ValueError), match="cache"):
        layer(
            random_inputs((1, 1, 8)),
            cache=np.zeros((1, 2, 8, 2, 4), "float32"),
            cache_update_index=0,
        )


def test_layer_contract(tmp_path):
    def make_layer(**kwargs):
        return SparseAttention(
            2,
            4,
            block_size=2,
            global_blocks=1,
            random_blocks=1,
            global_tokens=[3],
            dropout=0.1,
            seed=0,
            **kwargs,
        )

    run_layer_contract_test(make_layer, tmp_path, expected_cross_output_shape=(2, 5, 8))


# ------------------------------------------------- score modifiers (#50)
def _with_modifier(modifier, **options):
    names = modifier_names(modifier)
    return SparseAttention(
        2,
        4,
        seed=5,
        bias_initializer="random_normal",
        logit_soft_cap=SOFT_CAP if "soft_cap" in names else None,
        alibi=True if "alibi" in names else None,
        attention_sinks="sinks" in names,
        score_mod=score_mod if "score_mod" in names else None,
        **options,
    )


@pytest.mark.parametrize(
    "modifier, causal, length, path",
    [
        (modifier, False, length, path)
        for modifier in ("soft_cap", "score_mod", "all")
        for length, path in ((12, "dense"), (13, "sparse"))
    ]
    + [("all", True, 17, "sparse")],  # the causal pattern: global rows see the past only
)
def test_score_modifiers_on_both_sides_of_the_dense_switch(
    monkeypatch, modifier, causal, length, path
):
    """A soft cap, a `score_mod`, and every modifier with ALiBi and learned
    sinks, against the float64 reference of the pattern: exact attention
    below the switch; above it the memory-linear path (no weights asked
    for) and the gathered one (weights returned)."""
    options = dict(block_size=4, window_blocks=3, global_blocks=1, random_blocks=1)
    layer = _with_modifier(modifier, **options)
    query = random_inputs((2, length, 8), seed=1) * 2.0  # logits the soft cap bends
    padding = np.arange(length)[None, :] < np.array([[length], [length - 3]])
    layer.build(query.shape)
    if layer.attention_sinks:
        layer.sinks.assign([0.5, -1.0])
    ran = _spy_paths(monkeypatch)
    output = layer(query, query_mask=padding, use_causal_mask=causal)
    weights_output, scores = layer(
        query, query_mask=padding, use_causal_mask=causal, return_attention_scores=True
    )
    assert ran == [path, path]
    allowed = reference_pattern(
        length, length, 4, 3, 1, keras.ops.convert_to_numpy(layer.random_plan), (), causal
    )
    allowed = allowed[None] & padding[:, None, :] & padding[:, :, None]
    expected, expected_scores = _numpy_sparse(layer, query, allowed, modifier)
    expected = np.where(padding[..., None], expected, _weight(layer, "attention_output/bias"))
    np.testing.assert_allclose(to_numpy(output), expected, atol=2e-5)
    np.testing.assert_allclose(to_numpy(weights_output), expected, atol=2e-5)
    np.testing.assert_allclose(to_numpy(scores), expected_scores, atol=2e-5)


def test_score_modifiers_survive_a_keras_file(tmp_path):
    layer = SparseAttention(
        2,
        4,
        block_size=4,
        global_blocks=1,
        random_blocks=1,
        seed=0,
        logit_soft_cap=5.0,
        alibi=[0.5, 0.25],
        attention_sinks=True,
        score_mod=score_mod,
    )
    x = random_inputs((2, 13, 8))  # past the dense switch: the sparse kernel
    model = keras.Sequential([keras.Input((13, 8)), layer])
    layer.sinks.assign([0.3, -0.2])
    path = str(tmp_path / "sparse_modifiers.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(model(x)), atol=1e-6)
    config = loaded.layers[-1].get_config()
    assert config["logit_soft_cap"] == 5.0 and config["attention_sinks"] is True
    assert config["alibi"] == [0.5, 0.25] and loaded.layers[-1].score_mod is score_mod
    np.testing.assert_allclose(_weight(loaded.layers[-1], "sinks"), [0.3, -0.2], rtol=1e-6)


def test_a_score_mod_returning_the_wrong_shape_is_refused_naming_the_layer():
    def doubled(score, batch, head, q_idx, k_idx):
        return keras.ops.concatenate([score, score], axis=-1)

    layer = SparseAttention(2, 4, block_size=4, global_blocks=1, score_mod=doubled)
    for length in (12, 13):  # both sides of the dense switch
        with pytest.raises(ValueError, match="SparseAttention.*`score_mod` doubled must return"):
            layer(random_inputs((1, length, 8)))
