"""Fuzzing the figure builders and `export_html` (issue 39).

As the constructor fuzz: arguments drawn from valid values and wrong ones
(strings where numbers belong, ragged or wrongly shaped arrays, token lists
of the wrong length or a lone string, malformed candidates, sizes that are
not positive integers, a path that is a file descriptor, None or a folder).
The pools say, apart from the code, which values are wrong. Every example
either builds the figure (its data source holds the values) or raises our
ValueError/TypeError naming the builder and one of the wrong arguments;
never NumPy's, Bokeh's or `open`'s error, never a helper's name. The issue's
reproducers are pinned with `@example`. `derandomize=True`.
"""

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_attention import widgets

FUZZ = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

WEIGHTS_2D = [(np.full((2, 3), 0.5), True), (np.eye(3)[:2], True), ([[0.1, 0.9, 0.0]] * 2, True)]
WEIGHTS_2D += [
    ("abc", False),
    ([["a", "b", "c"]] * 2, False),
    ([[0.1, 0.2], [0.3]], False),  # ragged
    (np.ones(3), False),  # 1-D
    (None, False),
]
X_TOKENS = [(None, True), (["a", "b", "c"], True), (("x", "y", "z"), True)]
X_TOKENS += [(["a", "b"], False), ("abc", False), (5, False)]
SIZES = [(300, True), (np.int64(200), True), (0, False), (-1, False), (2.5, False), ("300", False)]
TITLES = [("weights", True), ("", True), (None, False), (3, False)]


def _fixed(**pools):
    return st.fixed_dictionaries({name: st.sampled_from(pool) for name, pool in pools.items()})


def _split(drawn):
    values = {name: value for name, (value, _) in drawn.items()}
    wrong = {name for name, (_, valid) in drawn.items() if not valid}
    return values, wrong


def _refused(call, owner, wrong):
    with pytest.raises((ValueError, TypeError)) as raised:
        call()
    message = str(raised.value)
    assert message.startswith(f"{owner}: "), message
    assert any(f"`{name}" in message for name in wrong), (wrong, message)
    assert "Received" in message, message


@FUZZ
@given(_fixed(weights=WEIGHTS_2D, x_tokens=X_TOKENS, width=SIZES, title=TITLES))
# The pin: three rows, two labels blamed `heatmap_data`.
@example(
    {"weights": (np.eye(3), True), "x_tokens": (["a", "b"], False)}
    | {"width": (300, True), "title": ("t", True)}
)
def test_heatmap(drawn):
    values, wrong = _split(drawn)
    weights = values["weights"]
    shape = np.shape(weights) if not wrong & {"weights"} else None
    tokens = values["x_tokens"]
    known = shape is not None and "x_tokens" not in wrong and tokens is not None
    if known and len(tokens) != shape[1]:
        wrong.add("x_tokens")  # the pin: three columns, two tokens

    def call():
        return widgets.heatmap(
            weights, values["x_tokens"], width=values["width"], title=values["title"]
        )

    if wrong:
        _refused(call, "heatmap", wrong)
        return
    data = widgets.heatmap_source(call()).data
    assert data["weight"] == np.asarray(weights, "float64").ravel().tolist()


CANDIDATES = [([("a", 0.7), ("b", 0.3)], True), ((("a", np.float32(1.0)),), True), ([], True)]
CANDIDATES += [
    ([("a", "high")], False),  # the "could not convert string to float"
    ([("a", 0.5, 1)], False),  # the "too many values to unpack"
    ([("a",)], False),
    ([(1, 0.5)], False),
    ([("a", 1.5)], False),
    ([("a", float("nan"))], False),
    ("ab", False),
    (5, False),
]


@FUZZ
@given(
    _fixed(
        candidates=CANDIDATES,
        chosen=[(None, True), ("a", True), (1, False)],
        height=SIZES,
    )
)
@example({"candidates": ([("a", "high")], False), "chosen": (None, True), "height": (220, True)})
@example({"candidates": ([("a", 0.5, 1)], False), "chosen": (None, True), "height": (220, True)})
def test_candidate_bars(drawn):
    values, wrong = _split(drawn)

    def call():
        return widgets.candidate_bars(
            values["candidates"], chosen=values["chosen"], height=values["height"]
        )

    if wrong:
        _refused(call, "candidate_bars", wrong)
        return
    data = widgets.heatmap_source(call()).data
    assert data["token"] == [token for token, _ in values["candidates"]]


VECTORS = [(np.array([0.2, 0.8]), True), ([0.5, 0.5], True)]
VECTORS += [("ab", False), (["a", "b"], False), (np.eye(2), False), ({"a": 1}, False)]
TOKENS_2 = [(None, True), (["x", "y"], True), (["x"], False), ("xy", False)]


@FUZZ
@given(_fixed(weights=VECTORS, tokens=TOKENS_2, width=SIZES, title=TITLES))
def test_distribution_bars(drawn):
    values, wrong = _split(drawn)

    def call():
        return widgets.distribution_bars(
            values["weights"], values["tokens"], width=values["width"], title=values["title"]
        )

    if wrong:
        _refused(call, "distribution_bars", wrong)
        return
    data = widgets.heatmap_source(call()).data
    assert data["weight"] == np.asarray(values["weights"], "float64").tolist()


PATHS = [("figure.html", True), (os.path.join("sub", "..", "f.html"), True)]
PATHS += [(1, False), (2, False), (None, False), (b"figure.html", False), (".", False), ("", False)]


@FUZZ
@given(_fixed(path=PATHS, title=TITLES))
# The pins: `export_html(fig, 1)` wrote the page to stdout and closed
# it; `path=None` gave the built-in `open`'s TypeError.
@example({"path": (1, False), "title": ("t", True)})
@example({"path": (None, False), "title": ("t", True)})
def test_export_html(drawn):
    values, wrong = _split(drawn)
    os.makedirs("sub", exist_ok=True)
    figure = widgets.heatmap(np.eye(2))

    def call():
        return widgets.export_html(figure, values["path"], title=values["title"])

    if wrong:
        _refused(call, "export_html", wrong)
        assert not sys.stdout.closed  # nothing wrote to, or closed, a file descriptor
        return
    path = call()
    with open(path, encoding="utf-8") as handle:
        assert "<html" in handle.read(200).lower()
