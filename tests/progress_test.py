"""`progress_bar`: Keras' bar in a terminal or notebook; plain lines elsewhere."""

import io
import sys

import pytest

from keras_attention import progress

ESCAPES = ("\x1b", "\r", "\b")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_pipe_gets_one_plain_line_per_update(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    bar = progress.progress_bar(4, 1, unit_name="stage")
    bar.interval = 0  # every update prints (the default throttles to 20 per second)
    for done in range(1, 5):
        bar.update(done, finalize=done == 4)
    out = capsys.readouterr().out
    assert not any(code in out for code in ESCAPES), repr(out)
    lines = out.splitlines()
    assert [line.split(" ")[0] for line in lines] == ["1/4", "2/4", "3/4", "4/4"], lines
    assert all("/stage" in line for line in lines), lines


def test_a_terminal_keeps_keras_bar(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    bar = progress.progress_bar(2, 1)
    bar.update(2, finalize=True)
    monkeypatch.undo()
    assert type(bar) is progress.keras.utils.Progbar
    assert "\x1b[1m2/2" in terminal.getvalue()  # Keras' own bold counter


def test_verbose_two_is_keras_one_line_form(capsys):
    bar = progress.progress_bar(3, 2, unit_name="batch")
    for done in range(1, 4):
        bar.update(done, finalize=done == 3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("3/3") and "/batch" in lines[0], lines


@pytest.mark.parametrize("verbose", [3, True, "yes"])
def test_bad_verbose_names_the_owner(verbose):
    with pytest.raises(ValueError, match=f"translate: `verbose`.*verbose={verbose!r}"):
        progress.progress_bar(3, verbose, owner="translate")
