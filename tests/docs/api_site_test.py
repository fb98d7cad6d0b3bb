"""The API reference site: built with warnings as errors, every public symbol on it."""

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys

import pytest

import keras_attention
from keras_attention import _quiet

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]  # translators import on TF only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def every_public_symbol():
    """(module, name, defining path) for each name of each `__all__` in the package."""
    found = []
    modules = ["keras_attention"] + [
        info.name for info in pkgutil.walk_packages(keras_attention.__path__, "keras_attention.")
    ]
    for module_name in modules:
        if module_name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            if not inspect.ismodule(value):
                found.append((module_name, name, f"{value.__module__}.{value.__qualname__}"))
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, KERAS_BACKEND="tensorflow",
               **{_quiet.ENV_VARIABLE: "1"})
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "WARNING" not in result.stderr, result.stderr[-5000:]
    pages = {}
    for folder, _, files in os.walk(site_dir):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(folder, name)
                pages[os.path.relpath(path, site_dir)] = open(path, encoding="utf-8").read()
    return pages


def test_every_public_symbol_has_an_entry(site):
    ids = set()
    for name, page in site.items():
        if name.startswith("api" + os.sep):
            ids |= set(re.findall(r'id="([\w.]+)"', page))
    symbols = every_public_symbol()
    assert len(symbols) > 50
    missing = [f"{module}.{name}" for module, name, path in symbols if path not in ids]
    assert missing == []


def test_readme_sections_are_guide_pages(site):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    titles = [t.replace("`", "") for t in re.findall(r"^## (.+)$", readme, flags=re.MULTILINE)]
    headings = []
    for name, page in site.items():
        written = os.path.join(ROOT, "docs", os.path.splitext(name)[0] + ".md")
        if name.startswith("guides" + os.sep) and not os.path.exists(written):
            for heading in re.findall(r"<h1[^>]*>(.*?)</h1>", page, flags=re.DOTALL):
                text = re.sub(r"<[^>]+>|¶|&para;", "", heading).replace("&#x27;", "'").strip()
                headings.append(text)
    assert len(titles) > 5
    assert sorted(headings) == sorted(titles)


def test_site_needs_no_network(site):
    for name, page in site.items():
        external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?:[^"]+)"', page)
        assert external == [], (name, external)
