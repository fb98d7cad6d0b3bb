"""One decorator marks a public symbol: registered for saving, listed in `__all__`.

`keras_attention.layers` (and so the package top level) exports exactly the
names decorated here, so helper modules never leak to `keras_attention.*`.
"""

import keras

PACKAGE = "keras_attention"
_PUBLIC = {}  # export group (e.g. "layers") -> list of names, in import order


def keras_attention_export(group, serializable=True):
    """Registers a class with Keras serialization and records it as public.

    Args:
        group: which public namespace lists the symbol (`"layers"`,
            `"models"`, ...).
        serializable: register with `keras.saving` (for layers, models,
            callbacks); `False` for plain helpers.
    """

    def decorate(symbol):
        if serializable and isinstance(symbol, type):
            keras.saving.register_keras_serializable(package=PACKAGE)(symbol)
        names = _PUBLIC.setdefault(group, [])
        if symbol.__name__ not in names:
            names.append(symbol.__name__)
        return symbol

    return decorate


def public_names(group):
    """The names exported under `group`, for that package's `__all__`."""
    return list(_PUBLIC.get(group, ()))
