"""The built wheel, installed as a user installs it: a fresh venv, only the extras named.

The venv's dependencies are this environment's installed distributions, linked in (only
those the wheel's requirements need, transitively): pip resolves the wheel's requirements
against them rather than unpacking TensorFlow again, which was most of this file's two
minutes.

`python -m build` runs on a copy of the tracked files (so nothing untracked or
built locally can fill a gap); the wheel must hold every tracked file under
`keras_attention/`, and the sdist everything README.md points to.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from keras_attention import _quiet

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DISTRIBUTION = "keras_attention_layers"
PENDING_GUIDES = {"docs/guides/migration.md"}


def _tracked_files():
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [
        path for path in listed.split("\0") if path and os.path.isfile(os.path.join(ROOT, path))
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    source = tmp_path_factory.mktemp("source")
    for path in _tracked_files():
        os.makedirs(os.path.dirname(source / path), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), source / path)
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = [out / name for name in os.listdir(out) if name.endswith(".whl")]
    (sdist,) = [out / name for name in os.listdir(out) if name.endswith(".tar.gz")]
    assert wheel.name.startswith(DISTRIBUTION + "-") and sdist.name.startswith(DISTRIBUTION + "-")
    return {"source": source, "wheel": wheel, "sdist": sdist}


def test_wheel_holds_every_package_file(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
    package_files = {p for p in _tracked_files() if p.startswith("keras_attention/")}
    assert package_files, "no tracked package files?"
    assert package_files - names == set()
    assert not {n for n in names if n.startswith(("tests/", "examples/", "benchmarks/"))}
    # Nor the browser tests' page checker (it once lived in keras_attention/widgets).
    assert not {n for n in names if "legibility" in n}, names
    entry_points = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(built["wheel"]) as wheel:
        assert (
            "keras-attention = keras_attention.export.__main__:main"
            in wheel.read(entry_points[0]).decode()
        )


def _apache_license_text(text):
    # The full Apache-2.0 text, not a stub or the metadata's one word.
    return (
        "Apache License" in text
        and "Version 2.0, January 2004" in text
        and "END OF TERMS AND CONDITIONS" in text
        and len(text) > 10000
    )


def test_wheel_and_sdist_hold_the_license(built):
    license_text = pathlib.Path(ROOT, "LICENSE").read_text(encoding="utf-8")
    assert _apache_license_text(license_text)
    with zipfile.ZipFile(built["wheel"]) as wheel:
        shipped = [
            n for n in wheel.namelist() if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"
        ]
        assert shipped, wheel.namelist()
        assert wheel.read(shipped[0]).decode() == license_text
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-File: LICENSE" in wheel.read(metadata).decode()
    with tarfile.open(built["sdist"]) as sdist:
        (member,) = [
            m for m in sdist.getmembers() if m.name.count("/") == 1 and m.name.endswith("/LICENSE")
        ]
        assert sdist.extractfile(member).read().decode() == license_text


def test_sdist_holds_what_the_readme_points_to(built):
    with tarfile.open(built["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    readme = pathlib.Path(ROOT, "README.md").read_text(encoding="utf-8")
    # Paths the README names: links and `code` spans that are files of the checkout.
    mentioned = set(re.findall(r"\]\(([^)#:]+)\)", readme))
    mentioned |= {
        p for p in re.findall(r"`([\w./-]+)`", readme) if os.path.isfile(os.path.join(ROOT, p))
    }
    mentioned |= {p for p in _tracked_files() if p.startswith("examples/")}
    mentioned |= {p for p in _tracked_files() if p.startswith("docs/guides/")}
    assert {"LICENSE", "CONTRIBUTING.md", "docs/guides/long-sequences.md"} <= mentioned
    assert "examples/notebooks/decoding_stepper.ipynb" in mentioned
    # A guide another change is writing may be linked before it lands.
    pending = {p for p in mentioned if not os.path.exists(os.path.join(ROOT, p))}
    assert pending <= PENDING_GUIDES, pending
    assert mentioned - pending - names == set()


def _venv_env():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", _quiet.ENV_VARIABLE)
    }
    env["KERAS_BACKEND"] = "tensorflow"
    return env


def _run(command, cwd, timeout=600, expect=0):
    result = subprocess.run(
        command, cwd=cwd, env=_venv_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == expect, (
        f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


LAYER_CHECK = """
import importlib.util, os
import numpy as np
import keras_attention
assert "site-packages" in keras_attention.__file__, keras_attention.__file__
for extra in ("bokeh", "ipywidgets", "tensorflow_text"):
    assert importlib.util.find_spec(extra) is None, extra  # no extras installed
x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype("float32")
out = np.asarray(keras_attention.LuongAttention(score="dot")(x))
scores = x @ x.transpose(0, 2, 1)
weights = np.exp(scores - scores.max(-1, keepdims=True))
weights /= weights.sum(-1, keepdims=True)
np.testing.assert_allclose(out, weights @ x, rtol=1e-4, atol=1e-5)
try:
    import keras_attention.widgets
except ImportError as error:
    assert "keras-attention-layers[widgets]" in str(error), error
else:
    raise AssertionError("widgets imported without the widgets extra")
try:
    from keras_attention.models import Seq2SeqTranslator
    Seq2SeqTranslator.from_texts(["one two"], ["two one"])
except ImportError as error:  # tensorflow-text really missing here: the extra is named
    assert "Seq2SeqTranslator.from_texts needs tensorflow-text" in str(error), error
    assert 'pip install "keras-attention-layers[text]"' in str(error), error
