"""`make demo` installs only the `text` extra and leaves TensorFlow's log level to
the demo's quiet start; `make test` installs the dev set and compiles XLA at LLVM
level 0, `make test-compat` at XLA's defaults. Read from `make -n`
(what make would run), so nothing is installed."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target):
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"},
    )
    return result.stdout


def recipe_environment(tmp_path):
    """The environment the Makefile gives its recipes (one added target prints it)."""
    probe = tmp_path / "probe.mk"
    probe.write_text("print-environment:\n\t@env\n")
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-s",
            "-f",
            "Makefile",
            "-f",
            str(probe),
            "print-environment",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"},
    )
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def test_demo_installs_only_the_text_extra():
    commands = dry_run("demo")
    installs = [line for line in commands.splitlines() if "pip install -e" in line]
    assert installs == ['.venv/bin/python -m pip install -e ".[text]"'], installs
    assert commands.splitlines()[-1] == ".venv/bin/python examples/date_translation.py"


def test_demo_leaves_the_log_level_to_the_quiet_start(tmp_path):
    # An exported TF_CPP_MIN_LOG_LEVEL=2 won over the quiet start's 3 (which only
    # sets it when unset) and let TensorFlow's E lines through mid-demo.
    assert "TF_CPP_MIN_LOG_LEVEL" not in dry_run("demo")
    assert "TF_CPP_MIN_LOG_LEVEL" not in recipe_environment(tmp_path)


def test_make_test_installs_the_dev_set():
    commands = dry_run("test-tf")
    assert '.venv/bin/python -m pip install -e ".[dev,text,widgets,jax]"' in commands
    assert "TF_CPP_MIN_LOG_LEVEL=2 " in commands and "KERAS_BACKEND=tensorflow" in commands


def pytest_lines(target):
    commands = dry_run(target).replace("\\\n", " ")  # a recipe's continued lines, joined
    return [line for line in commands.splitlines() if "-m pytest" in line]


def test_make_test_compiles_fast_and_test_compat_at_xla_defaults():
    # LLVM level 0 for `make test`'s many run-once programs; the compat run keeps
    # XLA's defaults, so the kernels and Keras' ported tests still run optimised.
    for target in ("test-tf", "test-jax"):
        (line,) = pytest_lines(target)
        assert "--xla_backend_optimization_level=0" in line, line
        assert "--xla_cpu_use_fusion_emitters=false" in line, line
        assert "--xla_cpu_parallel_codegen_split_count=1" in line, line
    compat = pytest_lines("test-compat")
    assert len(compat) == 2 and not any("XLA_FLAGS" in line for line in compat), compat


def test_make_test_lints_before_any_test():
    # ruff takes seconds; a lint finding should stop `make test` before the
    # 25-minute suite, so `ruff check` and `ruff format --check` run first.
    commands = [line for line in dry_run("test").splitlines() if "pip" not in line]
    ruff = [i for i, line in enumerate(commands) if "/ruff " in line]
    tests = [i for i, line in enumerate(commands) if "-m pytest" in line]
    assert [commands[i].split("/ruff ")[1] for i in ruff] == ["check .", "format --check ."]
    assert tests and max(ruff) < min(tests), commands


def test_make_test_opens_one_browser_page_per_test_and_test_browsers_every_page():
    # The 15 pages that repeat a widget's check in another front end or theme cost ~4
    # minutes of CI; `make test` leaves them to `make test-browsers`, which runs them all.
    (line,) = pytest_lines("test-tf")
    assert '-m "not benchmark and not front_end_matrix" tests' in line, line
    (line,) = pytest_lines("test-browsers")
    assert line.endswith(" tests/widgets/frontends_test.py") and ' -m "' not in line, line


def test_compat_leaves_out_what_make_test_checks_on_the_newest_releases():
    tensorflow, jax = pytest_lines("test-compat")
    assert '-m "not slow and not layer_detail and not both_backends"' in tensorflow, tensorflow
    assert "--ignore=tests/ops/block_sparse_test.py" in jax, jax
