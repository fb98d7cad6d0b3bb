"""Layer helpers shared by every family: one place, not one copy per family.

The argument validators live in `keras_attention.validation` (shared with
models, export and widgets) and are re-exported here for the layers.
"""

import inspect
import math
import numbers
import types

import keras
import numpy as np

from keras_attention import validation
from keras_attention.validation import check_mask  # noqa: F401
from keras_attention.validation import check_mask_dtype  # noqa: F401
from keras_attention.validation import describe  # noqa: F401
from keras_attention.validation import validate_bool  # noqa: F401
from keras_attention.validation import validate_non_negative_int  # noqa: F401
from keras_attention.validation import validate_positive_int  # noqa: F401
from keras_attention.validation import validate_rate  # noqa: F401
from keras_attention.validation import validate_seed  # noqa: F401


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
        validation.error(
            layer,
            f"`{argument}` must hold real numbers (float, int or bool). "
            f"Received: {argument} with dtype {dtype}",
        )
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


def sublayer_arguments(layer):
    """The initializers (fresh copies) and dtype policy of a layer's
    `kernel_initializer` / `bias_initializer` for one of its sublayers."""
    return dict(
        kernel_initializer=clone_initializer(layer.kernel_initializer),
        bias_initializer=clone_initializer(layer.bias_initializer),
        dtype=layer.dtype_policy,
    )


def inverse_sqrt(dim):
    return 1.0 / math.sqrt(dim)


# ------------------------------------------------- our contract, by capability
CONTRACT_MARK = "follows_keras_attention_contract"


def follows_contract(method):
    """Marks a method of ours that follows keras_attention's call contract.

    Our `call` validates its inputs in `BaseAttention.__call__` and accepts
    every mask spelling; our `_compute_attention` takes one `AttentionMask`.
    A subclass written for Keras' layer (KerasHub's cached or XLNet
    attention) that overrides either brings its own contract: the base asks
    `has_contract(type(self).call)` instead of where the method was defined.
    """
    setattr(method, CONTRACT_MARK, True)
    return method


def has_contract(method):
    """Whether `method` (from the class, e.g. `type(layer).call`) is marked
    by `follows_contract`."""
    return getattr(method, CONTRACT_MARK, False)


def sublayers(layer):
    """`layer` and every layer under it, depth first.

    Keras 3 has no public recursive walk (`Model.layers` stops at the first
    level and plain layers have none), so this is the one place that calls
    Keras' `_flatten_layers`; `capture_attention`, `RedrawFeatures` and the
    widgets go through it.
    """
    return list(layer._flatten_layers(include_self=True, recursive=True))


def call_arguments(layer, args, kwargs):
    """The arguments of `layer.call(*args, **kwargs)` by name, defaults
    filled in (Python's TypeError for a name `call` does not take): how a
    `compute_output_spec(*args, **kwargs)` reads what Keras passes it without
    writing `call`'s parameter list again."""
    bound = inspect.signature(layer.call).bind(*args, **kwargs)
    bound.apply_defaults()
    return types.SimpleNamespace(**bound.arguments)
