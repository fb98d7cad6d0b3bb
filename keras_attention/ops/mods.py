"""The contract between the kernels and a user's `score_mod` / `mask_mod`.

Every kernel calls a user function with the same index tensors, int32 and
broadcastable to the `(B, H, Tq, Tk)` logits of the call (or of the tile
being computed):

| argument | shape | holds |
| --- | --- | --- |
| `batch` | `(B, 1, 1, 1)` | the example's index in the batch |
| `head` | `(1, H, 1, 1)` | the query head's index |
| `q_idx` | `(1, 1, Tq, 1)` | the query's absolute position |
| `k_idx` | `(1, 1, 1, Tk)` | the key's absolute position |

`Tq` and `Tk` are the tile's sizes on a tiled kernel. The positions are
always those of real queries and keys: a tiled kernel whose last tile runs
past the sequence repeats the last position there, so a lookup
`ops.take(data, q_idx)` never reads out of range. A `score_mod` returns the
changed score, of the score's shape (or one that broadcasts to it), a
floating dtype; a `mask_mod` returns booleans (True: the pair may attend)
broadcastable to `(B, H, Tq, Tk)`. Each result is checked once per trace
(the checks read static shapes only), and a wrong one gets an error naming
the function, the shape or dtype expected and what it returned, rather than
a backend's broadcast error from inside a kernel.

`UserMod` wraps the function with that check, and with the one piece of
layout that differs between kernels: the blockwise kernel keeps grouped
heads as two axes, `(B, Hkv, G, Tq, Tk)`, and is given back its own layout.
"""

import inspect

import keras
from keras import ops

from keras_attention import validation

MASK_SIGNATURE = "(batch, head, q_idx, k_idx) -> bool"
SCORE_SIGNATURE = "(score, batch, head, q_idx, k_idx) -> score"


def _name(function):
    return getattr(function, "__name__", None) or type(function).__name__


def check_signature(owner, argument, function, num_args, signature):
    """Refuses a callable that cannot take `num_args` positional arguments,
    before any call (a backend's bare `TypeError ... takes 2 positional
    arguments but 5 were given` names neither the argument nor the form)."""
    if function is None:
        return None
    if not callable(function):
        raise TypeError(
            validation.error(
                owner,
                f"`{argument}` must be a callable `{signature}` or None. "
                f"Received: {argument}={function!r}",
            )
        )
    try:
        parameters = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature
        return function
    try:
        parameters.bind(*range(num_args))
    except TypeError:
        raise TypeError(
            validation.error(
                owner,
                f"`{argument}` is called as `{signature}` with {num_args} positional "
                f"arguments. Received: {argument}={_name(function)}{parameters}",
            )
        ) from None
    return function


class UserMod:
    """A user's `mask_mod` or `score_mod`, called the one way every kernel
    calls it (see the module docstring), its result checked.

    Args:
        function: the user's callable.
        kind: `"mask_mod"` or `"score_mod"`.
        owner: what the user called (named first in errors).
        num_weights: tensors a `score_mod` reads after the indices.
    """

    def __init__(self, function, kind, owner, num_weights=0):
        if isinstance(function, UserMod):
            function = function.function
        signature = MASK_SIGNATURE if kind == "mask_mod" else SCORE_SIGNATURE
        num_args = (4 if kind == "mask_mod" else 5) + num_weights
        self.function = check_signature(owner, kind, function, num_args, signature)
        self.kind = kind
        self.owner = owner

    @classmethod
    def wrap(cls, function, kind, owner, num_weights=0):
        """`function` as a `UserMod` (kept when it is one already), or None."""
        if function is None or isinstance(function, UserMod):
            return function
        return cls(function, kind, owner, num_weights)

    def __repr__(self):
        return f"{self.kind}={self.function!r}"

    def _error(self, error_type, message):
        return error_type(
            validation.error(self.owner, f"`{self.kind}` {_name(self.function)} {message}")
        )

    def __call__(self, *args):
        """`mask_mod(batch, head, q_idx, k_idx)` or
        `score_mod(score, batch, head, q_idx, k_idx, *weights)`, with the
        indices in either kernel layout."""
        if self.kind == "mask_mod":
            score, (batch, head, rows, cols), weights = None, args[:4], ()
        else:
            score, (batch, head, rows, cols), weights = args[0], args[1:5], args[5:]
        grouped = len(rows.shape) == 5  # (B, Hkv, G, Tq, Tk): the blockwise layout
        kv_groups = tuple(head.shape[1:3]) if grouped else None
        if grouped:
            batch = None if batch is None else ops.reshape(batch, (-1, 1, 1, 1))
            head = ops.reshape(head, (1, -1, 1, 1))
            rows = ops.reshape(rows, (1, 1, -1, 1))
            cols = ops.reshape(cols, (1, 1, 1, -1))
            if score is not None:
                shape = tuple(score.shape)
                score = ops.reshape(score, (-1, shape[1] * shape[2]) + shape[3:])
        expected = _broadcast_shape([t.shape for t in (batch, head, rows, cols) if t is not None])
        if score is None:
            result = ops.convert_to_tensor(self.function(batch, head, rows, cols))
            dtype = _dtype(result)
            if dtype != "bool":
                raise self._error(
                    TypeError,
                    f"must return booleans (True: the pair may attend). Received: "
                    f"values of dtype {dtype}. An additive mask (0 to keep, -inf to "
                    "drop, Hugging Face's and Keras' bias convention) is a change of "
                    "the scores: pass it as `score_mod` (score + bias) instead.",
                )
        else:
            expected = tuple(score.shape)
            result = ops.convert_to_tensor(self.function(score, batch, head, rows, cols, *weights))
            dtype = _dtype(result)
            if "float" not in dtype:
                raise self._error(
                    TypeError,
                    f"must return the changed scores, floating point like the score "
                    f"({_dtype(score)}). Received: values of dtype {dtype}",
                )
        self._check_shape(result, expected)
        if score is not None:
            result = ops.broadcast_to(ops.cast(result, score.dtype), ops.shape(score))
        if grouped:
            result = _regroup(result, kv_groups)
        return result

    def _check_shape(self, result, expected):
        shape = tuple(result.shape)
        fits = len(shape) <= len(expected) and all(
            got is None or want is None or got in (1, want)
            for got, want in zip(reversed(shape), reversed(expected), strict=False)
        )
        if not fits:
            what = (
                "the score's shape"
                if self.kind == "score_mod"
                else "a shape broadcastable to (B, H, Tq, Tk)"
            )
            raise self._error(
                ValueError,
                f"must return {what}, here {_shape_text(expected)} (batch, head, "
                f"q_idx and k_idx broadcast together). Received: a result of shape "
                f"{_shape_text(shape)}",
            )


