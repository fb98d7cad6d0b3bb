"""Runs KerasHub's own test files with our MultiHeadAttention as Keras'.

KerasHub's tests are not in its wheel or sdist, so they come from a KerasHub
source checkout that the caller names (nothing of KerasHub is copied into
this repository):

    python tests/keras_hub/run_keras_hub_suite.py --source ~/src/keras-hub

The selected test files are copied to a temporary directory next to a
`conftest.py` that puts `keras_attention.MultiHeadAttention` in place of
`keras.layers.MultiHeadAttention` before anything imports `keras_hub`, so
KerasHub's `CachedMultiHeadAttention` (and everything built on it) subclasses
ours, and its `TransformerEncoder` / `TransformerDecoder` build ours. The
installed `keras_hub` package is the code under test; its test helpers
(`keras_hub.src.tests.test_case`) come from the wheel. Exit status is
pytest's.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

TEST_FILES = (
    "keras_hub/src/layers/modeling/cached_multi_head_attention_test.py",
    "keras_hub/src/layers/modeling/transformer_encoder_test.py",
    "keras_hub/src/layers/modeling/transformer_decoder_test.py",
)
# Subclasses of keras.layers.MultiHeadAttention inside KerasHub's models, run
# with `--models` (their backbones' tests, slower).
MODEL_TEST_FILES = (
    "keras_hub/src/models/whisper/whisper_backbone_test.py",
    "keras_hub/src/models/xlnet/xlnet_backbone_test.py",
    "keras_hub/src/models/moonshine/moonshine_layers_test.py",
    # ViT's encoder layer calls the attention inside its own `call`: on JAX
    # Keras traces it with symbolic shapes (#41).
    "keras_hub/src/models/vit/vit_backbone_test.py",
)

CONFTEST = '''\
"""Written by keras_attention's run_keras_hub_suite.py: ours as Keras' MHA."""
import keras

import keras_attention

keras.layers.MultiHeadAttention = keras_attention.MultiHeadAttention
import keras_hub  # noqa: E402,F401  (imported after the substitution)

assert keras_hub.layers.CachedMultiHeadAttention.__mro__[1] is keras_attention.MultiHeadAttention
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        default=os.environ.get("KERAS_HUB_SOURCE"),
        help="a KerasHub source checkout (default: $KERAS_HUB_SOURCE)",
    )
    parser.add_argument(
        "--models", action="store_true", help="also the model tests whose layers subclass it"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest")
    args = parser.parse_args(argv)
    if not args.source:
        parser.error("name a KerasHub checkout with --source or KERAS_HUB_SOURCE")
    files = TEST_FILES + (MODEL_TEST_FILES if args.models else ())
    missing = [f for f in files if not os.path.exists(os.path.join(args.source, f))]
    if missing:
        parser.error(f"not in {args.source}: {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as work:
        for name in files:
            target = os.path.join(work, os.path.basename(name))
            shutil.copy(os.path.join(args.source, name), target)
        with open(os.path.join(work, "conftest.py"), "w") as conftest:
            conftest.write(CONFTEST)
        # As KerasHub's own conftest by default: the preset tests (`large`,
        # `extra_large`) download weights, which this machine cannot.
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            work,
            "-m",
            "not large and not extra_large",
            "-W",
            "ignore::pytest.PytestUnknownMarkWarning",
            work,
            *args.pytest_args,
        ]
        return subprocess.call(command, cwd=work)


if __name__ == "__main__":
    sys.exit(main())
