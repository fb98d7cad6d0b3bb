"""What changes the logits before the softmax, as data every exact kernel applies.

The attention of today's models is plain softmax attention with the scores
changed (FlexAttention's `score_mod`, arXiv:2412.05496). `ScoreModifier`
holds those changes in one description, applied by each kernel to its own
logits, a whole `(B, H, Tq, Tk)` array or one tile of it, at the tile's
absolute positions:

1. ALiBi (Press et al., 2021): `score - slope[h] * |q_pos - k_pos|`, the
   paper's per-head slopes (`alibi_slopes(num_heads)`) or given ones; under
   a causal mask this is the paper's bias, and equals BLOOM's
   `slope * k_pos` up to a per-row constant (the softmax ignores it);
2. a user `score_mod(score, batch, head, q_idx, k_idx) -> score`, written
   with `keras.ops` on broadcastable index tensors (int32; `q_idx`/`k_idx`
   absolute positions, so a decoding cache sees the same function; the
   same shapes on every kernel, and the result checked: `ops.mods`);
3. the logit soft cap `c * tanh(score / c)` (Gemma 2 and 3, Grok), last, so
   the capped logit is what the softmax sees.

And one change to the softmax itself: learned sinks, one logit per head
counted in every row's denominator with a zero value (GPT-OSS), so a row may
give less than 1 in total to the keys; the weights a kernel returns are the
keys' only, and such a row sums to less than 1. A row with no visible key
keeps zero weights and a zero result.

Kernels call `apply(logits, batch, head, rows, cols)` with index tensors
broadcastable to `logits`, and, in a hand-written backward pass,
`gradient(logits, ..., d_modified)` for the gradient with respect to the
unmodified logits (closed forms for the soft cap and ALiBi; the backend's
autodiff for a `score_mod`).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention import validation
from keras_attention.ops import checks
from keras_attention.ops import mods


def alibi_slopes(num_heads, max_bias=8.0):
    """The ALiBi paper's head slopes, `(num_heads,)` float32 NumPy-free list.

    For `n` a power of two, `2 ** (-max_bias i / n)` for `i = 1 .. n`;
    otherwise the slopes of the largest power of two below `n`, then every
    other slope of twice that (the paper's code). `max_bias` is 8 in the
    paper (KerasHub's `AlibiBias(alibi_bias_max=...)`).
    """
    num_heads = checks.length("alibi_slopes", "num_heads", num_heads)
    if num_heads < 1:
        raise ValueError(f"alibi_slopes: `num_heads` must be >= 1. Received: num_heads={num_heads}")
    if not validation.is_real(max_bias) or not 0 < float(max_bias) < float("inf"):
        raise ValueError(
            f"alibi_slopes: `max_bias` must be a positive number. Received: max_bias={max_bias!r}"
        )
    log_bias = math.log2(float(max_bias))

    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - log_bias)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]


class ScoreModifier:
    """The changes to a call's logits (see the module docstring).

    Args:
        soft_cap: positive float `c`: logits become `c * tanh(logit / c)`.
        alibi_slopes: `(H,)` per-head slopes (list or tensor) of the ALiBi
            bias `-slope * |q_pos - k_pos|`, or None.
        sink_logits: `(H,)` tensor (a learned weight) of per-head sink
            logits counted in the softmax denominator, or None.
        score_mod: `score_mod(score, batch, head, q_idx, k_idx, *weights)
            -> score`, `keras.ops` only, or None.
        score_mod_weights: tensors the `score_mod` reads (a learned table,
            such as T5's relative position bias), passed to it after the
            indices. Kernels that differentiate by hand (the blockwise one)
            return their gradients; a `score_mod` must not read trainable
            weights any other way there.
    """

    def __init__(
        self,
        *,
        soft_cap=None,
        alibi_slopes=None,
        sink_logits=None,
        score_mod=None,
        score_mod_weights=(),
    ):
        owner = "ScoreModifier"
        if soft_cap is not None:
            if isinstance(soft_cap, bool) or not isinstance(soft_cap, (int, float)):
                raise TypeError(
                    f"{owner}: `soft_cap` must be a positive number or None. "
                    f"Received: soft_cap={soft_cap!r}"
                )
            if not soft_cap > 0 or math.isinf(soft_cap):
                raise ValueError(
                    f"{owner}: `soft_cap` must be a positive finite number. "
                    f"Received: soft_cap={soft_cap!r}"
                )
            soft_cap = float(soft_cap)
        if not isinstance(score_mod_weights, (list, tuple)) or (
            score_mod_weights and score_mod is None
        ):
            raise ValueError(
                f"{owner}: `score_mod_weights` are the tensors a `score_mod` reads: a "
                "list or tuple, with a `score_mod`. Received: "
                f"score_mod_weights={score_mod_weights!r}, score_mod={score_mod!r}"
            )
        score_mod = mods.UserMod.wrap(
            score_mod, "score_mod", owner, num_weights=len(score_mod_weights)
        )
        self.soft_cap = soft_cap
        for name, value in (("alibi_slopes", alibi_slopes), ("sink_logits", sink_logits)):
            if value is not None and len(getattr(value, "shape", np.shape(value))) != 1:
                raise ValueError(
                    f"{owner}: `{name}` must be one number per head, shape (H,). "
                    f"Received: {name} with shape {tuple(np.shape(value))}"
                )
        if alibi_slopes is not None:
            alibi_slopes = ops.cast(ops.convert_to_tensor(alibi_slopes), "float32")
        self.alibi_slopes = alibi_slopes
        self.sink_logits = sink_logits
        self.score_mod = score_mod
        self.score_mod_weights = tuple(score_mod_weights)

    @property
    def changes_logits(self):
        """Whether any logit is changed (the sinks change the softmax only)."""
        return (
            self.soft_cap is not None or self.alibi_slopes is not None or self.score_mod is not None
        )

    @property
    def is_empty(self):
        return not self.changes_logits and self.sink_logits is None

    def sinks(self, dtype="float32"):
        """The sink logits as a `(H,)` tensor of `dtype`, or None."""
        if self.sink_logits is None:
            return None
        return ops.cast(_read(self.sink_logits), dtype)

    def without_alibi(self):
        """The same changes but ALiBi (a kernel that applies it itself)."""
        return ScoreModifier(
            soft_cap=self.soft_cap,
            sink_logits=self.sink_logits,
            score_mod=self.score_mod,
            score_mod_weights=self.score_mod_weights,
        )

    def weights(self):
        """The `score_mod`'s weights as tensors (a kernel's explicit inputs)."""
        return tuple(_read(w) for w in self.score_mod_weights)

    # ----------------------------------------------------------- forward
    def _before_cap(self, logits, batch, head, rows, cols, weights=None):
        if self.alibi_slopes is not None:
            distance = ops.cast(ops.abs(rows - cols), logits.dtype)
            slope = ops.cast(ops.take(self.alibi_slopes, head), logits.dtype)
            logits = logits - slope * distance
        if self.score_mod is not None:
            weights = self.score_mod_weights if weights is None else weights
            logits = self.score_mod(logits, batch, head, rows, cols, *weights)
        return logits

    def apply(self, logits, batch, head, rows, cols, weights=None):
        """`logits` changed; the index tensors broadcast against them.
        `weights` replace `score_mod_weights` (a kernel's own inputs)."""
        if not self.changes_logits:
            return logits
        logits = self._before_cap(logits, batch, head, rows, cols, weights)
        if self.soft_cap is not None:
            logits = self.soft_cap * ops.tanh(logits / self.soft_cap)
        return logits

    # ---------------------------------------------------------- backward
    def gradient(self, logits, batch, head, rows, cols, d_modified, weights=None, applied=None):
        """`(d logits, d weights)`: the gradients with respect to the
        unmodified `logits` and the `score_mod`'s weights (a tuple, one per
        weight), given the gradient `d_modified` with respect to
        `apply(logits, ...)`; `applied`, that result when the caller has it
        (the soft cap's derivative is read from it, not recomputed)."""
        weights = self.score_mod_weights if weights is None else tuple(weights)
        if not self.changes_logits:
            return d_modified, ()
        before = logits
        if self.score_mod is not None:
            before, pullback = _vjp(
                lambda s, *w: self._before_cap(s, batch, head, rows, cols, w),
                (logits,) + weights,
            )
        elif self.alibi_slopes is not None and applied is None and self.soft_cap is not None:
            before = self._before_cap(logits, batch, head, rows, cols)  # additive: derivative 1
        if self.soft_cap is not None:
            if applied is not None:  # c tanh(x / c): the derivative is 1 - (applied / c)^2
                capped = applied * (1.0 / self.soft_cap)
            else:
                capped = ops.tanh(before / self.soft_cap)
            d_modified = d_modified * (1.0 - capped * capped)
        if self.score_mod is None:
            return d_modified, ()
        grads = pullback(d_modified)
        return grads[0], tuple(grads[1:])


def _read(value):
    """A tensor holding `value` (a variable is read: TensorFlow's custom
    gradient refuses a function that touches variables, so the kernels take
    their values as inputs)."""
    return ops.copy(ops.convert_to_tensor(value))


def _vjp(function, primals):
    """`(function(*primals), pullback)` with the backend's autodiff; the
    pullback returns one gradient per primal (zeros where none flows)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        out, pull = jax.vjp(function, *primals)
        return out, pull
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            for primal in primals:
                tape.watch(primal)
            out = function(*primals)

        def pullback(g):
            return tuple(
                tape.gradient(
                    out,
                    list(primals),
                    output_gradients=g,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
            )

        return out, pullback
    if backend == "torch":
        import torch

        leaves = [p.detach().requires_grad_(True) for p in primals]
        with torch.enable_grad():
            out = function(*leaves)

        def pullback(g):
            grads = torch.autograd.grad(out, leaves, grad_outputs=g, allow_unused=True)
            return tuple(
                torch.zeros_like(leaf) if grad is None else grad
                for leaf, grad in zip(leaves, grads, strict=True)
            )

        return out.detach(), pullback
    raise NotImplementedError(f"score_mod gradients on the {backend} backend")
