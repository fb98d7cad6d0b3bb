"""KerasHub's attention classes run on ours and give Keras' outputs.

KerasHub subclasses `keras.layers.MultiHeadAttention` (its cached attention,
Whisper's, XLNet's two-stream attention) and builds it inside its Transformer
blocks, reaching for Keras' protected surface (`_num_heads`, `_query_dense`,
`_get_common_kwargs_for_sublayer`, `_build_attention`, `_masked_softmax`,
`_dot_product_equation`, `_combine_equation`, ...). `keras_hub_worker.py`
builds those classes twice, in two processes: on Keras' layer, and with ours
substituted before `keras_hub` is imported, with the same random weights
and biases. Their outputs must agree.

KerasHub's own test files are not shipped in its wheel or sdist;
`run_keras_hub_suite.py --source CHECKOUT` runs them with ours substituted
where a checkout is at hand (`KERAS_HUB_SOURCE`, see CONTRIBUTING.md).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
pytest.importorskip("keras_hub")


def _worker(mode, out, *extra):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "keras_hub_worker.py"),
            mode,
            str(out),
            *map(str, extra),
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert done.returncode == 0, f"{mode} worker failed:\n{done.stdout[-4000:]}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keras_hub")
    _worker("keras", folder / "keras.npz")
    _worker("ours", folder / "ours.npz", folder / "keras_weights.npz")
    return dict(np.load(folder / "keras.npz")), dict(np.load(folder / "ours.npz"))


CASES = [
    "cached/call",
    "cached/causal",
    "cached/scores",
    "cached/steps",
    "cached/cache",
    "cached/cross",
    "encoder",
    "decoder",
    "decoder/steps",
    "whisper/encoder_sequence_output",
    "whisper/decoder_sequence_output",
    "xlnet",
]


@pytest.mark.parametrize("case", CASES)
def test_keras_hub_class_on_ours_matches_it_on_keras(outputs, case):
    keras_out, ours_out = outputs
    assert set(keras_out) == set(ours_out) and case in keras_out
    np.testing.assert_allclose(ours_out[case], keras_out[case], atol=2e-5, rtol=1e-5)


def test_keras_hub_own_suite_when_a_checkout_is_given():
    source = os.environ.get("KERAS_HUB_SOURCE")
    if not source:
        pytest.skip(
            "KerasHub's test files ship in neither its wheel nor its sdist: "
            "set KERAS_HUB_SOURCE to a keras-hub checkout to run them"
        )
    command = [
        sys.executable,
        os.path.join(HERE, "run_keras_hub_suite.py"),
        "--source",
        source,
        "--models",
    ]
    assert subprocess.run(command, check=False).returncode == 0
