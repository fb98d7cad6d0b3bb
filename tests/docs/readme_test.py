"""The README and the guides in docs/guides/: every code block runs as written, and
each `print(...)  # output` line prints what its comment says.

Blocks are fenced with a language: `python` blocks are executed (each in a fresh
namespace, in a temporary directory); `json` blocks must parse; `bash` blocks are
shell commands for the reader (installs, `make`, docker) and are not run here: the
packaging tests and the Makefile test cover those commands.
"""

import glob
import json
import os
import pathlib
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
DOCUMENTS = ["README.md"] + sorted(
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "guides", "*.md"))
)
NOT_RUN = {"bash", "json"}
_FENCE = re.compile(r"^```(\S*)\n(.*?)^```\s*$", flags=re.S | re.M)
# `print(x)  # (2, 5, 7): why` states the printed line: the comment up to ": ".
_STATED = re.compile(r"^print\(.*\)\s+#\s+(.+?)(?::\s.*)?$")


def blocks(document):
    with open(os.path.join(ROOT, document), encoding="utf-8") as f:
        text = f.read()
    return [(language, body) for language, body in _FENCE.findall(text)]


def stated_outputs(block):
    return [match.group(1).strip() for line in block.splitlines() if (match := _STATED.match(line))]


CASES = [
    (document, index)
    for document in DOCUMENTS
    for index, (language, _) in enumerate(blocks(document))
    if language == "python"
]


def test_readme_is_for_users():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    words = len(re.sub(r"```.*?```", " ", text, flags=re.S).split()) + sum(
        len(body.split()) for _, body in blocks("README.md")
    )
    assert words < 1500, words
    for needed in (
        "pip install .",
        "make dist",
        "not yet published",
        "make demo",
        "examples/quickstart.py",
        "LICENSE",
        "docs/guides/migration.md",
    ):
        assert needed in text, needed
    # What a new user runs first comes before any install mechanics.
    assert text.index("```python") < text.index("## Install")


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_is_labelled(document):
    languages = [language for language, _ in blocks(document)]
    assert languages, f"{document} has no code block"
    assert set(languages) <= NOT_RUN | {"python"}, languages


@pytest.mark.parametrize("document", DOCUMENTS)
def test_json_blocks_parse(document):
    for language, body in blocks(document):
        if language == "json":
            json.loads(body)


def test_output_comments_are_read():
    assert stated_outputs("print(x.shape)  # (2, 5, 7): one row per step\nprint(1)\n") == [
        "(2, 5, 7)"
    ]
    assert stated_outputs("print(best.text)  # 2019-03-05\n") == ["2019-03-05"]


@pytest.mark.parametrize("document, index", CASES, ids=[f"{d}[{i}]" for d, i in CASES])
def test_block_runs_and_prints_what_it_states(document, index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _, block = blocks(document)[index]
    if "keras_attention.widgets" in block:
        pytest.importorskip("bokeh")
    if "Seq2SeqTranslator" in block or "check_servable" in block:
        import keras

        if keras.backend.backend() != "tensorflow":
            pytest.skip("the translators need the TensorFlow backend")
    exec(compile(block, f"{document}[python block {index}]", "exec"), {})
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()]
    remaining = iter(printed)
    for expected in stated_outputs(block):
        assert any(line == expected for line in remaining), (
            f"{document} block {index} states {expected!r}; printed {printed}"
        )


def test_the_kernel_table_is_the_selectors():
    # docs/guides/long-sequences.md says the suite checks this.
    from keras_attention.layers.machinery import kernel_selector

    table = re.compile(r"^\| rule \| when \| kernel \|\n(?:^\|.*\|\n)+", flags=re.M)
    guide = pathlib.Path(ROOT, "docs", "guides", "long-sequences.md").read_text(encoding="utf-8")
    assert table.search(guide).group(0) == table.search(kernel_selector.__doc__ + "\n").group(0)
