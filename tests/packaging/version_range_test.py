"""setup.cfg's version ranges: floors are the pins `make test-compat` runs, installs are inside."""

import configparser
import importlib.metadata
import os

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANGED = ("keras", "tensorflow", "tensorflow-text", "jax")


def declared():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    lines = config["options"]["install_requires"].splitlines()
    for extra in config["options.extras_require"].values():
        lines += extra.splitlines()
    requirements = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            requirements[requirement.name] = requirement
    return requirements


def lowest_pins():
    pins = {}
    with open(os.path.join(ROOT, "tests", "compat", "lowest.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                name, version = line.split("==")
                pins[name] = Version(version)
    return pins


@pytest.mark.parametrize("name", RANGED)
def test_floor_is_the_lowest_tested_release(name):
    requirement, pin = declared()[name], lowest_pins()[name]
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert len(floors) == 1, requirement
    # `>=3.14` for a 3.14.0 pin (any patch of the minor), `>=0.4.38` for 0.4.38.
    assert floors[0].release == pin.release[: len(floors[0].release)], (requirement, pin)
    assert requirement.specifier.contains(pin), (requirement, pin)
    assert any(s.operator == "<" for s in requirement.specifier), f"{requirement}: no ceiling"


def test_tensorflow_text_spans_the_same_minors_as_tensorflow():
    requirements = declared()
    assert str(requirements["tensorflow-text"].specifier) == str(
        requirements["tensorflow"].specifier
    )


@pytest.mark.parametrize("name", RANGED)
def test_installed_release_is_inside_the_range(name):
    try:
        installed = Version(importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    assert declared()[name].specifier.contains(installed), (name, installed)
