"""`keras_attention.distribution.get_layout_map`: keys, layouts, bad input.

In-process (no device is created: a `DeviceMesh` of device names is enough
for the layout and for the build-time checks, which raise before any
variable exists). Training under the layout runs in jax_distribution_test.
"""

import re

import keras
import numpy as np
import pytest

import keras_attention as ka
from tests.distribution import cases


def mesh(shape=(1, 2), names=("batch", "model")):
    devices = [f"cpu:{i}" for i in range(int(np.prod(shape)))]
    return keras.distribution.DeviceMesh(shape, names, devices)


def every_variable_path():
    paths = []
    for name, (make, _) in cases.CASES.items():
        if name == "recurrent_family" or name == "transformer_family":
            continue  # built below through the groups' layers
        paths += [v.path for v in make().weights]
    paths += [v.path for v in cases._recurrent_family().weights]
    paths += [v.path for v in cases._transformer_family().weights]
    keras_layer = keras.layers.MultiHeadAttention(2, 4, name="keras_mha")
    keras_layer(np.zeros((1, 3, 8)), np.zeros((1, 3, 8)))
    return paths + [v.path for v in keras_layer.weights]


def test_no_variable_path_matches_two_keys():
    layout_map = ka.distribution.get_layout_map(mesh())
    paths = every_variable_path()
    assert len(paths) > 100
    matched = 0
    for path in paths:
        keys = [key for key in layout_map if re.fullmatch(key, path)]
        assert len(keys) <= 1, (path, keys)
        matched += len(keys)
        layout_map[path]  # Keras' own lookup raises on two matches
    assert matched > 40


@pytest.mark.parametrize(
    "path, axes",
    [
        ("multi_head/query/kernel", (None, "model", None)),
        ("outer/block/self_attention/key/bias", ("model", None)),
        ("sparse/value/kernel", (None, "model", None)),
        ("performer/gate/kernel", (None, "model", None)),
        ("linformer/attention_output/kernel", ("model", None, None)),
        ("encoder_block/feedforward_intermediate_dense/kernel", (None, "model")),
        ("encoder_block/feedforward_intermediate_dense/bias", ("model",)),
        ("decoder_block/feedforward_output_dense/kernel", ("model", None)),
        # Replicated: feature dims, norms, random state, score layers.
        ("multi_head/attention_output/bias", None),
        ("encoder_block/feedforward_output_dense/bias", None),
        ("encoder_block/self_attention_layer_norm/gamma", None),
        ("performer/projection", None),
        ("sparse/random_plan", None),
        ("linformer/key_projection", None),
        ("additive/query_kernel", None),
        ("my_query/kernel", None),  # a name that merely contains "query"
        ("query/kernel_extra", None),
    ],
)
def test_layouts(path, axes):
    layout = ka.distribution.get_layout_map(mesh())[path]
    assert (None if layout is None else layout.axes) == axes


def test_custom_model_axis_name():
    layout_map = ka.distribution.get_layout_map(mesh(names=("data", "heads")), model_axis="heads")
    assert layout_map["a/query/kernel"].axes == (None, "heads", None)


def test_unknown_axis_names_the_argument_and_the_mesh():
    with pytest.raises(
        ValueError,
        match=r"`model_axis`.*DeviceMesh\(shape=\(1, 2\)"
        r".*\('batch', 'model'\).*Received: model_axis='tensor'",
    ):
        ka.distribution.get_layout_map(mesh(), model_axis="tensor")


def test_not_a_mesh():
    with pytest.raises(TypeError, match="device_mesh"):
        ka.distribution.get_layout_map(("batch", "model"))


def _model_parallel(layout_map=None):
    layout_map = layout_map or ka.distribution.get_layout_map(mesh())
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: ka.MultiHeadAttention(3, 4),
            r"MultiHeadAttention .*`num_heads`=3 .*'model' of size 2.*"
            r"query/kernel' \(shape \(8, 3, 4\)\).*DeviceMesh\(shape=\(1, 2\)",
        ),
        (lambda: ka.SparseAttention(3, 4, block_size=2), r"SparseAttention .*`num_heads`=3"),
        (
            lambda: ka.MultiHeadAttention(4, 4, num_key_value_heads=1),
            r"`num_key_value_heads`=1 .*key/kernel' \(shape \(8, 1, 4\)\)",
        ),
    ],
)
def test_heads_that_do_not_divide_raise_before_any_variable(make, message):
    with _model_parallel().scope():
        layer = make()
        with pytest.raises(ValueError, match=message):
            layer(np.zeros((1, 4, 8)), np.zeros((1, 4, 8)))
        assert not layer.weights


def test_intermediate_dim_that_does_not_divide():
    with _model_parallel().scope():
        block = ka.TransformerEncoderBlock(2, 4, 31)
        with pytest.raises(
            ValueError,
            match=r"TransformerEncoderBlock .*"
            r"`intermediate_dim`=31 .*shape \(8, 31\)",
        ):
            block(np.zeros((1, 4, 8)))


def test_a_hand_written_layout_is_checked_too():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map[".*/query/kernel"] = (None, None, "model")  # shards key_dim
    with (
        _model_parallel(layout_map).scope(),
        pytest.raises(ValueError, match=r"`key_dim`=3 .*\(None, None, 'model'\)"),
    ):
        ka.MultiHeadAttention(2, 3)(np.zeros((1, 4, 8)), np.zeros((1, 4, 8)))


def test_layout_with_more_axes_than_the_weight():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map[".*/query/bias"] = (None, "model", None)
    with (
        _model_parallel(layout_map).scope(),
        pytest.raises(ValueError, match=r"query/bias' \(shape \(2, 4\)\).*more axes"),
    ):
        ka.MultiHeadAttention(2, 4)(np.zeros((1, 4, 8)), np.zeros((1, 4, 8)))
