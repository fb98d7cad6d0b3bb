import importlib.util
import os

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quickstart.py")


def test_quickstart_learns_to_look_at_the_keyword(capsys):
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLE)
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    accuracy = quickstart.main(["--samples", "800", "--epochs", "4", "--length", "8"])
    out = capsys.readouterr().out
    assert accuracy > 0.9
    assert "Mean attention weight on the keyword" in out
    weight = float(out.split("Mean attention weight on the keyword: ")[1].split()[0])
    assert weight > 0.5
