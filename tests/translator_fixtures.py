"""A small trained translator shared by the model and export tests.

Import the fixture in a test module: `from translator_fixtures import
trained_translator`.
"""

import random

import keras
import pytest

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven",
         "eight", "nine"]


def number_pairs(count, seed=0):
    """("three one four", "3 1 4") pairs: word-level, one-to-one, in order."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        digits = [rng.randrange(10) for _ in range(rng.randint(1, 5))]
        pairs.append((" ".join(WORDS[d] for d in digits),
                      " ".join(str(d) for d in digits)))
    return pairs


@pytest.fixture(scope="module")
def trained_translator():
    """Whitespace-tokenized number words -> digits, trained for a few seconds."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import Seq2SeqTranslator

    keras.utils.set_random_seed(1)
    pairs = number_pairs(1200)
    sources, targets = zip(*pairs)
    translator = Seq2SeqTranslator.from_texts(
        sources, targets, source_split="whitespace", target_split="whitespace",
        max_source_length=6, max_target_length=7, embedding_dim=16, units=32,
        attention="additive", seed=1,
    )
    translator.compile(optimizer=keras.optimizers.Adam(1e-2))
    translator.fit(translator.make_dataset(sources, targets, batch_size=32, seed=1),
                   epochs=6, verbose=0, shuffle=False)
    return translator


@pytest.fixture(scope="module")
def trained_transformer():
    """The same task for a small `TransformerTranslator`."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow backend")
    from keras_attention.models import TransformerTranslator

    keras.utils.set_random_seed(2)
    sources, targets = zip(*number_pairs(800, seed=3))
    translator = TransformerTranslator.from_texts(
        sources, targets, max_source_length=6, max_target_length=7,
        num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, seed=2,
    )
    translator.compile(optimizer=keras.optimizers.Adam(5e-3))
    translator.fit(translator.make_dataset(sources, targets, 32, seed=2),
                   epochs=3, verbose=0)
    return translator
