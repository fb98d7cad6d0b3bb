"""Runs a distribution worker in a fresh process and reads its JSON result."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_worker(module, args, backend, timeout, extra_env=None):
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra_env or {})
    completed = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode or not lines:
        raise AssertionError(
            f"{module} failed (exit {completed.returncode}):\n"
            f"{completed.stdout[-4000:]}\n{completed.stderr[-6000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])
