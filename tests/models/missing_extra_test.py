"""Without the `text` extra (tensorflow-text), the first public call that needs
it raises an ImportError naming the extra and the pip command, and
`check_servable` says tensorflow-text is missing here rather than blaming TF
Serving. The missing module is simulated: `sys.modules["tensorflow_text"] =
None` in this process (Python's own "not importable" marker), a shadow package
that raises ModuleNotFoundError in the checker's fresh process.
"""

import os
import sys

import pytest

pytestmark = pytest.mark.tf_only

PIP_COMMAND = 'pip install "keras-attention-layers[text]"'
WORDS = ["<pad>", "<unk>", "<start>", "<end>", "one", "two"]


@pytest.fixture
def without_tensorflow_text(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_text", None)


def _assert_names_the_extra(error, feature):
    message = str(error.value)
    assert message.startswith(feature + " needs tensorflow-text"), message
    assert "`text` extra" in message and PIP_COMMAND in message, message
    assert 'pip install ".[text]"' in message, message
    assert isinstance(error.value.__cause__, ModuleNotFoundError)


@pytest.mark.parametrize("name", ["Seq2SeqTranslator", "TransformerTranslator"])
def test_from_texts_names_the_text_extra(without_tensorflow_text, name):
    from keras_attention import models

    translator_class = getattr(models, name)
    with pytest.raises(ImportError) as error:
        translator_class.from_texts(["one two"], ["two one"])
    _assert_names_the_extra(error, f"{name}.from_texts")


@pytest.mark.parametrize("split", ["character", "wordpiece"])
def test_constructor_names_the_text_extra(without_tensorflow_text, split):
    from keras_attention.models import Seq2SeqTranslator

    with pytest.raises(ImportError) as error:
        Seq2SeqTranslator(WORDS, WORDS, source_split=split, units=2, embedding_dim=2)
    _assert_names_the_extra(error, "Seq2SeqTranslator")


def test_bad_arguments_are_reported_before_the_missing_extra(without_tensorflow_text):
    from keras_attention.models import Seq2SeqTranslator

    with pytest.raises(ValueError, match="Seq2SeqTranslator: `source_split`"):
        Seq2SeqTranslator(WORDS, WORDS, source_split="letters")


def test_export_translator_names_the_text_extra(monkeypatch, tmp_path):
    from keras_attention.export import export_translator
    from keras_attention.models import Seq2SeqTranslator

    translator = Seq2SeqTranslator(WORDS, WORDS, units=2, embedding_dim=2)
    monkeypatch.setitem(sys.modules, "tensorflow_text", None)
    with pytest.raises(ImportError) as error:
        export_translator(translator, str(tmp_path / "model"))
    _assert_names_the_extra(error, "export_translator")
    assert not os.path.exists(tmp_path / "model")


def test_a_module_tensorflow_text_needs_keeps_its_own_error(monkeypatch):
    # tensorflow-text installed but its own import failing on another module:
    # that error is clearer than "install the extra", which is installed.
    from keras_attention import _extras

    def import_module(name):
        raise ModuleNotFoundError("No module named 'tensorflow_hub'", name="tensorflow_hub")

    monkeypatch.setattr(_extras.importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="tensorflow_hub"):
        _extras.require_tensorflow_text("Seq2SeqTranslator")


SHADOW = (
    "raise ModuleNotFoundError(\"No module named 'tensorflow_text'\", name='tensorflow_text')\n"
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import keras

    from keras_attention.export import export_translator
    from keras_attention.models import Seq2SeqTranslator

    keras.utils.set_random_seed(0)
    translator = Seq2SeqTranslator(
        WORDS, WORDS, source_split="whitespace", target_split="whitespace", units=4, embedding_dim=4
    )
    path = str(tmp_path_factory.mktemp("export") / "translator")
    export_translator(translator, path, warmup_texts=["one two"])
    return path


@pytest.fixture
def fresh_process_without_tensorflow_text(monkeypatch, tmp_path):
    from keras_attention.export import check

    shadow = tmp_path / "shadow" / "tensorflow_text"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(SHADOW)
    plain_env = check._fresh_process_env

    def env():
        values = plain_env()
        values["PYTHONPATH"] = str(shadow.parent)
        return values

    monkeypatch.setattr(check, "_fresh_process_env", env)


def test_checker_says_tensorflow_text_is_missing_here(
    exported, fresh_process_without_tensorflow_text
):
    from keras_attention.export import check_servable

    report = check_servable(exported, verbose=0)
    assert not report.ok
    (problem,) = report.problems
    assert problem.startswith("tensorflow-text is not installed here"), problem
    assert PIP_COMMAND in problem and "CaseFoldUTF8" in problem, problem
    assert "would not have" not in report.summary(), report.summary()
    assert report.op_sources["CaseFoldUTF8"] == "tensorflow-text (not importable here)"


def test_checker_still_flags_ops_tf_serving_would_not_have(
    exported, fresh_process_without_tensorflow_text, monkeypatch
):
    from keras_attention.export import check
    from keras_attention.export import check_servable

    linked = check.tf_serving.TENSORFLOW_TEXT_OPS - {"CaseFoldUTF8"}
    monkeypatch.setattr(check.tf_serving, "TENSORFLOW_TEXT_OPS", linked)
    report = check_servable(exported, verbose=0)
    missing, not_served = report.problems
    assert missing.startswith("tensorflow-text is not installed here"), missing
    assert "CaseFoldUTF8" not in missing
    assert "TF Serving would not have them): CaseFoldUTF8" in not_served, not_served


def test_checker_with_tensorflow_text_reports_no_such_problem(exported):
    from keras_attention.export import check_servable

    report = check_servable(exported, verbose=0)
    assert report.ok, report.summary()
    assert report.op_sources["CaseFoldUTF8"] == "tensorflow-text"
