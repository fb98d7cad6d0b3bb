"""LuongAttention / AdditiveAttention as drop-ins for Keras' Attention layers.

The reference is Keras' own layer with the same (randomised) weights; where
our contract differs on purpose (a masked query row gets zero weights) the
test says so.
"""

import inspect

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests import reference
from tests.testing import random_inputs
from tests.testing import to_numpy

KERAS_CASES = {
    "dot": lambda: keras.layers.Attention(),
    "dot-scale": lambda: keras.layers.Attention(use_scale=True),
    "concat": lambda: keras.layers.Attention(score_mode="concat"),
    "concat-scale": lambda: keras.layers.Attention(use_scale=True, score_mode="concat"),
    "additive": lambda: keras.layers.AdditiveAttention(),
    "additive-no-scale": lambda: keras.layers.AdditiveAttention(use_scale=False),
}


def _randomise(layer, seed):
    rng = np.random.default_rng(seed)
    for weight in layer.weights:
        weight.assign(rng.uniform(0.3, 2.0, weight.shape).astype("float32"))


@pytest.mark.parametrize("case", sorted(KERAS_CASES))
@pytest.mark.parametrize("rank", [3, 4])
def test_from_keras_gives_keras_outputs(case, rank):
    theirs = KERAS_CASES[case]()
    lead = (2,) if rank == 3 else (2, 3)
    query = random_inputs(lead + (4, 5), seed=1)
    value, key = random_inputs(lead + (6, 5), seed=2), random_inputs(lead + (6, 5), seed=3)
    value_mask = np.random.default_rng(0).random(lead + (6,)) > 0.3
    value_mask[..., 0] = True
    theirs([query, value, key])
    _randomise(theirs, seed=len(case))
    ours_cls = ka.AdditiveAttention if case.startswith("additive") else ka.LuongAttention
    ours = ours_cls.from_keras(theirs)
    assert type(ours) is ours_cls
    assert [w.path.split("/")[-1] for w in ours.weights] == [
        w.path.split("/")[-1] for w in theirs.weights
    ]
    # Keras' value mask works at rank 3 only (it expands a 2-D mask).
    mask = [None, value_mask] if rank == 3 else None
    if mask is None:
        value_mask = None
    expected, expected_weights = theirs(
        [query, value, key], mask=mask, return_attention_scores=True
    )
    got, weights = ours([query, value, key], mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(got), to_numpy(expected), atol=1e-5)
    np.testing.assert_allclose(to_numpy(weights), to_numpy(expected_weights), atol=1e-6)
    # The same weights, called our way.
    np.testing.assert_allclose(
        to_numpy(ours(query, value, key, value_mask=value_mask)), to_numpy(expected), atol=1e-5
    )


def test_from_keras_refuses_other_layers_and_unbuilt_ones():
    with pytest.raises(
        TypeError,
        match=r"LuongAttention.from_keras expects a "
        r"keras.layers.Attention. Received: AdditiveAttention",
    ):
        ka.LuongAttention.from_keras(keras.layers.AdditiveAttention())
    with pytest.raises(ValueError, match="needs a built layer"):
        ka.AdditiveAttention.from_keras(keras.layers.AdditiveAttention())


def test_constructors_take_keras_arguments_in_keras_order():
    for ours, theirs in (
        (ka.LuongAttention, keras.layers.Attention),
        (ka.AdditiveAttention, keras.layers.AdditiveAttention),
    ):
        keras_params = [
            p
            for p in inspect.signature(theirs.__init__).parameters.values()
            if p.name != "self" and p.kind is not p.VAR_KEYWORD
        ]
        params = list(inspect.signature(ours.__init__).parameters.values())[1:]
        assert [p.name for p in params[: len(keras_params)]] == [p.name for p in keras_params]
        assert [p.default for p in params[: len(keras_params)]] == [p.default for p in keras_params]
        extras = [p for p in params[len(keras_params) :] if p.kind is not p.VAR_KEYWORD]
        assert extras and all(p.kind is p.KEYWORD_ONLY for p in extras), ours
    with pytest.raises(TypeError):
        ka.LuongAttention(False, "dot", 0.0, None, 4)  # units is keyword-only


def test_old_positional_score_gets_a_named_error():
    with pytest.raises(
        TypeError,
        match=r"LuongAttention: `use_scale` must be True or "
        r"False. Received: use_scale='general'",
    ):
        ka.LuongAttention("general")


def test_masked_query_row_is_zero_and_other_rows_match_keras():
    # Keras' test_attention_with_mask: the outputs agree; the weights of the
    # masked query row are zero here (our contract), a distribution in Keras.
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")
    value = np.array([[[1.0, 1.0], [1.0, 1.0]]], "float32")
    masks = [np.array([[True, False]]), np.array([[True, False]])]
    for ours, theirs in (
        (ka.LuongAttention(), keras.layers.Attention()),
        (ka.AdditiveAttention(use_scale=False), keras.layers.AdditiveAttention(use_scale=False)),
    ):
        output, weights = ours([query, value], mask=masks, return_attention_scores=True)
        keras_output, keras_weights = theirs(
            [query, value], mask=masks, return_attention_scores=True
        )
        np.testing.assert_allclose(to_numpy(output), [[[1.0, 1.0], [0.0, 0.0]]], atol=1e-6)
        np.testing.assert_allclose(to_numpy(output), to_numpy(keras_output), atol=1e-6)
        np.testing.assert_allclose(to_numpy(weights), [[[1.0, 0.0], [0.0, 0.0]]], atol=1e-6)
        np.testing.assert_allclose(
            to_numpy(weights)[:, 0], to_numpy(keras_weights)[:, 0], atol=1e-6
        )


