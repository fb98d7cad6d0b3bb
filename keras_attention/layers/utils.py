"""Checks and helpers shared by every layer: one place, not one copy per family.

Validators raise a `ValueError`/`TypeError` that names the class the user
built, the argument and the received value, before any backend op runs.
"""

import math
import numbers

import keras
import numpy as np


def describe(value):
    """A short description of `value` for error messages."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return repr(value)


def _is_real_or_bool(dtype):
    dtype = str(dtype)
    return "bool" in dtype or "int" in dtype or "float" in dtype


def check_mask_dtype(error, name, mask):
    """Raises a TypeError unless `mask` holds booleans or numbers."""
    if not _is_real_or_bool(mask.dtype):
        # NumPy text arrays ("<U3") are strings, as TensorFlow names them.
        kind = getattr(mask.dtype, "kind", "")
        dtype = "string" if kind in ("U", "S", "O") else mask.dtype
        raise TypeError(
            error(
                f"`{name}` must be boolean (or 0/1 numbers), True where "
                f"attention is allowed. Received: {name} with dtype {dtype}"
            )
        )


def check_mask(error, name, mask, expected, broadcast=False):
    """Checks a mask's dtype and shape against `expected` (None = any).

    `error` formats a message with the name of the layer the user built.

    With `broadcast=True` a mask of lower rank is right-aligned against
    `expected` and any dimension may be 1 (as `attention_mask` in Keras).
    """
    if mask is None:
        return
    if not hasattr(mask, "dtype") or not hasattr(mask, "shape"):
        raise TypeError(
            error(
                f"`{name}` must be a boolean tensor. Received: "
                f"{name}={describe(mask)}"
            )
        )
    check_mask_dtype(error, name, mask)
    shape = tuple(mask.shape)
    if broadcast:
        ok = 2 <= len(shape) <= len(expected)
        aligned = expected[len(expected) - len(shape) :]
    else:
        ok = len(shape) == len(expected)
        aligned = expected
    ok = ok and all(
        got is None
        or want is None
        or got == want
        or (got == 1 and (broadcast or i == 0))
        for i, (got, want) in enumerate(zip(shape, aligned))
    )
    if not ok:
        how = " or broadcast to it" if broadcast else ""
        raise ValueError(
            error(
                f"`{name}` must have shape {tuple(expected)}{how} (None = "
                f"any). Received: {name} with shape {shape}"
            )
        )


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


def cast_to_compute_dtype(layer, x, argument="inputs"):
    """`x` in `layer.compute_dtype` when it holds integers or booleans.

    Float inputs are left to Keras' autocasting; integers would otherwise
    run the arithmetic in integers (weights truncated to 0) or fail in a
    backend op. Anything else (strings, complex) is a TypeError naming the
    layer and the argument.
    """
    if x is None or not hasattr(x, "dtype"):
        return x
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "float" in dtype:
        return x
    if "int" in dtype or dtype == "bool":
        return keras.ops.cast(x, layer.compute_dtype)
    raise TypeError(
        f"{type(layer).__name__} (layer '{layer.name}'): `{argument}` must "
        f"hold real numbers (float, int or bool). Received: {argument} with "
        f"dtype {dtype}"
    )


def concrete_int(value):
    """The Python int of a concrete scalar, or None while it is symbolic.

    Concrete: a Python or NumPy integer, an eager TensorFlow tensor, a JAX
    array outside a trace. Symbolic (a `tf.function` or `jax.jit` trace, a
    `KerasTensor`): its value is unknown until the compiled program runs.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, np.ndarray) and value.shape == ():
        return int(value)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if isinstance(value, tf.Tensor) and not tf.is_symbolic_tensor(value):
            return int(value.numpy()) if value.shape.rank == 0 else None
    elif backend == "jax":
        import jax

        if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
            return int(value) if value.shape == () else None
    return None


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
