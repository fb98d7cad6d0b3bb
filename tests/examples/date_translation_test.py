import datetime
import importlib.util
import os
import subprocess
import sys

import pytest

from keras_attention import _quiet

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "date_translation.py")


def _env_as_a_user_has_it():
    """Our test session's environment, less what it sets to quiet TensorFlow."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", _quiet.ENV_VARIABLE)
    }


def _load_example():
    spec = importlib.util.spec_from_file_location("date_translation", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_date_formats_cover_the_documented_examples():
    example = _load_example()
    formats = example.date_formats(datetime.date(2019, 3, 5))
    for text in ("mardi 5 mars 2019", "Tue, Mar 5 2019", "5/3/19"):
        assert text in formats
    assert "1er août 1999" in example.date_formats(datetime.date(1999, 8, 1))
    assert "1/8/49" in example.date_formats(datetime.date(2049, 8, 1))


def test_held_out_dates_are_never_trained_on():
    example = _load_example()
    train, test = example.make_dates(3000, 200, seed=4)
    assert len(train) == 3000 and len(test) == 200
    assert not {t for _, t in train} & {t for _, t in test}
    for source, target in train[:200]:
        assert datetime.date.fromisoformat(target)
        assert source


@pytest.mark.tf_only
@pytest.mark.slow
def test_demo_runs_end_to_end_on_reduced_sizes(tmp_path):
    output = tmp_path / "demo"
    result = subprocess.run(
        [
            sys.executable,
            EXAMPLE,
            "--train-size",
            "600",
            "--test-size",
            "20",
            "--epochs",
            "1",
            "--units",
            "8",
            "--embedding-dim",
            "4",
            "--min-accuracy",
            "0",
            "--examples",
            "2",
            "--attention",
            "low_rank",
            "--output-dir",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env_as_a_user_has_it(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Quiet by default: not one line of TensorFlow's absl/oneDNN/cuInit block.
    logged = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if _quiet.is_startup_noise(line) or _quiet._LOG_LINE.match(line)
    ]
    assert logged == [], logged
    # No warning a user would read as a fault: AutoGraph's "could not
    # transform <function _gcd_import>" was the demo's first line (#35).
    warned = [line for line in (result.stdout + result.stderr).splitlines() if "WARNING" in line]
    assert warned == [], warned
    # Piped to a file: plain lines, no escape codes (progress bars included).
    escapes = [
        line
        for line in (result.stdout + result.stderr).splitlines(True)
        if any(code in line for code in ("\x1b", "\r", "\b"))
    ]
    assert escapes == [], escapes
    out = result.stdout
    assert "held-out exact match:" in out
    assert "OK, servable by TF Serving" in out
    assert "'mardi 5 mars 2019'" in out and "<- " in out  # alignment chart
    reloaded = out.split("fresh process")[-1]
    assert "'Tue, Mar 5 2019'" in reloaded
    html = (output / "alignment.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "<table>" in html
    assert "http" not in html  # self-contained
    assert (output / "saved_model" / "saved_model.pb").exists()
    assert (output / "saved_model" / "assets.extra" / "tf_serving_warmup_requests").exists()
