"""The KerasHub `generate` benchmark runs and checks its tokens (#51).

Only that it runs at tiny sizes on the running backend, prints a row per
family and that every timed call gave KerasHub's tokens (the script raises
otherwise): the ratios come from running the script (benchmarks/RESULTS.md),
never from tests.
"""

import importlib.util
import os

import pytest

pytest.importorskip("keras_hub")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "keras_hub_generate.py")


def _script(monkeypatch):
    # In this process keras is imported already: no quiet start to ask for.
    monkeypatch.setenv("KERAS_ATTENTION_QUIET_STARTUP", "0")
    spec = importlib.util.spec_from_file_location("keras_hub_generate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.benchmark
def test_benchmark_times_keras_hub_and_ours_on_the_same_tokens(capsys, monkeypatch):
    script = _script(monkeypatch)
    rows = script.main(
        ["--families", "gemma", "gemma3", "--layers", "1", "--hidden", "16", "--new-tokens", "3"]
        + ["--repeats", "1"]
    )
    assert [row["family"] for row in rows] == ["gemma", "gemma3"]
    for row in rows:
        assert row["keras_hub_s"] > 0 and row["ours_s"] > 0 and row["ratio"] > 0
        assert row["tokens"].shape == (2, script.PROMPT + 3)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| gemma")]
    assert len(printed) == 2


@pytest.mark.slow
@pytest.mark.benchmark
def test_cache_bytes_of_window_rings_against_keras_hubs_full_caches(capsys, monkeypatch):
    """`--cache-length`: a windowed family's swapped LM carries rings on its
    local layers (Mistral: every layer, 4 slots of 24), Llama full caches."""
    script = _script(monkeypatch)
    rows = script.main(
        ["--cache-length", "24", "--window", "4", "--families", "mistral", "llama"]
        + ["--layers", "1", "--hidden", "16"]
    )
    ratios = {row["family"]: row["ratio"] for row in rows}
    assert ratios == {"mistral": 4 / 24, "llama": 1.0}
    assert all(row["same_tokens"] and row["keras_hub_bytes"] > 0 for row in rows)
