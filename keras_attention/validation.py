"""Argument checks shared by layers, models, export and widgets: one module.

Every validator takes an `owner` first: what the user built or called, used
to start the message. It is either a string (a class name while `__init__`
runs, before the layer has a name, or `"Translator.translate"` for a
function) or an object: a Keras layer is named `Class (layer 'name')`, any
other object by its class. Messages end in Keras' `Received: arg=value` form.

NumPy scalars and 0-d arrays count as the Python numbers they hold
(`np.int64(2)` is an integer, `np.bool_(True)` a bool); a float is never an
integer and a bool is never a number.
"""

import contextlib
import contextvars
import numbers

import numpy as np

# The composite layer under construction, whose name the errors of the layers
# it builds carry (see `errors_name`).
_composite_owner = contextvars.ContextVar("keras_attention_composite_owner", default=None)


@contextlib.contextmanager
def errors_name(owner):
    """Inside, layers under construction name `owner` in their argument errors.

    A composite layer (`AttentionPooling`) builds its sublayer from the
    arguments the user gave the composite: an error about them must name the
    layer the user built. The sublayer's constructor asks
    `constructor_owner(self)`.
    """
    token = _composite_owner.set(owner)
    try:
        yield
    finally:
        _composite_owner.reset(token)


def constructor_owner(layer):
    """The name a constructor's argument errors carry: the composite being
    built around `layer` (`errors_name`), else `layer`'s class."""
    return _composite_owner.get() or type(layer).__name__


def owner_name(owner):
    """The name an error message starts with (see the module docstring)."""
    if isinstance(owner, str):
        return owner
    name = getattr(owner, "name", None)
    cls = type(owner).__name__
    # Keras layers (and models) have a `name`; other objects use their class.
    if isinstance(name, str) and hasattr(owner, "built"):
        return f"{cls} (layer '{name}')"
    return cls


def error(owner, message):
    """`"<owner>: <message>"`, the form of every error in the package."""
    return f"{owner_name(owner)}: {message}"


