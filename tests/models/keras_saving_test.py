import json
import subprocess
import sys

import numpy as np
import pytest

from tests.translator_fixtures import train_transformer
from tests.translator_fixtures import train_translator

pytestmark = pytest.mark.tf_only


# Fresh from `fit` (the shared fixtures may have been loaded from a file this test checks).
@pytest.fixture(scope="module")
def trained_translator():
    return train_translator()


@pytest.fixture(scope="module")
def trained_transformer():
    return train_transformer()


TEXTS = ["three one four", "nine bonjour", ""]

# A fresh process, as a user would load the file: only `import keras_attention`,
# and any warning (e.g. "compile() was not restored") is an error.
_LOAD = """
import json, sys, warnings
warnings.simplefilter("error")
import keras, keras_attention
results = {}
for path in sys.argv[2:]:
    model = keras.saving.load_model(path)
    results[path] = {
        "class": type(model).__name__,
        "optimizer": type(model.optimizer).__name__,
        "learning_rate": float(model.optimizer.learning_rate),
        "loss": model.loss.get_config(),
        "translations": [
            {"text": t.text, "alignment": t.alignment.tolist(), "score": t.score}
            for t in model.translate(json.loads(sys.argv[1]), beam_width=2)
        ],
    }
print(json.dumps(results))
"""


def test_translators_round_trip_through_keras_files(
    trained_translator, trained_transformer, tmp_path
):
    translators = {
        str(tmp_path / "seq2seq.keras"): trained_translator,
        str(tmp_path / "transformer.keras"): trained_transformer,
    }
    for path, translator in translators.items():
        translator.save(path)
    result = subprocess.run(
        [sys.executable, "-c", _LOAD, json.dumps(TEXTS), *translators],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    for path, translator in translators.items():
        restored = loaded[path]
        assert restored["class"] == type(translator).__name__
        assert restored["optimizer"] == "Adam"
        assert restored["learning_rate"] == pytest.approx(float(translator.optimizer.learning_rate))
        assert restored["loss"]["ignore_class"] == 0
        expected = translator.translate(TEXTS, beam_width=2)
        assert [t["text"] for t in restored["translations"]] == [e.text for e in expected]
        assert any(e.text for e in expected)
        for got, want in zip(restored["translations"], expected, strict=True):
            np.testing.assert_allclose(
                np.array(got["alignment"]).reshape(want.alignment.shape), want.alignment, atol=1e-6
            )
            assert got["score"] == pytest.approx(want.score, abs=1e-5)
