import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_core_import_does_not_load_widget_libraries():
    result = run_python("""
        import sys, keras_attention
        loaded = sorted(m for m in ("ipywidgets", "bokeh", "jupyter_bokeh") if m in sys.modules)
        print("LOADED", loaded)
    """)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout


def test_widgets_without_the_extra_name_the_extra():
    # A None entry in sys.modules makes `import ipywidgets` fail, as if not installed.
    result = run_python("""
        import sys
        sys.modules["ipywidgets"] = None
        try:
            import keras_attention.widgets
        except ImportError as error:
            print("MESSAGE", error)
    """)
    assert result.returncode == 0, result.stderr
    assert "MESSAGE" in result.stdout
    assert "`widgets` extra" in result.stdout and "keras-attention-layers[widgets]" in result.stdout
    assert "ipywidgets" in result.stdout
