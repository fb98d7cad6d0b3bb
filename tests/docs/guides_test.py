"""The Python snippets of the written guides (docs/guides/) run as written."""

import glob
import os
import re

import pytest

GUIDES = sorted(
    glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guides", "*.md"))
)


def _python_blocks():
    blocks = []
    for path in GUIDES:
        with open(path, encoding="utf-8") as f:
            for i, block in enumerate(re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)):
                blocks.append((f"{os.path.basename(path)}[python block {i}]", block))
    return blocks


def test_the_migration_guide_has_a_snippet():
    assert any(name.startswith("migration.md") for name, _ in _python_blocks())


@pytest.mark.parametrize("name, block", _python_blocks(), ids=lambda x: x if "[" in str(x) else "")
def test_guide_snippet_runs(name, block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(block, name, "exec"), {})