def describe(value):
    """A short description of `value` for error messages."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return repr(value)


def as_python_scalar(value):
    """A NumPy scalar or 0-d NumPy array as the Python number it holds.

    Anything else comes back unchanged (tensors included: an eager 0-d
    tensor is read with `concrete_int` where a value is needed).
    """
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.shape == ()):
        return value.item()
    return value


def is_int(value):
    """True for Python and NumPy integers (and 0-d integer arrays), not bools."""
    value = as_python_scalar(value)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value):
    """True for Python and NumPy ints and floats, not bools."""
    value = as_python_scalar(value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def validate_positive_int(owner, argument, value, allow_none=False):
    """`value` as an int >= 1 (or None with `allow_none`)."""
    if value is None and allow_none:
        return None
    if not is_int(value) or as_python_scalar(value) < 1:
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be a positive integer"
                f"{' or None' if allow_none else ''} (invalid value for argument "
                f"`{argument}`). Received: {argument}={value!r}",
            )
        )
    return int(as_python_scalar(value))


def validate_non_negative_int(owner, argument, value, allow_none=False):
    """`value` as an int >= 0 (or None with `allow_none`)."""
    if value is None and allow_none:
        return None
    if not is_int(value) or as_python_scalar(value) < 0:
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be a non-negative integer"
                f"{' or None' if allow_none else ''}. Received: "
                f"{argument}={value!r}",
            )
        )
    return int(as_python_scalar(value))


def validate_int_in_range(owner, argument, value, low, high):
    """`value` as an int with `low <= value < high`."""
    if not is_int(value) or not low <= as_python_scalar(value) < high:
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be an integer in [{low}, {high}). "
                f"Received: {argument}={value!r}",
            )
        )
    return int(as_python_scalar(value))


def validate_bool(owner, argument, value):
    """`value` as a Python bool; only `True`/`False` (NumPy bools too) pass.

    Truthy stand-ins ("no", 1, None) are refused: `bool("no")` is True.
    """
    value_ = as_python_scalar(value)
    if not isinstance(value_, bool):
        raise TypeError(
            error(
                owner,
                f"`{argument}` must be True or False. Received: {argument}={value!r}",
            )
        )
    return value_


def validate_rate(owner, argument, value):
    """A probability in `[0, 1)`, such as a dropout rate, as a float."""
    if not is_real(value) or not 0.0 <= as_python_scalar(value) < 1.0:
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be a float in [0, 1). Received: {argument}={value!r}",
            )
        )
    return float(as_python_scalar(value))


def validate_real(owner, argument, value, low=None, high=None, include_low=True):
    """`value` as a float, optionally bounded (`low` inclusive unless told)."""
    ok = is_real(value) and np.isfinite(float(as_python_scalar(value)))
    if ok:
        number = float(as_python_scalar(value))
        if low is not None:
            ok = number >= low if include_low else number > low
        if high is not None:
            ok = ok and number <= high
    if not ok:
        bounds = ""
        if low is not None or high is not None:
            left = "[" if include_low else "("
            bounds = (
                f" in {left}{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            )
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be a finite number{bounds}. Received: {argument}={value!r}",
            )
        )
    return float(as_python_scalar(value))


def validate_seed(owner, value, argument="seed"):
    """An integer seed or None."""
    if value is not None and not is_int(value):
        raise TypeError(
            error(
                owner,
                f"`{argument}` must be an integer or None. Received: {argument}={value!r}",
            )
        )
    return None if value is None else int(as_python_scalar(value))


def validate_choice(owner, argument, value, choices):
    """`value` if it is one of `choices` (compared with `==`, type-strict)."""
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return value
    raise ValueError(
        error(
            owner,
            f"`{argument}` must be one of {tuple(choices)}. Received: {argument}={value!r}",
        )
    )


def validate_axes(owner, argument, value, allow_none=True):
    """An int or a non-empty list/tuple of distinct ints, as a tuple.

    Duplicates (`(1, 1)`) are refused here; aliases of one axis written two
    ways (`(1, -2)` on rank 3) can only be found once the rank is known:
    `resolve_axes` does that.
    """
    if value is None and allow_none:
        return None
    if is_int(value):
        return (int(as_python_scalar(value)),)
    if not isinstance(value, (list, tuple)) or not value or not all(is_int(a) for a in value):
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be an int, list, or tuple of ints. "
                f"Received: {argument}={value!r}",
            )
        )
    axes = tuple(int(as_python_scalar(a)) for a in value)
    if len(set(axes)) != len(axes):
        raise ValueError(
            error(
                owner,
                f"`{argument}` must not repeat an axis. Received: {argument}={value!r}",
            )
        )
    return axes


def resolve_axes(owner, argument, axes, rank, low=1, high=None):
    """`axes` made non-negative for inputs of `rank`, checked to lie in
    `[low, high]` (default: between the batch and the feature axis) and to
    name distinct axes."""
    high = rank - 2 if high is None else high
    resolved = tuple(a + rank if a < 0 else a for a in axes)
    if not all(low <= a <= high for a in resolved):
        raise ValueError(
            error(
                owner,
                f"`{argument}` must name axes between the batch and the "
                f"feature axis of inputs of rank {rank} ({low} to {high}, or "
                f"{low - rank} to {high - rank}). Received: "
                f"{argument}={tuple(axes)}",
            )
        )
    if len(set(resolved)) != len(resolved):
        raise ValueError(
            error(
                owner,
                f"`{argument}` names one axis twice for inputs of rank {rank} "
                f"(resolved to {resolved}). Received: {argument}={tuple(axes)}",
            )
        )
    return resolved


def _is_real_or_bool(dtype):
    dtype = str(dtype)
    return "bool" in dtype or "int" in dtype or "float" in dtype


def check_tensor(owner, argument, value, allow_none=True):
    """Raises a TypeError unless `value` is a tensor or array (or None)."""
    if value is None and allow_none:
        return
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise TypeError(
            error(
                owner,
                f"`{argument}` must be a tensor or array. Received: {argument}={describe(value)}",
            )
        )


def check_mask_dtype(owner, argument, mask):
    """Raises a TypeError unless `mask` holds booleans or numbers."""
    if not _is_real_or_bool(mask.dtype):
        # NumPy text arrays ("<U3") are strings, as TensorFlow names them.
        kind = getattr(mask.dtype, "kind", "")
        dtype = "string" if kind in ("U", "S", "O") else mask.dtype
        raise TypeError(
            error(
                owner,
                f"`{argument}` must be boolean (or 0/1 numbers), True where "
                f"attention is allowed. Received: {argument} with dtype {dtype}",
            )
        )


def check_integer_dtype(owner, argument, value):
    """Raises a ValueError unless `value` (a tensor, an array or a list)
    holds integers: ids and positions, checked before a backend converts
    them (JAX's conversion of a text array fails first)."""
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not hasattr(value, "dtype"):
        return
    kind = getattr(value.dtype, "kind", "")
    dtype = "string" if kind in ("U", "S", "O") else getattr(value.dtype, "name", value.dtype)
    if "int" not in str(dtype):
        raise ValueError(
            error(
                owner,
                f"`{argument}` must be integers. Received: {argument} with dtype {dtype}",
            )
        )


def check_mask(owner, argument, mask, expected, broadcast=False):
    """Checks a mask's dtype and shape against `expected` (None = any).

    With `broadcast=True` a mask of lower rank is right-aligned against
    `expected` and any dimension may be 1 (as `attention_mask` in Keras).
    A Python list is refused with the argument's name (convert it with
    `np.asarray`).
    """
    if mask is None:
        return
    if not hasattr(mask, "dtype") or not hasattr(mask, "shape"):
        raise TypeError(
            error(
                owner,
                f"`{argument}` must be a boolean tensor or array (a list can "
                f"be passed as np.asarray(...)). Received: "
                f"{argument}={describe(mask)}",
            )
        )
    check_mask_dtype(owner, argument, mask)
    shape = tuple(mask.shape)
    if broadcast:
        ok = 2 <= len(shape) <= len(expected)
        aligned = expected[len(expected) - len(shape) :]
    else:
        ok = len(shape) == len(expected)
        aligned = expected
    ok = ok and all(
        got is None or want is None or got == want or (got == 1 and (broadcast or i == 0))
        for i, (got, want) in enumerate(zip(shape, aligned, strict=True))
    )
    if not ok:
        how = " or broadcast to it" if broadcast else ""
        raise ValueError(
            error(
                owner,
                f"`{argument}` must have shape {tuple(expected)}{how} (None = "
                f"any). Received: {argument} with shape {shape}",
            )
        )


def eager_scalar(value):
    """The NumPy value of a concrete 0-d tensor, else `value` unchanged.

    Keras turns NumPy scalars given to a layer into tensors before `call`
    (`np.bool_(True)` arrives as an eager `tf.Tensor` or a JAX array), so a
    flag check that accepts NumPy bools must read those. Symbolic tensors
    (a `tf.function` or `jax.jit` trace, a `KerasTensor`) have no value yet
    and come back unchanged, as does anything that is not 0-d.
    """
    if isinstance(value, (np.ndarray, np.generic)) or tuple(getattr(value, "shape", (0,))) != ():
        return value
    module = type(value).__module__
    if module.startswith("tensorflow"):
        import tensorflow as tf

        if tf.is_symbolic_tensor(value):
            return value
        return value.numpy()
    if module.startswith("jax"):
        import jax

        if isinstance(value, jax.core.Tracer):
            return value
        return np.asarray(value)[()]
    return value


def validate_call_flag(owner, argument, value):
    """A call-time flag (`use_causal_mask`, `return_attention_scores`) as a
    bool: `True`/`False`, NumPy bools and the integers 0 and 1 (Keras' own
    tests pass `use_causal_mask=0`), and concrete 0-d bool or integer tensors
    holding those (Keras' conversion of a NumPy scalar); anything else
    (strings, symbolic tensors) is a TypeError."""
    value_ = as_python_scalar(eager_scalar(value))
    if isinstance(value_, bool):
        return value_
    if is_int(value_) and value_ in (0, 1):
        return bool(value_)
    raise TypeError(
        error(
            owner,
            f"`{argument}` must be True or False. Received: {argument}={value!r}",
        )
    )


def deserialize_layer(owner, argument, config, expected, description):
    """Rebuilds a nested layer from its serialized `config`, checking its class.

    Used by the deserialisers (`from_config`) of layers and models that hold
    a configurable sublayer: the class named in `config` must be a subclass
    of `expected` (a class or tuple of classes), or a TypeError naming
    `owner` and `argument` is raised before the layer is used (built or
    called), whether or not `safe_mode` is on (Keras' deserialiser runs under the caller's
    `safe_mode` scope, which still refuses lambdas). `description` says what
    is expected ("a keras_attention single-head attention layer").
    """
    import keras

    def refuse(received):
        return TypeError(
            error(
                owner,
                f"`{argument}` must be {description} or its serialized config. "
                f"Received: {argument}={received}",
            )
        )

    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise refuse(repr(config))
    try:
        layer = keras.saving.deserialize_keras_object(config)
    except Exception as error_:
        raise refuse(
            f"a config of class {config['class_name']!r} that does not "
            f"deserialize ({type(error_).__name__}: {error_})"
        ) from error_
    if not isinstance(layer, expected):
        raise refuse(f"a config of class {type(layer).__name__}")
    return layer


def validate_tokens(owner, argument, tokens):
    """`tokens` (a list or tuple of strings, or None) as a list of str.

    Widgets label the axes with them; a lone string or a number is refused
    (a string would label one axis character by character).
    """
    if tokens is None:
        return None
    if isinstance(tokens, (list, tuple)) or (isinstance(tokens, np.ndarray) and tokens.ndim == 1):
        tokens = list(tokens)
        if all(isinstance(t, (str, np.str_)) for t in tokens):
            return [str(t) for t in tokens]
    raise TypeError(
        error(
            owner,
            f"`{argument}` must be a list of token strings or None. "
            f"Received: {argument}={tokens!r}",
        )
    )
