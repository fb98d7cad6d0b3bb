"""Argument checks shared by the public ops: one module, not one copy per op.

Every public function of `keras_attention.ops` checks what it was given
before any backend call, so that a wrong argument gets our ValueError or
TypeError naming the op, the argument and the value (Keras' `Received:`
form, `validation.error`), not a backend's einsum or conversion error.
Only what Python knows is checked: ranks and static sizes (a size unknown
while tracing, None or symbolic, is never compared), dtypes, and the Python
options. The checks cost nothing on the device: they run once per trace.
"""

import numbers

import numpy as np

from keras_attention import validation
from keras_attention.ops.shapes import static_dim


def _error(owner, message):
    return validation.error(owner, message)


def tensor(owner, argument, value, rank=None, allow_none=False, numeric=True):
    """`value` if it is a tensor or array of `rank` (an int, a tuple of the
    ranks allowed, or None for any), holding numbers or booleans.

    A Python list or number is refused (the ops index `.shape`); convert it
    with `np.asarray` first. Returns `value` unchanged (None with
    `allow_none`).
    """
    if value is None and allow_none:
        return None
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise TypeError(
            _error(
                owner,
                f"`{argument}` must be a tensor or array (a list can be passed as "
                f"np.asarray(...)). Received: {argument}={validation.describe(value)}",
            )
        )
    if numeric and not _real_or_bool(value.dtype):
        raise TypeError(
            _error(
                owner,
                f"`{argument}` must hold numbers or booleans. Received: {argument} "
                f"with dtype {_dtype_name(value.dtype)}",
            )
        )
    if rank is not None:
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if len(value.shape) not in ranks:
            wanted = " or ".join(str(r) for r in ranks)
            raise ValueError(
                _error(
                    owner,
                    f"`{argument}` must have rank {wanted}. Received: {argument} with "
                    f"shape {tuple(value.shape)}",
                )
            )
    return value


def mask(owner, argument, value, rank=None):
    """A mask (booleans or 0/1 numbers) of `rank`, or None."""
    if value is None:
        return None
    validation.check_mask(owner, argument, value, (None,) * len(getattr(value, "shape", ())))
    return tensor(owner, argument, value, rank=rank)


def same_size(owner, first, second):
    """Raises unless two static sizes agree: `first`/`second` are
    `(argument, tensor, axis, what)`, e.g. `("key", key, -1, "features")`."""
    (name_a, a, axis_a, what), (name_b, b, axis_b, _) = first, second
    size_a, size_b = static_dim(a.shape[axis_a]), static_dim(b.shape[axis_b])
    if size_a is not None and size_b is not None and size_a != size_b:
        raise ValueError(
            _error(
                owner,
                f"`{name_a}` and `{name_b}` must have the same {what} (axis {axis_a} "
                f"of `{name_a}`, {axis_b} of `{name_b}`). Received: {name_a} with "
                f"shape {tuple(a.shape)}, {name_b} with shape {tuple(b.shape)}",
            )
        )


def broadcastable(owner, arguments, values):
    """Raises unless the static shapes of `values` broadcast together
    (right-aligned, each size equal or 1)."""
    shapes = [tuple(static_dim(d) for d in v.shape) for v in values]
    rank = max((len(s) for s in shapes), default=0)
    for axis in range(1, rank + 1):
        sizes = {s[-axis] for s in shapes if len(s) >= axis and s[-axis] not in (None, 1)}
        if len(sizes) > 1:
            described = ", ".join(
                f"{name} with shape {tuple(v.shape)}"
                for name, v in zip(arguments, values, strict=True)
            )
            raise ValueError(
                _error(owner, f"the masks must broadcast together. Received: {described}")
            )


def flag(owner, argument, value):
    """A Python bool option (NumPy bools and 0/1 as in a layer's call flags)."""
    return validation.validate_call_flag(owner, argument, value)


def choice(owner, argument, value, choices):
    """`value` if it is one of `choices` (type-strict: `"ZIGZAG"` is not
    `"zigzag"`, `2` is not a name)."""
    return validation.validate_choice(owner, argument, value, choices)


def positive_int(owner, argument, value, allow_none=False):
    return validation.validate_positive_int(owner, argument, value, allow_none=allow_none)


def non_negative_int(owner, argument, value):
    return validation.validate_non_negative_int(owner, argument, value)


def real(owner, argument, value, low=None, include_low=True, allow_none=False):
    """A finite Python or NumPy number (optionally `>= low`), as a float."""
    if value is None and allow_none:
        return None
    return validation.validate_real(owner, argument, value, low=low, include_low=include_low)


def scale(owner, value):
    """A logit multiplier: None, a finite number, or a 0-d tensor (a layer's
    learned scale) whose value is the backend's business."""
    if value is None:
        return None
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        if len(value.shape) != 0 or not _real_or_bool(value.dtype):
            raise ValueError(
                _error(
                    owner,
                    "`scale` must be None, a number or a scalar tensor. Received: "
                    f"scale={validation.describe(value)}",
                )
            )
        return value
    return real(owner, "scale", value)


def length(owner, argument, value):
    """A sequence length: an int >= 0 (NumPy's too), an integer scalar tensor
    or a symbolic dimension (a dynamic size while tracing, which comes back
    unchanged)."""
    wrong_type = False
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        if len(value.shape) == 0 and "int" in _dtype_name(value.dtype):
            return value
    elif validation.is_int(value):
        if validation.as_python_scalar(value) >= 0:
            return int(validation.as_python_scalar(value))
    elif value is None or isinstance(value, (str, bytes, bool, np.bool_, numbers.Number)):
        wrong_type = True
    else:
        return value  # a JAX shape-polymorphism dimension (`b`, `2 * b`)
    raise (TypeError if wrong_type else ValueError)(
        _error(
            owner,
            f"`{argument}` must be a non-negative integer or an integer scalar "
            f"tensor. Received: {argument}={validation.describe(value)}",
        )
    )


def axis(owner, argument, value, rank):
    """An axis of a tensor of `rank`, as a non-negative int."""
    if not validation.is_int(value):
        raise TypeError(
            _error(owner, f"`{argument}` must be an integer. Received: {argument}={value!r}")
        )
    value = int(validation.as_python_scalar(value))
    if not -rank <= value < rank:
        raise ValueError(
            _error(
                owner,
                f"`{argument}` must name an axis of a rank-{rank} tensor ({-rank} to "
                f"{rank - 1}). Received: {argument}={value}",
            )
        )
    return value % rank


def _dtype_name(dtype):
    kind = getattr(dtype, "kind", "")
    if kind in ("U", "S", "O"):
        return "string"
    return str(getattr(dtype, "name", dtype))


def _real_or_bool(dtype):
    name = _dtype_name(dtype)
    return "bool" in name or "int" in name or "float" in name
