"""`keras_attention.analysis` (#38): rollout and flow against closed forms and
networkx's maximum flow, head importance against central finite differences
of a float64 NumPy loss, and the model-level helpers end to end."""

import itertools

import keras
import networkx as nx
import numpy as np
import pytest

import keras_attention as ka
from keras_attention import analysis
from tests.attention_reference import reference
from tests.testing import to_numpy

BACKEND = keras.backend.backend()


# ------------------------------------------------------------------ rollout
def test_rollout_matches_hand_derived_products():
    first = np.array([[1.0, 0.0], [0.5, 0.5]])
    second = np.array([[0.0, 1.0], [1.0, 0.0]])
    # 0.5 * A + 0.5 * I: rows already sum to 1.
    mixed_first = np.array([[1.0, 0.0], [0.25, 0.75]])
    mixed_second = np.array([[0.5, 0.5], [0.5, 0.5]])
    by_hand = np.array([[0.625, 0.375], [0.625, 0.375]])  # mixed_second @ mixed_first
    weights = [first[None, None], second[None, None]]
    np.testing.assert_allclose(analysis.attention_rollout(weights)[0], by_hand, atol=1e-12)
    steps = analysis.attention_rollout(weights, all_layers=True)
    assert steps.shape == (2, 1, 2, 2)
    np.testing.assert_allclose(steps[0, 0], mixed_first, atol=1e-12)
    np.testing.assert_allclose(steps[1, 0], by_hand, atol=1e-12)
    assert np.allclose(mixed_second @ mixed_first, by_hand)  # the hand product itself
    # Rank 3 (a single-head layer) is one head.
    np.testing.assert_allclose(
        analysis.attention_rollout([first[None], second[None]])[0], by_hand, atol=1e-12
    )


def test_rollout_averages_the_chosen_heads():
    attending = np.array([[1.0, 0.0], [0.5, 0.5]])
    identity = np.eye(2)
    weights = [np.stack([attending, identity])[None]]  # (1, 2 heads, 2, 2)
    # Mean of both heads: [[1, 0], [0.25, 0.75]]; mixed with I: [[1, 0], [0.125, 0.875]].
    np.testing.assert_allclose(
        analysis.attention_rollout(weights)[0], [[1.0, 0.0], [0.125, 0.875]], atol=1e-12
    )
    np.testing.assert_allclose(
        analysis.attention_rollout(weights, heads=0)[0], [[1.0, 0.0], [0.25, 0.75]], atol=1e-12
    )
    np.testing.assert_allclose(analysis.attention_rollout(weights, heads=[1])[0], identity)
    np.testing.assert_allclose(
        analysis.attention_rollout(weights, heads=[0, 1])[0],
        analysis.attention_rollout(weights)[0],
    )


@pytest.mark.parametrize("residual_weight", [0.5, 0.2, 0.0])
def test_rollout_of_uniform_attention_has_a_closed_form(residual_weight):
    # A' = (1 - r) J / L + r I, and J / L is idempotent: A'^n = r^n I + (1 - r^n) J / L.
    layers, length, r = 3, 4, residual_weight
    uniform = np.full((2, 3, length, length), 1.0 / length)
    expected = r**layers * np.eye(length) + (1 - r**layers) / length
    rollout = analysis.attention_rollout([uniform] * layers, residual_weight=r)
    np.testing.assert_allclose(rollout, np.broadcast_to(expected, (2, length, length)), atol=1e-12)


def test_a_row_with_nothing_to_attend_to_keeps_its_token():
    # A fully masked query row has zero weights: mixed with I it is 0.5 e_i,
    # renormalised e_i; without the residual it stays zero.
    weights = [np.array([[0.0, 0.0], [0.5, 0.5]])[None, None]]
    np.testing.assert_allclose(
        analysis.attention_rollout(weights)[0], [[1.0, 0.0], [0.25, 0.75]], atol=1e-12
    )
    np.testing.assert_allclose(
        analysis.attention_rollout(weights, residual_weight=0.0)[0], [[0.0, 0.0], [0.5, 0.5]]
    )


# --------------------------------------------------------------------- flow
def _random_weights(rng, layers, batch, heads, length, causal=False):
    weights = []
    for _ in range(layers):
        w = rng.dirichlet(np.ones(length), size=(batch, heads, length))
        if causal:  # zero capacities: a sparser graph
            w = np.tril(w)
            w = w / w.sum(-1, keepdims=True)
        weights.append(w)
    return weights


