"""The unrelated 2019 `keras-attention` shares our import name: we say so."""

import os
import subprocess
import sys
import textwrap


def _fake_distribution(site, files):
    info = site / "keras_attention-1.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: keras-attention\nVersion: 1.0.0\n")
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in files))


def _import_warnings(site):
    code = textwrap.dedent(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import keras_attention
        print("\\n".join(str(w.message) for w in caught if "keras-attention" in str(w.message)))
        """
    )
    env = dict(os.environ)
    # The fake metadata first (it holds no package, so our checkout's
    # keras_attention is still the one imported), so that it is the
    # `keras-attention` distribution found even where a stale egg-info of our
    # own pre-rename editable install sits in the checkout.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([str(site), root])
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return result.stdout


def test_the_2019_package_installed_alongside_is_reported(tmp_path):
    _fake_distribution(
        tmp_path,
        [
            "keras_attention/__init__.py",
            "keras_attention/self_attention.py",
            "keras_attention/settings.py",
        ],
    )
    message = _import_warnings(tmp_path)
    assert "pip uninstall keras-attention" in message, message
    assert "keras-attention 1.0.0" in message


def test_a_distribution_of_that_name_without_its_files_is_not_reported(tmp_path):
    # Our own releases before the rename were called keras-attention too.
    _fake_distribution(
        tmp_path, ["keras_attention/__init__.py", "keras_attention/layers/__init__.py"]
    )
    assert _import_warnings(tmp_path).strip() == ""
