"""Checks and helpers shared by every layer: one place, not one copy per family.

Validators raise a `ValueError`/`TypeError` that names the class the user
built, the argument and the received value, before any backend op runs.
"""

import math
import numbers

import keras


def describe(value):
    """A short description of `value` for error messages."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return repr(value)


def validate_positive_int(layer_name, argument, value, allow_none=False):
    """Raises a clear error unless `value` is a positive integer."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < 1
    ):
        raise ValueError(
            f"{layer_name}: `{argument}` must be a positive integer"
            f"{' or None' if allow_none else ''} (invalid value for argument "
            f"`{argument}`). Received: {argument}={value!r}"
        )
    return int(value)


def validate_non_negative_int(layer_name, argument, value):
    """Raises a clear error unless `value` is an integer >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < 0
    ):
        raise ValueError(
            f"{layer_name}: `{argument}` must be a non-negative integer. "
            f"Received: {argument}={value!r}"
        )
    return int(value)


def validate_bool(layer_name, argument, value):
    """Raises a clear error unless `value` is `True` or `False`."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{layer_name}: `{argument}` must be True or False. "
            f"Received: {argument}={value!r}"
        )
    return value


def validate_rate(layer_name, argument, value):
    """A probability in `[0, 1)`, such as a dropout rate."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"{layer_name}: `{argument}` must be a float in [0, 1). "
            f"Received: {argument}={value!r}"
        )
    return float(value)


def validate_seed(layer_name, value):
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral)
    ):
        raise TypeError(
            f"{layer_name}: `seed` must be an integer or None. "
            f"Received: seed={value!r}"
        )
    return value


def clone_initializer(initializer):
    """A fresh copy of `initializer`, so that two weights never start equal.

    Keras initializers are stateless: one instance called twice for the same
    shape returns the same values. As KerasHub's `clone_initializer`, every
    weight gets its own copy.
    """
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer  # a plain callable: nothing to copy
    return initializer.__class__.from_config(initializer.get_config())


def inverse_sqrt(dim):
    return 1.0 / math.sqrt(dim)
