"""A small trained translator shared by the model and export tests.

Tests receive it by name: the fixtures `trained_translator` and
`trained_transformer` are in tests/conftest.py and call `trained_once` here.

Each translator is trained once per test run: the first module to ask trains
and saves it (`.keras`) in the run's shared temporary folder, the others load
that file (the xdist workers share it, under a file lock).
`keras_saving_test` trains its own (`train_translator()` /
`train_transformer()`), so the round trip it checks starts from a model
fresh from `fit`.
"""

import contextlib
import fcntl
import os
import random

import keras
import pytest

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def number_pairs(count, seed=0):
    """("three one four", "3 1 4") pairs: word-level, one-to-one, in order."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        digits = [rng.randrange(10) for _ in range(rng.randint(1, 5))]
        pairs.append((" ".join(WORDS[d] for d in digits), " ".join(str(d) for d in digits)))
    return pairs


def _run_folder(tmp_path_factory):
    """The folder every worker of this test run shares (never one of another run)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(path):
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def trained_once(tmp_path_factory, name, train):
    """`train()`'s model, trained by the first worker to ask and loaded by the others."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    path = str(_run_folder(tmp_path_factory) / f"{name}.keras")
    with _locked(path):
        if os.path.exists(path):
            return keras.models.load_model(path)
        translator = train()
        translator.save(path)
        return translator


def train_translator():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import Seq2SeqTranslator

    keras.utils.set_random_seed(1)
    pairs = number_pairs(1200)
    sources, targets = zip(*pairs, strict=True)
    translator = Seq2SeqTranslator.from_texts(
        sources,
        targets,
        source_split="whitespace",
        target_split="whitespace",
        max_source_length=6,
        max_target_length=7,
        embedding_dim=16,
        units=32,
        attention="additive",
        seed=1,
    )
    translator.compile(optimizer=keras.optimizers.Adam(1e-2))
    translator.fit(
        translator.make_dataset(sources, targets, batch_size=32, seed=1),
        epochs=6,
        verbose=0,
        shuffle=False,
    )
    return translator


def train_transformer():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import TransformerTranslator

    keras.utils.set_random_seed(2)
    sources, targets = zip(*number_pairs(800, seed=3), strict=True)
    translator = TransformerTranslator.from_texts(
        sources,
        targets,
        max_source_length=6,
        max_target_length=7,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        seed=2,
    )
    translator.compile(optimizer=keras.optimizers.Adam(5e-3))
    translator.fit(translator.make_dataset(sources, targets, 32, seed=2), epochs=3, verbose=0)
    return translator
