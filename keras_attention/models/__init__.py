"""Translators with attention, and what their decoding returns.

`Translation`, `DecodingStep` and `DecodingSession` import without
tensorflow-text. The translators (TensorFlow backend) import tensorflow-text
when they first process text, so `import keras_attention` can register them
for `keras.saving.load_model` without loading its kernels.
"""

from keras_attention.models.decoding import DecodingSession
from keras_attention.models.decoding import DecodingStep
from keras_attention.models.decoding import Translation

_LAZY = {
    "Seq2SeqTranslator": "keras_attention.models.seq2seq_translator",
    "TransformerTranslator": "keras_attention.models.transformer_translator",
    "Translator": "keras_attention.models.translator_base",
    "TextEncoder": "keras_attention.models.text_processing",
    "CausalDecodingSession": "keras_attention.models.causal_decoding",
    "CausalDecodingStep": "keras_attention.models.causal_decoding",
    "CacheView": "keras_attention.models.causal_decoding",
    "Sampling": "keras_attention.models.causal_decoding",
}


def register_serializables():
    """Registers the translators with Keras (TensorFlow backend only).

    Their modules import TensorFlow, which the TensorFlow backend has already
    loaded; on other backends nothing is imported (translators need TF).
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return
    import importlib

    for module in set(_LAZY.values()):
        importlib.import_module(module)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_attention.models' has no attribute {name!r}")


__all__ = ["DecodingSession", "DecodingStep", "Translation", *_LAZY]