def _networkx_flow(weights, residual_weight=0.5):
    """The paper's construction, written afresh with networkx: head mean,
    residual mix, an edge per weight from layer l + 1's token to layer l's,
    `maximum_flow_value` from each top token to each input token, rows
    normalised."""
    batch, length = weights[0].shape[0], weights[0].shape[-1]
    result = np.zeros((batch, length, length))
    for b in range(batch):
        graph = nx.DiGraph()
        for layer, w in enumerate(weights):
            mixed = (1 - residual_weight) * w[b].mean(0) + residual_weight * np.eye(length)
            mixed = mixed / mixed.sum(-1, keepdims=True)
            for i, j in itertools.product(range(length), repeat=2):
                if mixed[i, j] > 0:
                    graph.add_edge((layer + 1, i), (layer, j), capacity=mixed[i, j])
        top = len(weights)
        for i, j in itertools.product(range(length), repeat=2):
            result[b, i, j] = nx.maximum_flow_value(
                graph, (top, i), (0, j), flow_func=nx.algorithms.flow.edmonds_karp
            )
    return result / result.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    "seed, layers, causal, residual_weight",
    [
        (0, 3, False, 0.5),
        (1, 2, True, 0.5),
        (2, 4, False, 0.2),
        (3, 3, True, 0.0),
        (4, 4, False, 0.5),
    ],
)
def test_flow_matches_networkx_maximum_flow_on_random_graphs(seed, layers, causal, residual_weight):
    rng = np.random.default_rng(seed)
    weights = _random_weights(rng, layers, batch=2, heads=2, length=5, causal=causal)
    flow = analysis.attention_flow(weights, residual_weight=residual_weight)
    np.testing.assert_allclose(flow, _networkx_flow(weights, residual_weight), atol=1e-6)
    # Flow is not rollout (a flow equal to rollout would pass a weaker test).
    rollout = analysis.attention_rollout(weights, residual_weight=residual_weight)
    assert np.abs(flow - rollout).max() > 1e-3


def test_flow_through_one_layer_is_its_mixed_attention():
    weights = _random_weights(np.random.default_rng(4), 1, batch=1, heads=3, length=4)
    np.testing.assert_allclose(
        analysis.attention_flow(weights), analysis.attention_rollout(weights), atol=1e-12
    )


# --------------------------------------------------------- model end to end
def _encoder_model(num_heads=2, length=5, features=8, name="encoder"):
    inputs = keras.Input((length, features))
    x = ka.TransformerEncoderBlock(
        num_heads=num_heads, key_dim=4, intermediate_dim=16, name="block_0"
    )(inputs)
    x = ka.TransformerEncoderBlock(
        num_heads=num_heads, key_dim=4, intermediate_dim=16, name="block_1"
    )(x)
    pooled = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="logits")(pooled), name=name)


def test_model_rollout_and_flow_of_two_encoder_blocks():
    model = _encoder_model()
    x = np.random.default_rng(5).normal(size=(2, 5, 8)).astype("float32")
    # The weights each block's attention returns, asked for directly.
    expected_weights = []
    hidden = keras.ops.convert_to_tensor(x)
    for name in ("block_0", "block_1"):
        block = model.get_layer(name)
        _, scores = block.self_attention(hidden, hidden, return_attention_scores=True)
        expected_weights.append(to_numpy(scores))
        hidden = block(hidden)
    mixed = [0.5 * w.mean(1) + 0.5 * np.eye(5) for w in expected_weights]
    np.testing.assert_allclose(
        analysis.model_attention_rollout(model, x), mixed[1] @ mixed[0], atol=1e-5
    )
    np.testing.assert_allclose(
        analysis.model_attention_flow(model, x), _networkx_flow(expected_weights), atol=1e-5
    )
    # `layers` picks and orders them: the second block alone.
    np.testing.assert_allclose(
        analysis.model_attention_rollout(model, x, layers=["block_1/self_attention"]),
        mixed[1],
        atol=1e-5,
    )


def test_model_rollout_refuses_cross_attention_naming_the_layer():
    query, memory = keras.Input((3, 4)), keras.Input((5, 4))
    cross = ka.MultiHeadAttention(2, 2, name="cross")(query, memory)
    model = keras.Model([query, memory], cross)
    inputs = [np.ones((1, 3, 4), "float32"), np.ones((1, 5, 4), "float32")]
    with pytest.raises(ValueError, match=r"model_attention_rollout: layer '.*cross'.*layers=None"):
        analysis.model_attention_rollout(model, inputs)


