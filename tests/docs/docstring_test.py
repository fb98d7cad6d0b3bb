"""Docstring examples run, so they cannot drift from the code."""

import doctest
import importlib
import pkgutil

import pytest

import keras_attention

OPTIONAL = ("keras_attention.widgets", "keras_attention.export", "keras_attention.models")


def _modules():
    names = []
    for info in pkgutil.walk_packages(keras_attention.__path__, "keras_attention."):
        if info.name.startswith(OPTIONAL) or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
