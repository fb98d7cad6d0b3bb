import numpy as np
import pytest

from keras_attention.models.alignment_chart import alignment_html
from keras_attention.models.alignment_chart import alignment_text
from keras_attention.models.decoding import Translation


def _translation():
    return Translation(
        text="ab",
        tokens=["a", "b"],
        source_tokens=["x", " ", "<y>"],
        score=-1.0,
        alignment=np.array([[0.9, 0.1, 0.0], [0.0, 0.2, 0.8]], "float32"),
    )


def test_text_chart_marks_the_most_attended_source_token():
    lines = alignment_text(_translation()).splitlines()
    assert lines[0].split() == ["x", "␣", "<y>"]
    assert lines[1].startswith("a |") and lines[1].endswith("<- x")
    assert lines[2].endswith("<- <y>")
    # One cell per source token, the widest token plus a space; 0.9 is darkest.
    cells = lines[1].split("|", 1)[1].split("<-")[0][1:]
    assert cells[:4] == "@@@@" and "@" not in cells[4:]
    assert cells[4:8] == "...." and cells[8:12] == "    "
    # Single characters get one column each.
    chars = alignment_text(
        Translation("a", ["a"], ["x", "y"], 0.0, np.array([[1.0, 0.0]], "float32"))
    )
    assert chars.splitlines()[1] == "a | @   <- x"


def test_html_heatmap_is_escaped_and_self_contained():
    page = alignment_html([_translation()], title="t<1>")
    assert "t&lt;1&gt;" in page and "&lt;y&gt;" in page
    assert page.count("<td ") == 6
    assert 'title="0.900"' in page
    assert "<script" not in page and "http" not in page


def test_charts_take_per_layer_and_head_alignments():
    from keras_attention.models.alignment_chart import alignment_matrix

    # (layers, heads, T_out, T_in): layer 1 head 0 looks at "x", head 1 at "<y>".
    alignment = np.zeros((2, 2, 2, 3), "float32")
    alignment[0, :, :, 1] = 1.0
    alignment[1, 0, :, 0] = 1.0
    alignment[1, 1, :, 2] = 1.0
    translation = Translation("ab", ["a", "b"], ["x", " ", "<y>"], 0.0, alignment)
    np.testing.assert_allclose(alignment_matrix(alignment), [[0.5, 0, 0.5]] * 2)
    np.testing.assert_allclose(
        alignment_matrix(alignment, layer=None, head=None), [[0.25, 0.5, 0.25]] * 2
    )
    assert alignment_text(translation, layer=1, head=1).splitlines()[1].endswith("<- <y>")
    assert alignment_text(translation, layer=0).splitlines()[1].endswith("<- ␣")
    assert 'title="1.000"' in alignment_html([translation], layer=1, head=0)
    with pytest.raises(ValueError, match="layer"):
        alignment_text(translation, layer=2)
    with pytest.raises(ValueError, match=r"\(T_out, T_in\)"):
        alignment_matrix(np.zeros((2, 3, 4)))


def test_merge_subwords_shows_words():
    from keras_attention.models.alignment_chart import merge_subwords

    alignment = np.array([[0.5, 0.25, 0.25], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], "float32")
    translation = Translation(
        "cats x", ["cat", "##s", "x"], ["chat", "##on", "##s"], -1.0, alignment
    )
    merged = merge_subwords(translation)
    assert merged.tokens == ["cats", "x"] and merged.source_tokens == ["chatons"]
    np.testing.assert_allclose(merged.alignment, [[1.0], [1.0]])
    per_head = merge_subwords(
        Translation(
            "cats x",
            translation.tokens,
            ["chat", "##on", "le"],
            -1.0,
            np.broadcast_to(alignment, (2, 3, 3, 3)),
        )
    )
    assert per_head.alignment.shape == (2, 3, 2, 2)
    np.testing.assert_allclose(per_head.alignment[1, 2], [[0.625, 0.375], [1, 0]])
