"""The GPU check runs its CPU smoke configuration end to end.

Only that it runs and reports: every public layer passes its correctness
checks (on a CPU the "device" is the CPU, so this proves the script, the
cases and the layers under `jax.jit` in float32 and mixed_bfloat16), and
every implementation has speed rows. Speed is never asserted here; the GPU
numbers come from running benchmarks/gpu_check.sh (benchmarks/RESULTS.md).
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
# Imported after the sys.path entry above: benchmarks/ is not a package.
import gpu_check  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="the GPU check runs on JAX"
)


@pytest.mark.slow
@pytest.mark.benchmark
def test_smoke_run_checks_every_layer_and_times_every_implementation(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax")
    env["PYTHONPATH"] = os.path.abspath(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run(
        [sys.executable, SCRIPT, "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        env=env,
        timeout=600,
    )
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["children"] == []
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check")

    rows = report["correctness"]
    checked = {row["layer"] for row in rows}
    assert checked == set(gpu_check.public_layers())
    assert [row for row in rows if row["status"] != "passed"] == []
    for layer in checked:
        assert {r["dtype"] for r in rows if r["layer"] == layer} == {"float32", "bfloat16"}
    kernels = {r["variant"]: r["kernel"] for r in rows if r["layer"] == "MultiHeadAttention"}
    # The "dense" variant (flash_attention=False, no weights asked for) runs
    # the materialised composite kernel, as Keras does.
    assert kernels["blockwise"] == "blockwise" and kernels["dense"] == "composite"
    # What the compiled program runs, read from its text, agrees: the dense
    # kernel holds the 128 x 96 weights in one tensor, the tiled ones never.
    mha = [r for r in rows if r["layer"] == "MultiHeadAttention"]
    compiled = {(r["variant"], r["dtype"]): r["compiled"] for r in mha}
    assert compiled["dense", "float32"] == "128x96 in one tensor"
    assert compiled["blockwise", "bfloat16"].startswith("no 128x96 tensor")
    for variant in ("blockwise + mods", "blockwise rotary", "blockwise dropout (training)"):
        assert compiled[variant, "float32"].startswith("no 128x128 tensor"), variant
    # The bounded cache decodes through its ring on the device (#51).
    assert {d for v, d in compiled if v.startswith("ring cache decode")} == {"float32", "bfloat16"}

    speed = report["speed"]
    assert report["matmul"] and report["matmul"][0]["tflops"] > 0
    for impl in gpu_check.IMPLEMENTATIONS:
        timed = [r for r in speed if r["impl"] == impl and r.get("time_s")]
        if impl == "keras_flash":  # Keras raises without cuDNN
            (row,) = [r for r in speed if r["impl"] == impl]
            assert timed or "cuDNN" in row["status"]
            continue
        assert timed, impl
        assert all(r["status"] == "ok" for r in timed)
        if impl in gpu_check.EXACT:
            assert all(r["useful_tflops"] > 0 for r in timed)
    assert any(t["target"].startswith("longest exact") for t in report["targets"])


def test_every_public_layer_has_a_case():
    gpu_check.check_cases_cover_public_layers(gpu_check.layer_cases())
    assert set(gpu_check.layer_cases()) == set(gpu_check.public_layers())
