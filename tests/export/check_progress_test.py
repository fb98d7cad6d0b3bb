"""`check_servable(verbose=...)`: a Keras progress bar over its stages."""

import pytest
import tensorflow as tf

from keras_attention.export import check_servable

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def doubling_model(tmp_path_factory):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def double(x):
        return {"y": x * 2.0}

    module = tf.Module()
    module.double = double
    path = str(tmp_path_factory.mktemp("doubling") / "model")
    tf.saved_model.save(module, path, signatures={"serving_default": double})
    return path


def test_auto_shows_the_three_stages_when_loading(doubling_model, capsys):
    report = check_servable(doubling_model)
    out = capsys.readouterr().out
    assert report.ok, report.summary()
    assert "3/3" in out and "/stage" in out, out


def test_static_check_is_silent_unless_asked(doubling_model, capsys):
    check_servable(doubling_model, load=False)
    check_servable(doubling_model, load=False, verbose=0)
    assert capsys.readouterr().out == ""
    check_servable(doubling_model, load=False, verbose=1)
    assert "2/2" in capsys.readouterr().out


def test_bad_verbose_is_refused(doubling_model):
    with pytest.raises(ValueError, match="check_servable.*verbose='yes'"):
        check_servable(doubling_model, verbose="yes")