def _dtype(x):
    return str(getattr(x.dtype, "name", x.dtype))


def _shape_text(shape):
    return str(tuple("?" if d is None else d for d in shape)).replace("'", "")


def _broadcast_shape(shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        known = [d for d in dims if d is not None and d != 1]
        out.append(known[0] if known else (None if None in dims else 1))
    return tuple(out)


def _regroup(result, kv_groups):
    """A `(B|1, H|1, Tq|1, Tk|1)` result in the blockwise kernel's grouped
    `(B|1, Hkv|1, G|1, Tq|1, Tk|1)` layout."""
    while len(result.shape) < 4:
        result = ops.expand_dims(result, 0)
    shape = tuple(result.shape)
    heads = kv_groups if shape[1] != 1 else (1, 1)
    batch = -1 if shape[0] != 1 else 1
    rest = tuple(d if d is not None else ops.shape(result)[i + 2] for i, d in enumerate(shape[2:]))
    return ops.reshape(result, (batch,) + heads + rest)


@keras.saving.register_keras_serializable(package="keras_attention")
class MaskModCombination:
    """`mask_mod`s joined by `and` or `or`: what `and_masks` / `or_masks`
    return. A `mask_mod` itself, and saved with a layer's config (its parts
    must be registered functions, as any `mask_mod`)."""

    def __init__(self, mask_mods, combine):
        self.mask_mods = list(mask_mods)
        self.combine = combine

    @property
    def __name__(self):
        return f"{self.combine}_masks"

    def __call__(self, batch, head, q_idx, k_idx):
        join = ops.logical_and if self.combine == "and" else ops.logical_or
        result = None
        for mask_mod in self.mask_mods:
            part = UserMod(mask_mod, "mask_mod", self.__name__)(batch, head, q_idx, k_idx)
            result = part if result is None else join(result, part)
        return result

    def get_config(self):
        return {
            "mask_mods": [keras.saving.serialize_keras_object(m) for m in self.mask_mods],
            "combine": self.combine,
        }

    @classmethod
    def from_config(cls, config):
        mask_mods = [keras.saving.deserialize_keras_object(m) for m in config["mask_mods"]]
        return cls(mask_mods, config["combine"])


def _combination(owner, combine, mask_mods):
    if not mask_mods:
        raise ValueError(
            validation.error(owner, "needs at least one `mask_mod`. Received: mask_mods=()")
        )
    for index, mask_mod in enumerate(mask_mods):
        check_signature(owner, f"mask_mods[{index}]", mask_mod, 4, MASK_SIGNATURE)
    return MaskModCombination(mask_mods, combine)


def and_masks(*mask_mods):
    """A `mask_mod` that allows a pair where every one of `mask_mods` does
    (FlexAttention's `and_masks`, so attention-gym recipes port).

    >>> import keras_attention as ka
    >>> causal = lambda b, h, q, k: q >= k
    >>> window = lambda b, h, q, k: q - k < 4
    >>> layer = ka.MultiHeadAttention(2, 8, mask_mod=ka.ops.and_masks(causal, window))
    """
    return _combination("and_masks", "and", mask_mods)


def or_masks(*mask_mods):
    """A `mask_mod` that allows a pair where any of `mask_mods` does
    (FlexAttention's `or_masks`)."""
    return _combination("or_masks", "or", mask_mods)
