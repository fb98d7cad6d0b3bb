"""The README's Python snippets run as written."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _python_blocks():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_the_two_commands_and_snippets():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert "make demo" in text and "make test" in text
    assert len(_python_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_snippet_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    block = _python_blocks()[index]
    exec(compile(block, f"README.md[python block {index}]", "exec"), {})
    if "Seq2SeqTranslator.from_texts" in block:
        # The translator snippet prints a correct translation first.
        first_line = capsys.readouterr().out.splitlines()[0]
        assert first_line.split()[0] == "2019-03-05", first_line

