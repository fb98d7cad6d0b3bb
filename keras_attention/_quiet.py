"""TensorFlow's start-up log block, hidden for our own entry points only.

Importing TensorFlow prints an absl/oneDNN/CUDA block on stderr ("WARNING: All
log messages before absl::InitializeLog() ...", `I0000 ... port.cc] oneDNN
custom operations are on`, `E0000 ... failed call to cuInit`) that
`TF_CPP_MIN_LOG_LEVEL` does not reach on recent releases (2.21 here): it is
written before absl reads any setting. So an entry point that wants a quiet
start (our examples, benchmarks, docs/make_figures.py and the `check` command)
asks for it before `keras` is imported, in one of two ways:

- it sets `KERAS_ATTENTION_QUIET_STARTUP=1` in `os.environ` before its first
  `import keras_attention` (which must come before `import keras`), or
- it is our command line, `python -m keras_attention.export` or the
  `keras-attention` console script (read from `sys.orig_argv`).

Asked for after tensorflow was imported (a script that imports keras first),
it can do nothing and says so in a RuntimeWarning.

Then `import keras_attention` sets `TF_CPP_MIN_LOG_LEVEL=3` unless the user
set it: TensorFlow's later native log lines stay hidden too, including the
ERROR-level notes it prints mid-training ("oneDNN supports DT_INT64 only on
platforms with AVX-512"); real failures still reach the program as Python
exceptions, and FATAL lines always print. While Keras imports TensorFlow, file
descriptor 2 goes to a buffer; the lines of the block are dropped and every
other line is written back. Any other process that imports the library sees
no change: no environment variable, logger or file descriptor is touched.
"""

import contextlib
import os
import re
import sys
import tempfile
import warnings

ENV_VARIABLE = "KERAS_ATTENTION_QUIET_STARTUP"
CONSOLE_SCRIPT = "keras-attention"
CLI_MODULES = ("keras_attention.export", "keras_attention.export.__main__")

# One TensorFlow/absl log line: "I0000 00:00:1796.5  7406 port.cc:153] ..."
# (absl, TF 2.19+) or "2026-12-01 10:00:00.1: I tensorflow/core/util/port.cc:113] ..."
# (TF's own logging, TF <= 2.18).
_LOG_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: )?"
    r"(?P<level>[IWEF])(?:\d{4} \d\d:\d\d:\d+\.\d+\s+\d+)?\s*\S+:\d+\] (?P<message>.*)$"
)
_NOISE_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
)
_NOISE_PREFIXES = ("To enable the following instructions:",)
# ERROR lines that only say "no GPU here" (a CPU-only machine, a CUDA wheel).
_CUDA_ABSENT = re.compile(
    r"failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"Could not find cuda drivers|TF-TRT Warning"
)


def is_startup_noise(line):
    """True for the lines of TensorFlow's start-up block (INFO, WARNING, no-GPU errors)."""
    text = line.rstrip("\r\n")
    if text in _NOISE_LINES or text.startswith(_NOISE_PREFIXES):
        return True
    match = _LOG_LINE.match(text)
    if match is None:
        return False
    if match["level"] in "IW":
        return True
    return match["level"] == "E" and bool(_CUDA_ABSENT.search(match["message"]))


def requested(environ=None, orig_argv=None):
    """Did this process's entry point ask for a quiet start?"""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_VARIABLE, "") not in ("", "0"):
        return True
    argv = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] in CLI_MODULES:
        return True
    return any(os.path.basename(arg) == CONSOLE_SCRIPT for arg in argv[:2])


@contextlib.contextmanager
def filtered_stderr():
    """Reads fd 2 while the block runs; writes back the lines that are not noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as buffer:
        os.dup2(buffer.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buffer.seek(0)
            kept = [
                line
                for line in buffer.read().decode("utf-8", "replace").splitlines(True)
                if not is_startup_noise(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


LATE_WARNING = (
    f"{ENV_VARIABLE}=1 has no effect here: tensorflow was imported before "
    "keras_attention (`import keras` imports it), so TensorFlow's start-up log is "
    "already printed and its native log level is fixed. Set the variable and "
    "`import keras_attention` before keras or tensorflow, or set "
    "TF_CPP_MIN_LOG_LEVEL=3 in the environment before Python starts."
)


@contextlib.contextmanager
def quiet_startup():
    """Around the first `import keras`, when the entry point asked for it.

    Too late when tensorflow is already imported: then it warns once
    (`LATE_WARNING`), unless `TF_CPP_MIN_LOG_LEVEL=3` was set already.
    """
    if not requested():
        yield
        return
    if "tensorflow" in sys.modules:
        if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "3":
            warnings.warn(LATE_WARNING, RuntimeWarning, stacklevel=3)
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with filtered_stderr():
        yield
        if "tensorflow" in sys.modules:
            # Device discovery logs the cuInit line: do it inside the filter.
            sys.modules["tensorflow"].config.list_physical_devices()
