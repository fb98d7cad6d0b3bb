"""Loading untrusted `.keras` files (issue 11): clear errors, nothing executed.

A `.keras` archive is a zip whose `config.json` names classes and their
arguments. Tampered archives must fail under `safe_mode=True` (the default)
with an error that says what was wrong, before any of their code runs.
"""

import json
import zipfile

import keras
import numpy as np
import pytest

import keras_attention as ka


def _saved_model(tmp_path, extra_layer=None):
    inputs = keras.Input((4, 8))
    x = ka.MultiHeadAttention(2, 4, name="attention")(inputs)
    if extra_layer is not None:
        x = extra_layer(x)
    outputs = ka.AttentionPooling(name="pooling")(x)
    path = tmp_path / "model.keras"
    keras.Model(inputs, outputs).save(path)
    return path


def _rewrite_config(path, edit):
    """Rewrites `config.json` inside the archive with `edit(config)`."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    edit(config)
    members["config.json"] = json.dumps(config).encode()
    tampered = path.with_name("tampered.keras")
    with zipfile.ZipFile(tampered, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return tampered


def _layer_config(config, name):
    for layer in config["config"]["layers"]:
        if layer["config"].get("name") == name:
            return layer
    raise KeyError(name)


def test_an_untampered_archive_loads(tmp_path):
    path = _saved_model(tmp_path)
    model = keras.saving.load_model(path, safe_mode=True)
    assert model(np.ones((1, 4, 8), "float32")).shape == (1, 8)


def test_an_unknown_class_fails_with_its_name(tmp_path):
    def edit(config):
        layer = _layer_config(config, "attention")
        layer["class_name"] = "NoSuchAttention"
        layer["registered_name"] = "keras_attention>NoSuchAttention"

    tampered = _rewrite_config(_saved_model(tmp_path), edit)
    with pytest.raises(TypeError, match="NoSuchAttention"):
        keras.saving.load_model(tampered, safe_mode=True)


def test_a_module_outside_keras_is_never_imported_or_called(tmp_path):
    marker = tmp_path / "executed"

    def edit(config):
        layer = _layer_config(config, "attention")
        layer["module"], layer["class_name"] = "os", "system"
        layer["config"] = {"command": f"touch {marker}"}
        layer.pop("registered_name", None)

    tampered = _rewrite_config(_saved_model(tmp_path), edit)
    with pytest.raises((TypeError, ValueError)):
        keras.saving.load_model(tampered, safe_mode=True)
    assert not marker.exists()


def test_a_lambda_is_refused_under_safe_mode(tmp_path):
    marker = tmp_path / "executed"
    path = _saved_model(
        tmp_path,
        keras.layers.Lambda(lambda x: x * 2.0, output_shape=(4, 8), name="double"),
    )

    def edit(config):  # what an attacker's bytecode would do, had it run
        _layer_config(config, "double")["config"]["function"]["config"] = "x"

    for archive in (path, _rewrite_config(path, edit)):
        with pytest.raises(ValueError, match="safe_mode"):
            keras.saving.load_model(archive, safe_mode=True)
    assert not marker.exists()


@pytest.mark.parametrize(
    "layer_name, argument, value, error, pattern",
    [
        (
            "attention",
            "num_heads",
            -1,
            ValueError,
            r"MultiHeadAttention: `num_heads`.*num_heads=-1",
        ),
        ("attention", "dropout", 3.0, ValueError, r"MultiHeadAttention: `dropout`.*dropout=3.0"),
        (
            "attention",
            "memory_efficient",
            "__import__('os')",
            ValueError,
            r"MultiHeadAttention: `memory_efficient`.*__import__",
        ),
        ("pooling", "score", "exec", ValueError, r"AttentionPooling: `score`.*'exec'"),
    ],
)
def test_a_tampered_argument_fails_naming_the_class_and_value(
    tmp_path, layer_name, argument, value, error, pattern
):
    def edit(config):
        _layer_config(config, layer_name)["config"][argument] = value

    tampered = _rewrite_config(_saved_model(tmp_path), edit)
    # Keras wraps the layer's own error in a TypeError that quotes it.
    with pytest.raises((error, TypeError), match=pattern):
        keras.saving.load_model(tampered, safe_mode=True)