# ---------------------------------------------------------- head importance
def _pooled_model(rng, features=6, length=5, classes=3):
    """Two MultiHeadAttention layers (2 and 3 heads), mean pooling, a dense
    head; every weight random, and its float64 NumPy twin."""
    inputs = keras.Input((length, features))
    first = ka.MultiHeadAttention(2, 3, name="first")
    second = ka.MultiHeadAttention(3, 2, name="second")
    hidden = first(inputs, inputs)
    hidden = second(hidden, hidden)
    dense = keras.layers.Dense(classes, name="logits")
    model = keras.Model(inputs, dense(keras.layers.GlobalAveragePooling1D()(hidden)))
    model.set_weights([rng.normal(scale=0.7, size=w.shape) for w in model.get_weights()])

    def numpy_weights(layer):
        return {w.path.split("/", 1)[1]: to_numpy(w.value) for w in layer.weights}

    kernel, bias = (to_numpy(w) for w in dense.weights)
    allowed = np.ones((1, 1, length, length), bool)

    def numpy_loss(x, y, first_mask, second_mask):
        h, _ = reference(numpy_weights(first), x, x, allowed, 2, 2, False, head_mask=first_mask)
        h, _ = reference(numpy_weights(second), h, h, allowed, 3, 3, False, head_mask=second_mask)
        logits = h.mean(1) @ kernel + bias
        logits = logits - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return -log_probs[np.arange(len(y)), y].mean()

    return model, numpy_loss


def _batches(rng, count=3, size=4, length=5, features=6):
    return [
        (
            rng.normal(size=(size, length, features)).astype("float32"),
            rng.integers(0, 3, size=(size,)),
        )
        for _ in range(count)
    ]


def _finite_difference_gradients(numpy_loss, x, y, step=1e-5):
    """Central differences of the float64 loss w.r.t. each head's mask."""
    masks = [np.ones(2), np.ones(3)]
    gradients = []
    for index, mask in enumerate(masks):
        gradient = np.zeros(len(mask))
        for head in range(len(mask)):
            up, down = [m.copy() for m in masks], [m.copy() for m in masks]
            up[index][head] += step
            down[index][head] -= step
            gradient[head] = (numpy_loss(x, y, *up) - numpy_loss(x, y, *down)) / (2 * step)
        gradients.append(gradient)
    return gradients


def test_head_importance_is_the_mean_absolute_gradient_by_finite_differences():
    rng = np.random.default_rng(6)
    model, numpy_loss = _pooled_model(rng)
    batches = _batches(rng)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    importance = analysis.head_importance(model, batches, loss)
    assert [path.rsplit("/", 1)[-1] for path in importance] == ["first", "second"]
    per_batch = [_finite_difference_gradients(numpy_loss, x, y) for x, y in batches]
    for index, path in enumerate(importance):
        gradients = np.array([g[index] for g in per_batch])  # (batches, H)
        np.testing.assert_allclose(
            importance[path], np.abs(gradients).mean(0), rtol=1e-3, atol=1e-7
        )
    # A head whose gradient changes sign between batches: the mean of the
    # absolute values differs from the absolute mean here.
    signs = np.sign(np.concatenate([np.concatenate(g) for g in per_batch]).reshape(3, -1))
    assert np.any(signs.min(0) != signs.max(0))
    normalized = analysis.head_importance(model, batches, loss, normalize=True)
    for path in importance:
        np.testing.assert_allclose(
            normalized[path], importance[path] / np.linalg.norm(importance[path]), rtol=1e-6
        )


def test_head_importance_reaches_heads_inside_transformer_blocks():
    # Finite differences of the model itself, through `masking_heads`.
    dtype = "float64" if BACKEND == "tensorflow" else "float32"  # JAX runs without x64
    keras.config.set_dtype_policy(dtype)
    model = _encoder_model()
    rng = np.random.default_rng(7)
    model.set_weights([rng.normal(scale=0.5, size=w.shape) for w in model.get_weights()])
    batches = [
        (rng.normal(size=(3, 5, 8)).astype(dtype), rng.integers(0, 3, size=(3,))) for _ in range(2)
    ]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype=dtype)
    importance = analysis.head_importance(model, batches, loss)
    assert sorted(importance) == [
        "block_0/self_attention",
        "block_1/self_attention",
    ]
    step = 1e-5 if dtype == "float64" else 1e-2

    def batch_loss(masks, x, y):
        with analysis.masking_heads(model, masks):
            return float(to_numpy(keras.ops.mean(loss(y, model(x, training=False)))))

    for path in importance:
        expected = np.zeros(2)
        for x, y in batches:
            for head in range(2):
                up, down = np.ones(2, dtype), np.ones(2, dtype)
                up[head] += step
                down[head] -= step
                difference = batch_loss({path: up}, x, y) - batch_loss({path: down}, x, y)
                expected[head] += abs(difference / (2 * step)) / len(batches)
        np.testing.assert_allclose(
            importance[path], expected, rtol=1e-3 if dtype == "float64" else 2e-2
        )