@pytest.mark.parametrize("make", [ka.LuongAttention, ka.AdditiveAttention])
def test_keras_list_errors_with_keras_wording(make):
    # Keras' test_attention_errors, but for `layer(tensor)`: one input is
    # self-attention here.
    layer = make(name="att")
    tensor = np.array([[[1.0, 1.0], [1.0, 1.0]]], "float32")
    name = rf"{make.__name__} \(layer 'att'\)"
    with pytest.raises(ValueError, match=name + r".*length 2 or 3.*Received length: 4"):
        layer([tensor, tensor, tensor, tensor])
    with pytest.raises(
        ValueError, match=name + r".*layer mask must be a list.*Received: mask=tensor"
    ):
        layer([tensor, tensor], mask=tensor)
    with pytest.raises(ValueError, match=name + r".*length 2 or 3.*Received length: 1"):
        layer([tensor, tensor], mask=[tensor[..., 0]])
    with pytest.raises(ValueError, match=name + r".*`value_mask` was given twice"):
        layer([tensor, tensor], mask=[None, tensor[..., 0]], value_mask=tensor[..., 0])
    np.testing.assert_allclose(
        to_numpy(layer(tensor)), to_numpy(layer([tensor, tensor])), atol=1e-6
    )


@pytest.mark.parametrize(
    "make", [lambda: ka.LuongAttention(score_mode="general"), lambda: ka.AdditiveAttention(units=3)]
)
def test_nd_inputs_attend_over_the_second_last_axis(make):
    # (B, H, T, F): every (b, h) is its own sequence; masks carry (B, H).
    rng = np.random.default_rng(0)
    query, value = random_inputs((2, 3, 4, 5), seed=1), random_inputs((2, 3, 6, 7), seed=2)
    query_mask, value_mask = rng.random((2, 3, 4)) > 0.3, rng.random((2, 3, 6)) > 0.3
    value_mask[..., 0] = True
    layer = make()
    output, weights = layer(
        [query, value],
        mask=[query_mask, value_mask],
        return_attention_scores=True,
        use_causal_mask=True,
    )
    assert tuple(output.shape) == (2, 3, 4, 7) and tuple(weights.shape) == (2, 3, 4, 6)
    for h in range(3):
        row_out, row_weights = layer(
            query[:, h],
            value[:, h],
            query_mask=query_mask[:, h],
            value_mask=value_mask[:, h],
            use_causal_mask=True,
            return_attention_scores=True,
        )
        np.testing.assert_allclose(to_numpy(output)[:, h], to_numpy(row_out), atol=1e-6)
        np.testing.assert_allclose(to_numpy(weights)[:, h], to_numpy(row_weights), atol=1e-6)
    # One sequence against NumPy.
    if isinstance(layer, ka.LuongAttention):
        scores = query[:, 1] @ to_numpy(layer.kernel) @ value[:, 1].transpose(0, 2, 1)
        mask = reference.combined_mask(2, 4, 6, query_mask[:, 1], value_mask[:, 1], causal=True)
        expected, _ = reference.attend(scores, value[:, 1], mask)
        np.testing.assert_allclose(to_numpy(output)[:, 1], expected, atol=1e-5)


def test_nd_symbolic_shapes_and_functional_model():
    query, value = keras.Input((8, 6, 4)), keras.Input((8, 5, 4))
    output, scores = ka.LuongAttention()([query, value], return_attention_scores=True)
    assert tuple(output.shape) == (None, 8, 6, 4) and tuple(scores.shape) == (None, 8, 6, 5)
    model = keras.Model([query, value], output)
    assert model([np.ones((2, 8, 6, 4)), np.ones((2, 8, 5, 4))]).shape == (2, 8, 6, 4)


def test_nd_leading_dims_must_agree():
    with pytest.raises(ValueError, match=r"LuongAttention .*same leading .*\(2, 3, 4, 5\)"):
        ka.LuongAttention()(np.ones((2, 3, 4, 5), "float32"), np.ones((2, 2, 4, 5), "float32"))


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(dropout=1.5), r"`dropout`.*dropout=1.5"),
        (dict(units=-1), r"`units`.*units=-1"),
        (dict(seed="x"), r"`seed`.*seed='x'"),
        (dict(score="concat", units=0), r"`units`.*units=0"),
    ],
)
def test_attention_pooling_errors_name_attention_pooling(arguments, message):
    with pytest.raises((ValueError, TypeError), match=r"^AttentionPooling: " + message):
        ka.AttentionPooling(**arguments)


def test_keras_masks_of_the_list_fill_the_entries_mask_leaves_none():
    # With `mask=` given, Keras fills `query_mask` with the list's Keras
    # masks; the value's Embedding mask applies where `mask` says None.
    layer = ka.LuongAttention()
    q_in, v_in = keras.Input((3, 4)), keras.Input((5,), dtype="int32")
    q_mask_in = keras.Input((3,), dtype="bool")
    embed = keras.layers.Embedding(10, 4, mask_zero=True)
    model = keras.Model([q_in, v_in, q_mask_in], layer([q_in, embed(v_in)], mask=[q_mask_in, None]))
    query = random_inputs((2, 3, 4), seed=1)
    tokens = np.array([[1, 2, 0, 0, 0], [3, 4, 5, 6, 7]])
    query_mask = np.array([[True, True, False], [True, True, True]])
    expected = layer(query, embed(tokens), query_mask=query_mask, value_mask=tokens != 0)
    np.testing.assert_allclose(
        to_numpy(model([query, tokens, query_mask])), to_numpy(expected), atol=1e-6
    )
