import pytest
from bokeh.models import ColumnDataSource
from bokeh.models import Range1d

from keras_attention.widgets import _frames


def test_apply_frame_sets_data_and_properties():
    source, y_range = ColumnDataSource({"x": [1, 2], "y": [3, 4]}), Range1d(0, 1)
    models = {"source": source, "range": y_range}
    _frames.apply_frame(
        models, {"data": {"source": {"y": [5, 6]}}, "props": {"range": {"start": -6, "end": 6}}}
    )
    assert dict(source.data) == {"x": [1, 2], "y": [5, 6]}  # columns not given are kept
    assert (y_range.start, y_range.end) == (-6, 6)


def test_set_data_streams_appended_rows_and_patches_changed_columns(monkeypatch):
    source = ColumnDataSource({"x": [1], "y": [2]})
    sent = []
    monkeypatch.setattr(
        ColumnDataSource, "stream", lambda self, data, *a, **k: sent.append(("stream", data))
    )
    monkeypatch.setattr(
        ColumnDataSource, "patch", lambda self, data, *a, **k: sent.append(("patch", data))
    )
    _frames.set_data(source, {"x": [1, 7], "y": [2, 8]})
    source.data = {"x": [1], "y": [2]}
    _frames.set_data(source, {"x": [1], "y": [9]})
    _frames.set_data(source, {"x": [1], "y": [2]})  # nothing changed: nothing sent
    assert sent == [("stream", {"x": [7], "y": [8]}), ("patch", {"y": [(slice(0, 1), [9])]})]


def test_frame_keys_are_the_controls_values_as_the_page_reads_them():
    assert _frames.frame_key(3, 1, "mean of heads") == "3|1|mean of heads"


@pytest.mark.parametrize("first, last", [(0, 0), (1, 1), (0, 4), (1, 3)])
def test_a_frame_slider_opens_on_the_last_frame_and_is_disabled_for_one(first, last):
    slider = _frames.frame_slider(first, last, title="step", name="step_slider")
    assert (slider.start, slider.value, slider.disabled) == (first, last, first == last)
    assert slider.end > slider.start  # Bokeh draws no slider over an empty range
    if last > first:
        assert slider.end == last