def test_mask_least_important_heads_reports_the_masked_loss():
    rng = np.random.default_rng(8)
    model, numpy_loss = _pooled_model(rng)
    batches = _batches(rng)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    importance = {"first": np.array([0.3, 0.1]), "second": np.array([0.2, 0.1, 0.5])}
    result = analysis.mask_least_important_heads(model, importance, 2, batches, loss)
    # Ties go to the earlier layer: first's head 1, then second's head 1.
    assert [(p.rsplit("/", 1)[-1], h) for p, h in result.masked_heads] == [
        ("first", 1),
        ("second", 1),
    ]
    first_mask, second_mask = np.array([1.0, 0.0]), np.array([1.0, 0.0, 1.0])
    expected = np.mean([numpy_loss(x, y, first_mask, second_mask) for x, y in batches])
    baseline = np.mean([numpy_loss(x, y, None, None) for x, y in batches])
    np.testing.assert_allclose(result.loss, expected, rtol=1e-5)
    np.testing.assert_allclose(result.baseline_loss, baseline, rtol=1e-5)
    assert abs(expected - baseline) > 1e-3
    np.testing.assert_array_equal(result.head_masks[result.masked_heads[0][0]], first_mask)
    none = analysis.mask_least_important_heads(model, importance, 0, batches, loss)
    assert none.masked_heads == [] and none.loss == none.baseline_loss


def test_masking_heads_ends_with_its_block():
    model = _encoder_model()
    x = np.random.default_rng(9).normal(size=(1, 5, 8)).astype("float32")
    before = to_numpy(model(x))
    with analysis.masking_heads(model, {"block_0/self_attention": np.zeros(2, "float32")}):
        masked = to_numpy(model(x))
    np.testing.assert_allclose(to_numpy(model(x)), before)
    assert np.abs(masked - before).max() > 1e-4
    # Nested blocks: the inner one adds its layers' masks to the outer one's.
    both = {"block_0/self_attention": np.zeros(2), "block_1/self_attention": np.zeros(2)}
    with analysis.masking_heads(model, both):
        expected = to_numpy(model(x))
    with analysis.masking_heads(model, {"block_0/self_attention": np.zeros(2, "float32")}):
        with analysis.masking_heads(model, {"block_1/self_attention": np.zeros(2, "float32")}):
            nested = to_numpy(model(x))
        np.testing.assert_allclose(to_numpy(model(x)), masked)
    np.testing.assert_allclose(nested, expected, atol=1e-6)
    # A call's own head_mask wins over the context's.
    layer = model.get_layer("block_0").self_attention
    hidden = np.ones((1, 5, 8), "float32")
    with analysis.masking_heads(model, {"block_0/self_attention": np.zeros(2, "float32")}):
        own = to_numpy(layer(hidden, head_mask=np.ones(2, "float32")))
    np.testing.assert_allclose(own, to_numpy(layer(hidden)), atol=1e-6)


# -------------------------------------------------------------- bad input
GOOD = [np.full((1, 2, 3, 3), 1 / 3)]


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: analysis.attention_rollout(np.ones((1, 1, 3, 3))), TypeError, "weights="),
        (lambda: analysis.attention_rollout([np.ones((3, 3))]), ValueError, r"weights\[0\]"),
        (
            lambda: analysis.attention_rollout(GOOD + [np.full((1, 2, 4, 4), 0.25)]),
            ValueError,
            r"weights\[1\] with shape \(1, 2, 4, 4\)",
        ),
        (
            lambda: analysis.attention_rollout([np.full((1, 2, 3, 4), 0.25)]),
            ValueError,
            r"self-attention.*weights\[0\] with shape \(1, 2, 3, 4\)",
        ),
        (lambda: analysis.attention_rollout(GOOD, heads=[2]), ValueError, r"heads=\[2\]"),
        (lambda: analysis.attention_rollout(GOOD, heads="all"), TypeError, "heads='all'"),
        (lambda: analysis.attention_flow(GOOD, residual_weight=2), ValueError, "residual_weight=2"),
        (lambda: analysis.attention_flow([-np.ones((1, 3, 3))]), ValueError, "non-negative"),
    ],
    ids=[
        "stacked_array",
        "rank_2",
        "mismatched_lengths",
        "non_square",
        "unknown_head",
        "heads_string",
        "residual_weight",
        "negative",
    ],
)
def test_bad_weights_are_refused_naming_the_function_and_the_argument(call, error, match):
    with pytest.raises(error, match=match) as raised:
        call()
    assert str(raised.value).startswith(("attention_rollout: ", "attention_flow: "))
    assert "Received" in str(raised.value)