else:
    raise AssertionError("from_texts ran without the text extra")
print("layer ok")
"""


def _readme_first_example():
    readme = pathlib.Path(ROOT, "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]


WIDGET_IMPORT = (
    "from keras_attention.widgets import AttentionExplorer, DecodingStepper, "
    "LiveAttention, export_html; print('widgets ok')"
)


def _wheel_requirements(wheel, extras=()):
    """The wheel's own Requires-Dist lines that apply with `extras` (markers evaluated)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(name).decode()
    lines = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    return [
        requirement
        for requirement in map(Requirement, lines)
        if requirement.marker is None
        or any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))
    ]


def _installed_closure(requirements):
    """The distributions of this test's environment that `requirements` need, transitively."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installed = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
    # `requirements` apply as they are (their markers are the caller's); their own
    # requirements apply with the extras asked of them.
    needed, todo = {}, [(requirement, None) for requirement in requirements]
    while todo:
        requirement, extra = todo.pop()
        marker = requirement.marker if extra is not None else None
        if marker is not None and not marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        if name in needed:
            continue
        distribution = installed.get(name)
        if distribution is None:  # pip installs it from the index, as for a user
            continue
        needed[name] = distribution
        todo += [
            (Requirement(line), extra)
            for line in distribution.requires or []
            for extra in ("", *requirement.extras)
        ]
    return needed, installed


def _link_installed(requirements, target):
    """Links the installed files of what `requirements` need into `target`, and nothing of
    any other distribution: a venv that has `target` on its path then holds those
    distributions as if pip had installed them (without unpacking TensorFlow again, most of
    the time this test took), and pip, resolving the wheel's requirements, finds them there."""
    needed, installed = _installed_closure(requirements)
    owners = {}  # relative path (and every folder above it) -> the distributions owning it
    for name, distribution in installed.items():
        for file in distribution.files or []:
            parts = file.parts
            if parts[0] == "..":  # console scripts outside site-packages
                continue
            for depth in range(1, len(parts) + 1):
                owners.setdefault(parts[:depth], set()).add(name)
    linked = set(needed)
    for name, distribution in needed.items():
        assert distribution.files, f"{name} lists no files (RECORD): cannot link it"
        for file in distribution.files:
            parts = file.parts
            if parts[0] == "..":
                continue
            # The shallowest folder (or the file) that no distribution outside `needed` shares.
            depth = next(d for d in range(1, len(parts) + 1) if owners[parts[:d]] <= linked)
            link = target.joinpath(*parts[:depth])
            if not os.path.lexists(link):
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(distribution.locate_file(pathlib.Path(*parts[:depth])))


def test_wheel_installs_and_runs_in_a_fresh_venv(built, tmp_path):
    # A venv of its own with the wheel installed in it; its dependencies are the ones this
    # environment installed (the closure of the wheel's Requires-Dist, and nothing else: the
    # extras' absence is checked below), linked in through a .pth file. pip resolves the
    # wheel's requirements against them (a version outside the wheel's ranges would be
    # installed again, and so would anything missing).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, pip = str(venv / "bin" / "python"), [str(venv / "bin" / "python"), "-m", "pip"]
    wheel = str(built["wheel"])
    # Outside the venv: pip never uninstalls what lies outside its environment, so nothing
    # of this environment can be removed through the links.
    dependencies = tmp_path / "dependencies"
    _link_installed(_wheel_requirements(wheel), dependencies)
    (site_packages,) = (venv / "lib").glob("python*/site-packages")
    (site_packages / "installed_dependencies.pth").write_text(f"{dependencies}\n")

    installed = _run(pip + ["install", wheel], cwd=tmp_path).stdout
    assert "Successfully installed keras-attention-layers" in installed, installed
    assert "layer ok" in _run([python, "-c", LAYER_CHECK], cwd=tmp_path).stdout
    # The README's 30-second example, on the bare install it tells users to make.
    example = _run([python, "-c", _readme_first_example()], cwd=tmp_path)
    assert example.stdout.splitlines()[-1] == "(2, 1)", example.stdout

    # The console script, beside `python -m keras_attention.export check`.
    missing = _run(
        [str(venv / "bin" / "keras-attention"), "check", str(tmp_path / "none")],
        cwd=tmp_path,
        expect=2,
    )
    assert "is not a SavedModel" in missing.stderr

    _link_installed(_wheel_requirements(wheel, ("text", "widgets")), dependencies)
    _run(pip + ["install", "-q", f"{wheel}[text,widgets]"], cwd=tmp_path)
    assert "widgets ok" in _run([python, "-c", WIDGET_IMPORT], cwd=tmp_path).stdout
    demo = tmp_path / "demo"
    example = str(built["source"] / "examples" / "date_translation.py")
    _run(
        [
            python,
            example,
            "--train-size",
            "300",
            "--test-size",
            "10",
            "--epochs",
            "1",
            "--units",
            "8",
            "--embedding-dim",
            "4",
            "--min-accuracy",
            "0",
            "--examples",
            "1",
            "--output-dir",
            str(demo),
        ],
        cwd=tmp_path,
    )
    check = _run(
        [
            str(venv / "bin" / "keras-attention"),
            "check",
            str(demo / "saved_model"),
            "--verbose",
            "0",
        ],
        cwd=tmp_path,
    )
    assert "servable by TF Serving" in check.stdout, check.stdout
    logged = [
        line for line in (check.stdout + check.stderr).splitlines() if _quiet.is_startup_noise(line)
    ]
    assert logged == [], logged
