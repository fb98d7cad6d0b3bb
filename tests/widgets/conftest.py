import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bokeh")
pytest.importorskip("jupyter_bokeh")


@pytest.fixture
def fake_comm():
    """Widgets talk to a DummyComm that records every message instead of a kernel."""
    from ipywidgets.widgets.tests import utils

    utils.setup_test_comm()
    try:
        yield utils.DummyComm
    finally:
        utils.teardown_test_comm()


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path, monkeypatch):
    """Widgets write snapshots relative to the working directory: keep them out of the repo."""
    monkeypatch.chdir(tmp_path)
