import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts with the default dtype policy, a fresh name scope and
    the environment the session started with (the examples, run in-process by
    their tests, set KERAS_ATTENTION_QUIET_STARTUP; a later test's subprocess
    that imports keras first then warned, as a user's script should)."""
    environment = dict(os.environ)
    yield
    for name in set(os.environ) - set(environment):
        del os.environ[name]
    os.environ.update(environment)
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


def _is_layer_detail(item):
    """A tests/layers test other than a layer's contract and the family checks."""
    path = item.path.as_posix()
    return ("/tests/layers/" in path and not path.endswith("/layer_family_test.py")
            and not item.originalname.startswith("test_layer_contract"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_layer_detail(item):
            item.add_marker(pytest.mark.layer_detail)
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason="needs the TensorFlow backend")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)
