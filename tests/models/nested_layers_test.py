"""Deserialisers check the class of every nested layer they rebuild (issue 23).

A `.keras` file is data: a tampered config that names another layer class
as a translator's `attention` or AttentionPooling's `score` must raise our
TypeError naming the class and argument, with `safe_mode` on and off, not
fail later inside Keras (`Dense.build() takes 2 positional arguments`).
Loading through Keras, its "could not be deserialized properly" TypeError
wraps ours and quotes it.
"""

import json
import os
import zipfile

import keras
import numpy as np
import pytest

import keras_attention as ka

DENSE = keras.saving.serialize_keras_object(keras.layers.Dense(3))
NOT_A_CLASS = {"class_name": "NoSuchLayer", "config": {}, "module": "nowhere"}


def _tamper(path, edit):
    """Rewrites the config.json inside a `.keras` archive with `edit`."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    edit(config)
    members["config.json"] = json.dumps(config).encode()
    os.remove(path)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


@pytest.mark.parametrize("safe_mode", [True, False])
@pytest.mark.parametrize("score", [DENSE, NOT_A_CLASS, {"no": "class"}])
def test_attention_pooling_refuses_a_score_of_another_class(score, safe_mode):
    serialized = keras.saving.serialize_keras_object(ka.AttentionPooling(score="general"))
    serialized["config"]["score"] = score
    with pytest.raises(TypeError, match=r"^AttentionPooling: `score` must be"):
        ka.AttentionPooling.from_config(serialized["config"])
    # Keras wraps a TypeError from `from_config` in its own, which quotes ours.
    with pytest.raises(TypeError, match=r"AttentionPooling: `score` must be"):
        keras.saving.deserialize_keras_object(serialized, safe_mode=safe_mode)


@pytest.mark.parametrize("safe_mode", [True, False])
def test_tampered_keras_file_with_a_dense_score_is_refused(tmp_path, safe_mode):
    model = keras.Sequential(
        [
            keras.Input((5, 4)),
            ka.AttentionPooling(score=ka.LuongAttention(score="general"), name="pool"),
        ]
    )
    path = str(tmp_path / "pooling.keras")
    model.save(path)
    # The untampered file loads and a nested score layer round-trips.
    reloaded = keras.saving.load_model(path, safe_mode=safe_mode)
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype("float32")
    np.testing.assert_allclose(reloaded(x), model(x), atol=1e-6)

    def edit(config):
        layer = next(
            item for item in config["config"]["layers"] if item["class_name"] == "AttentionPooling"
        )
        layer["config"]["score"] = DENSE

    _tamper(path, edit)
    with pytest.raises(TypeError, match=r"AttentionPooling: `score` must be.*Dense"):
        keras.saving.load_model(path, safe_mode=safe_mode)


def _translators():
    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.models import TransformerTranslator

    vocabulary = ["<pad>", "<unk>", "<start>", "<end>", "one", "two"]
    return [
        Seq2SeqTranslator(
            vocabulary,
            vocabulary,
            units=8,
            embedding_dim=4,
            attention=ka.LuongAttention(score="general"),
        ),
        TransformerTranslator(
            vocabulary,
            vocabulary,
            num_layers=1,
            num_heads=2,
            hidden_dim=8,
            intermediate_dim=8,
            attention=ka.MultiHeadAttention(2, 4),
        ),
    ]


@pytest.mark.tf_only
@pytest.mark.parametrize("safe_mode", [True, False])
def test_translators_refuse_a_nested_attention_of_another_class(safe_mode):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    for translator in _translators():
        name = type(translator).__name__
        serialized = keras.saving.serialize_keras_object(translator)
        assert isinstance(serialized["config"]["attention"], dict)
        rebuilt = keras.saving.deserialize_keras_object(serialized, safe_mode=safe_mode)
        assert type(
            rebuilt.attention
            if name == "Seq2SeqTranslator"
            else rebuilt.decoder_blocks[0].self_attention
        ) is type(
            translator.attention
            if name == "Seq2SeqTranslator"
            else translator.decoder_blocks[0].self_attention
        )
        # A Dense, a multi-head layer where a single-head one belongs (and the
        # reverse), a class that does not exist.
        other = ka.MultiHeadAttention(2, 4) if name == "Seq2SeqTranslator" else ka.LuongAttention()
        for wrong, kind in [
            (DENSE, "Dense"),
            (keras.saving.serialize_keras_object(other), type(other).__name__),
            (NOT_A_CLASS, "NoSuchLayer"),
        ]:
            tampered = {**serialized, "config": {**serialized["config"], "attention": wrong}}
            with pytest.raises(TypeError, match=rf"^{name}: `attention` must be.*{kind}"):
                type(translator).from_config(tampered["config"])
            with pytest.raises(TypeError, match=rf"{name}: `attention` must be.*{kind}"):
                keras.saving.deserialize_keras_object(tampered, safe_mode=safe_mode)


def test_attention_pooling_constructor_checks_a_config_dict_too():
    # The constructor takes a serialized score layer as well; a Dense config
    # is refused by name there too, not deep inside Keras' build.
    dense = keras.saving.serialize_keras_object(keras.layers.Dense(3))
    with pytest.raises(TypeError, match=r"AttentionPooling.*`score`"):
        ka.AttentionPooling(score=dense)
    luong = keras.saving.serialize_keras_object(ka.LuongAttention())
    assert isinstance(ka.AttentionPooling(score=luong).attention, ka.LuongAttention)
