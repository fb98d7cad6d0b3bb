"""`keras.distribution` on 4 forced host devices (JAX), in one subprocess.

Every attention layer, each Transformer block, both model families and the
dropout paths train under `DataParallel` (2 devices) and `ModelParallel`
(2x2 mesh, `keras_attention.distribution.get_layout_map`) to the weights and
losses of single-device training, with the shardings the layout promised.
Runs from the TensorFlow pass of `make test` too (the worker sets its own
backend).
"""

import pytest

from tests.distribution import cases
from tests.distribution.subprocesses import run_worker

pytestmark = pytest.mark.slow

GROUPS = sorted(cases.CASES)
LAYERS = {layer: group for group, layers in cases.LAYERS.items() for layer in layers}
LAYERS.update(recurrent_family="recurrent_family", transformer_family="transformer_family")
DISTRIBUTIONS = ["data_parallel", "model_parallel"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results():
    return run_worker("tests.distribution.jax_worker", GROUPS, backend="jax", timeout=600)


def variables_of(results, layer, distribution):
    """The variables of one layer (and its output head) in its group's model."""
    group = LAYERS[layer]
    rows = results[group][distribution]["variables"]
    if group == layer:  # a model family: the whole model
        return rows
    mine = [r for r in rows if r["path"].split("/")[0] in (layer, f"{layer}_head")]
    assert mine, [r["path"] for r in rows]
    return mine


def test_worker_saw_four_devices(results):
    assert results["devices"] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_losses_match_one_device(results, group, distribution):
    run = results[group][distribution]
    assert run["weights_changed"] > 1e-3  # training moved the weights
    assert run["loss_difference"] < TOLERANCE, (run["losses"], run["single_losses"])


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_weights_match_one_device(results, layer, distribution):
    for variable in variables_of(results, layer, distribution):
        assert variable["difference"] < TOLERANCE, variable


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_data_parallel_replicates_every_variable(results, layer):
    for variable in variables_of(results, layer, "data_parallel"):
        assert variable["devices"] == 2, variable
        assert variable["spec"] == [None] * len(variable["shape"]), variable
        assert variable["shard_shape"] == variable["shape"], variable


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_model_parallel_shards_as_the_layout_promised(results, layer):
    sharded = 0
    for variable in variables_of(results, layer, "model_parallel"):
        assert variable["devices"] == 4, variable
        assert variable["spec"] == variable["promised"], variable
        expected = [
            size // 2 if axis == "model" else size
            for size, axis in zip(variable["shape"], variable["promised"], strict=True)
        ]
        assert variable["shard_shape"] == expected, variable
        sharded += "model" in variable["spec"]
    if layer in cases.SHARDED:
        assert sharded >= 5  # q, k, v kernels, their biases, output kernel
    else:
        assert sharded == 0


def test_model_parallel_splits_heads_of_the_query_projection(results):
    # The layout's promise written out for one variable, independently of it.
    (query,) = [
        v
        for v in variables_of(results, "multi_head", "model_parallel")
        if v["path"] == "multi_head/query/kernel"
    ]
    assert query["shape"] == [cases.FEATURES, cases.HEADS, 4]
    assert query["spec"] == [None, "model", None]
    assert query["shard_shape"] == [cases.FEATURES, cases.HEADS // 2, 4]


def test_dropout_was_active(results):
    # The first training step (dropout on) and the untrained model's
    # inference loss see the same weights: only dropout separates them.
    run = results["dropout"]["data_parallel"]
    assert abs(run["single_losses"][0] - run["initial_loss"]) > 1e-3
    plain = results["blocks"]["data_parallel"]
    assert abs(plain["single_losses"][0] - plain["initial_loss"]) < 1e-5


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("variable", ["random_plan", "projection"])
def test_random_state_is_identical_across_replicas(results, distribution, variable):
    report = results["multi_head_layers"][distribution]["random_state"][variable]
    assert report["copies"] >= 2
    assert report["copies_differ"] == 0.0
    assert report["built_vs_single"] == 0.0
    assert report["trained_vs_single"] == 0.0


def test_redraw_features_redraws_on_every_replica(results):
    state = results["multi_head_layers"]["data_parallel"]["random_state"]
    assert state["projection"]["moved"] > 0.1
    assert state["random_plan"]["moved"] == 0.0  # plans are fixed at build
