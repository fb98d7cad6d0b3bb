"""Fuzzing the widgets' constructors (issue 23).

Each widget is built with arguments drawn from valid values (NumPy scalars
included) and wrong ones (negative, out of range, floats, bools, strings,
None where a number belongs, a number where token strings belong). Each
example must either build the widget, holding the values as Python
numbers and lists, or raise our ValueError/TypeError naming the widget and
one of the arguments the documented rules (written out below, apart from
the code) call wrong; never anything else, and never when all are valid.
`derandomize=True`: a fixed-seed slice that CI runs.
"""

import keras
import numpy as np
from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_attention
from tests.widgets.fake_translator import FakeTranslator

NUMBERS = [0, 1, 2, 3, -1, np.int64(1), np.array(1), 1.0, 2.5, True, None, "1"]
TOKENS = [
    None,
    ["a", "b", "c", "d", "e", "f"],
    ("a",) * 6,
    5,
    "abcdef",
    ["a", 1, "c", "d", "e", "f"],
    np.array(list("abcdef")),
]


def _int(value):
    scalar = isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0)
    value = value.item() if scalar else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _real(value):
    scalar = isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0)
    value = value.item() if scalar else value
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else None


def _tokens_ok(tokens):
    return tokens is None or (
        isinstance(tokens, (list, tuple, np.ndarray))
        and all(isinstance(t, str) for t in list(tokens))
    )


TEXTS = ["il a m' entarté", "5", "", "  ", "\ud800 5", b"il a", 5, None]


def _encodable(text):
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return True


def _in(value, low, high=None):
    value = _int(value)
    return value is not None and value >= low and (high is None or value < high)


# The documented rules, per widget: argument -> is the value valid?
RULES = {
    "AttentionExplorer": {
        "example": lambda v: _in(v, 0, 2),
        "max_tokens": lambda v: _in(v, 2),
        "rows_per_call": lambda v: _in(v, 1),
        "query_tokens": _tokens_ok,
        "key_tokens": _tokens_ok,
    },
    "LiveAttention": {
        "example": lambda v: _in(v, 0, 2),
        "head": lambda v: v is None or _in(v, 0, 1),  # one-head LuongAttention
        "every_n_batches": lambda v: _in(v, 1),
        "max_frames": lambda v: _in(v, 1),
        "min_interval_s": lambda v: _real(v) is not None and _real(v) >= 0,
        "query_tokens": _tokens_ok,
    },
    "DecodingStepper": {
        "text": lambda v: isinstance(v, str) and bool(v.strip()) and _encodable(v),
        "top_k": lambda v: _in(v, 1),
        "reserved_rows": lambda v: v is None or _in(v, 1),
    },
}


def _model():
    inputs = keras.Input((6, 4))
    attended = keras_attention.LuongAttention(score="general", name="att")(inputs)
    return keras.Model(inputs, attended)


def _build(widget, kwargs):
    from keras_attention.widgets import AttentionExplorer
    from keras_attention.widgets import DecodingStepper
    from keras_attention.widgets import LiveAttention

    probe = np.random.default_rng(0).normal(size=(2, 6, 4)).astype("float32")
    if widget == "AttentionExplorer":
        return AttentionExplorer(_model(), probe, **kwargs)
    if widget == "LiveAttention":
        return LiveAttention(_model(), probe, **kwargs)
    kwargs = dict(kwargs)
    return DecodingStepper(FakeTranslator(), kwargs.pop("text", "il a m' entarté"), **kwargs)


@st.composite
def cases(draw):
    widget = draw(st.sampled_from(sorted(RULES)))
    names = draw(st.lists(st.sampled_from(sorted(RULES[widget])), unique=True, max_size=3))
    kwargs = {
        name: draw(
            st.sampled_from(
                TEXTS if name == "text" else TOKENS if name.endswith("tokens") else NUMBERS
            )
        )
        for name in names
    }
    return widget, kwargs


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=cases())
# The cases issue 23 found always run (explicit phase).
@example(case=("LiveAttention", {"example": 3}))
@example(case=("LiveAttention", {"head": 5}))
@example(case=("AttentionExplorer", {"query_tokens": 5}))
@example(case=("DecodingStepper", {"top_k": np.int64(2)}))
# Issue 39: a lone surrogate blamed `Seq2SeqTranslator.decoding_session`.
@example(case=("DecodingStepper", {"text": "\ud800 5"}))
def test_widget_constructors_build_or_name_the_wrong_argument(fake_comm, case):
    widget, kwargs = case
    wrong = {name for name, value in kwargs.items() if not RULES[widget][name](value)}
    try:
        built = _build(widget, kwargs)
    except (ValueError, TypeError) as error:
        message = str(error)
        assert wrong, f"refused valid arguments {kwargs}: {message}"
        assert any(message.startswith(f"{widget}: `{name}`") for name in wrong), (kwargs, message)
        return
    assert not wrong, f"accepted wrong {sorted(wrong)}: {kwargs}"
    for name in ("example", "head", "every_n_batches", "top_k", "max_tokens"):
        if name in kwargs and kwargs[name] is not None:
            value = getattr(built, name)
            assert type(value) is int and value == _int(kwargs[name])
    for name in ("query_tokens", "key_tokens"):
        if kwargs.get(name) is not None:
            assert getattr(built, name) == list(kwargs[name])
