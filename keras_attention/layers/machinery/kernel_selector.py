"""Which exact-attention kernel a `MultiHeadAttention` call runs: one function.

`select_kernel(request)` maps what a call is (the layer's configuration, the
static shapes, what the caller asked for, the backend and trace mode, the
memory budget) to a `Kernel`. The layer builds the `KernelRequest`, calls it
once and dispatches on the answer; nothing else chooses. The rules, first
match wins (a test checks this table against the code):

| rule | when | kernel |
| --- | --- | --- |
| ring | `sequence_parallel` is set | RING |
| weights | the weights must be stored (returned or captured) | DENSE |
| forced-materialised | `flash_attention=False` or `memory_efficient=False` | MATERIALISED |
| forced-flash-fused | `flash_attention=True`, a fused kernel here, equal head dims, no score modifier, no dropout | FUSED |
| forced-flash-blockwise | `flash_attention=True`, static lengths | BLOCKWISE |
| forced-flash-dynamic | `flash_attention=True` | MATERIALISED |
| fused | a fused kernel here, flash not disabled globally, equal head dims, no score modifier, no dropout | FUSED |
| dynamic | a sequence length is unknown (see below) | MATERIALISED |
| forced-blockwise | `memory_efficient=True` | BLOCKWISE |
| single-query | one query row (a decoding step) | MATERIALISED |
| length-threshold | `memory_efficient_threshold` set: key length at or above it | BLOCKWISE |
| faster-blockwise | key length at or above the backend's measured crossover (JAX on CPU: 1024; TensorFlow on CPU, causal calls: 1024) | BLOCKWISE |
| unknown-batch | the batch is unknown and keys are `UNKNOWN_BATCH_KEY_LENGTH` or longer | BLOCKWISE |
| over-budget | the dense working set exceeds the memory budget (unknown batch: one example) | BLOCKWISE |
| fits | otherwise | MATERIALISED |

A score modifier (`ops.score_modifier.ScoreModifier`: soft cap, ALiBi,
learned sinks, a `score_mod`) rules out the fused and composite kernels
(Keras' `dot_product_attention` cannot change the logits): the fused rows do
not hold, and MATERIALISED is DENSE (SHIFTED under TensorFlow's XLA).

Attention dropout in training (`dropout`) rules out the kernels that cannot
drop weights: the fused rows do not hold, and MATERIALISED is DENSE (Keras'
`Dropout` on its weights), under XLA too. The blockwise kernel drops them
itself (keep bits hashed per tile and recomputed by its backward,
`ops.dropout`), so every row that picks BLOCKWISE without dropout picks it
with dropout: training with dropout stays linear in memory at length.

MATERIALISED is COMPOSITE (`keras.ops.dot_product_attention` without a fused
kernel, what Keras' own layer runs), except: under TensorFlow's XLA it is
SHIFTED (ours, `ops.dense_attention.shifted_attention`: the softmax's
normalisation moved after the weighted sum, so the `(B, H, Tq, Tk)` tensors
take one exp pass forward and one product backward; XLA:CPU's softmax
fusions were the slow part of materialised attention there), and where the
value and key head sizes differ (JAX's composite kernel needs them equal) it
is DENSE.

The crossover is where the blockwise kernel is faster than the materialised
one on the backend and device at hand, measured (benchmarks/RESULTS.md, #26):
on JAX's CPU backend, forward + backward of 8 heads x 64, the blockwise kernel
took 0.67x Keras' time at 1024 and 0.39x at 2048, while the materialised
kernel ran at Keras' speed (XLA:CPU forms and walks the `(B, H, L, L)`
tensors at a small fraction of its matmul speed). In TensorFlow graph mode on
a CPU the materialised kernel runs at the matmul's pace, so without a causal
mask there is none; with one the blockwise kernel skips the tiles above the
diagonal and a training step takes 0.88x the materialised kernel's time at
1024 and 0.66x at 4096 (#37), so causal calls cross at 1024. Elsewhere
(TensorFlow's XLA, accelerators) there is none, and only memory sends a call
blockwise.

The dense working set is what forward + backward keep of the
`(B, H, Tq, Tk)` logits: `DENSE_WORKING_SET_TENSORS` float32 tensors of that
shape (logits, weights, their gradients), `DENSE_WORKING_SET_TENSORS_XLA`
when TensorFlow compiles with XLA (whose CPU buffers for the materialised
kernel are larger: Keras' layer at L = 8192 did not fit 16 GiB there).

Unknown sizes: a size is unknown when it is not a Python integer: `None` (a
TensorFlow graph traced for any batch, a `KerasTensor`) or a JAX symbolic
dimension (Keras traces the `call` of a layer that calls ours with
`jax.export`'s shape polymorphism, where comparing `b * 160000` with a
budget cannot be decided in Python). `KernelRequest` turns every unknown
size into None (`ops.shapes.static_dim`), so no rule ever compares one: an
unknown length is the `dynamic` row; with the batch unknown, one example's
working set is counted against the budget and keys of
`UNKNOWN_BATCH_KEY_LENGTH` or more go blockwise (`unknown-batch`), since one
example's working set cannot bound a whole batch's.
"""  # noqa: E501  (table rows: tests match them with docs/guides/long-sequences.md)

import dataclasses
import enum
import math
import numbers

import keras
import numpy as np

from keras_attention import validation
from keras_attention.layers.machinery import memory_budget
from keras_attention.ops.shapes import static_dim
from keras_attention.ops.shapes import static_shape
from keras_attention.ops.xla import tensorflow_xla_trace

# float32 (B, H, Tq, Tk) tensors alive at once in a materialised forward +
# backward (measured: 7.3 GiB peak at L = 8192, 8 heads, where one such
# tensor is 2 GiB; see benchmarks/RESULTS.md).
DENSE_WORKING_SET_TENSORS = 4
# Under TensorFlow XLA: Keras' layer at L = 8192, 8 heads (2 GiB per tensor)
# was killed at a 16 GiB cap (benchmarks/RESULTS.md), so more than 8.
DENSE_WORKING_SET_TENSORS_XLA = 8
# With the batch unknown, keys this long always go blockwise (the former
# fixed threshold): one example's working set cannot bound a whole batch's.
UNKNOWN_BATCH_KEY_LENGTH = 8192
# Key length from which the blockwise kernel beats the materialised one on
# JAX's CPU backend (see the module docstring).
JAX_CPU_BLOCKWISE_LENGTH = 1024
# Key length from which TensorFlow's blockwise kernel beats the materialised
# (composite) one on a CPU for causal calls, graph mode: a training step of 8
# heads of 64 (4 key/value heads), blockwise / materialised 1.07 at 512,
# 0.88 at 1024, 0.73 at 2048, 0.66 at 4096 (without the causal mask 1.07-1.10
# at every length, so never), measured 2026-12-05 on the 2-core CPU.
TF_CPU_CAUSAL_BLOCKWISE_LENGTH = 1024


class Kernel(enum.Enum):
    """The exact-attention kernels of `MultiHeadAttention`."""

    RING = "ring"  # ops.ring_attention over a device-mesh axis (JAX)
    FUSED = "fused"  # the backend's fused kernel (flash attention)
    BLOCKWISE = "blockwise"  # ops.memory_efficient_attention, linear memory
    COMPOSITE = "composite"  # keras.ops.dot_product_attention, materialised
    DENSE = "dense"  # ops.dense_attention: materialised, returns the weights
    # ops.dense_attention.shifted_attention: materialised, normalised last, no weights
    SHIFTED = "shifted"


@dataclasses.dataclass(frozen=True)
class KernelRequest:
    """Everything the choice depends on (see the module docstring)."""

    # The layer's configuration.
    sequence_parallel: bool = False
    flash_attention: bool | None = None
    memory_efficient: object = "auto"
    memory_efficient_threshold: int | None = None
    equal_head_dims: bool = True
    # Static shapes (None: unknown until run time).
    batch_size: int | None = None
    num_heads: int = 1
    query_length: int | None = None
    key_length: int | None = None
    # What the call needs: the weights returned or captured; dropout acting
    # on them (training with `dropout > 0`).
    weights_needed: bool = False
    dropout: bool = False
    # Backend and trace mode.
    fused_available: bool = False
    flash_enabled: bool | None = None
    xla: bool = False
    # Bytes the dense working set may take (None: no limit).
    memory_budget: int | None = None
    # Key length from which the blockwise kernel is the faster one here
    # (None: it never is; `blockwise_crossover()` reads it for the backend).
    blockwise_faster_from: int | None = None
    # Whether the call changes its logits or softmax (`ScoreModifier`):
    # Keras' `dot_product_attention` cannot, so never FUSED or COMPOSITE.
    scores_modified: bool = False

    def __post_init__(self):
        # Sizes Python cannot compare (None, JAX symbolic dimensions) are
        # unknown: None. See "Unknown sizes" in the module docstring.
        for name in ("batch_size", "query_length", "key_length"):
            object.__setattr__(self, name, static_dim(getattr(self, name)))

    @property
    def static_lengths(self):
        return self.query_length is not None and self.key_length is not None

    def dense_working_set(self):
        """Bytes of the materialised kernel's logits-shaped tensors."""
        batch = self.batch_size if self.batch_size is not None else 1
        tensors = DENSE_WORKING_SET_TENSORS_XLA if self.xla else DENSE_WORKING_SET_TENSORS
        return tensors * 4 * batch * self.num_heads * self.query_length * self.key_length


def _materialised(request):
    if request.weights_needed or request.dropout:
        return Kernel.DENSE
    if request.xla:
        return Kernel.SHIFTED
    if not request.equal_head_dims or request.scores_modified:
        return Kernel.DENSE
    return Kernel.COMPOSITE


def decide(request):
    """`(rule, kernel)`: the first rule of the table that holds."""
    r = request
    fused = r.fused_available and r.equal_head_dims and not (r.scores_modified or r.dropout)
    if r.sequence_parallel:
        return "ring", Kernel.RING
    if r.weights_needed:
        return "weights", Kernel.DENSE
    if r.flash_attention is False or r.memory_efficient is False:
        return "forced-materialised", _materialised(r)
    if r.flash_attention is True:
        if fused:
            return "forced-flash-fused", Kernel.FUSED
        if r.static_lengths:
            return "forced-flash-blockwise", Kernel.BLOCKWISE
        return "forced-flash-dynamic", _materialised(r)
    if fused and r.flash_enabled is not False:
        return "fused", Kernel.FUSED
    if not r.static_lengths:
        return "dynamic", _materialised(r)
    if r.memory_efficient is True:
        return "forced-blockwise", Kernel.BLOCKWISE
    if r.query_length <= 1:
        return "single-query", _materialised(r)
    if r.memory_efficient_threshold is not None:
        if r.key_length >= r.memory_efficient_threshold:
            return "length-threshold", Kernel.BLOCKWISE
        return "fits", _materialised(r)
    if r.blockwise_faster_from is not None and r.key_length >= r.blockwise_faster_from:
        return "faster-blockwise", Kernel.BLOCKWISE
    if r.batch_size is None and r.key_length >= UNKNOWN_BATCH_KEY_LENGTH:
        return "unknown-batch", Kernel.BLOCKWISE
    if r.memory_budget is not None and r.dense_working_set() > r.memory_budget:
        return "over-budget", Kernel.BLOCKWISE
    return "fits", _materialised(r)


def blockwise_crossover(causal=False):
    """The key length from which the blockwise kernel is faster than the
    materialised one on the current backend and default device (None: never).

    `causal`: the call's mask is causal, so the blockwise kernel skips the
    tiles above the diagonal (about half) and wins earlier."""
    import keras

    if keras.backend.backend() == "tensorflow":
        if not causal:
            return None
        import tensorflow as tf

        return None if tf.config.list_logical_devices("GPU") else TF_CPU_CAUSAL_BLOCKWISE_LENGTH
    if keras.backend.backend() != "jax":
        return None
    import jax

    return JAX_CPU_BLOCKWISE_LENGTH if jax.default_backend() == "cpu" else None


def select_kernel(request):
    """The `Kernel` for `request` (a `KernelRequest`)."""
    return decide(request)[1]


def fused_kernel_available():
    """Whether `keras.ops.dot_product_attention` has a fused kernel here."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() in ("gpu", "tpu")
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    return False


def kernel_for(
    layer,
    query_shape,
    key_shape=None,
    *,
    training=False,
    return_attention_scores=False,
    use_causal_mask=False,
):
    """`MultiHeadAttention.kernel_for` of `layer` (its docstring)."""
    owner = f"{type(layer).__name__}.kernel_for (layer '{layer.name}')"
    query_shape = _shape_argument(owner, "query_shape", query_shape)
    key_shape = query_shape if key_shape is None else _shape_argument(owner, "key_shape", key_shape)
    if len(key_shape) != len(query_shape):
        raise ValueError(
            validation.error(
                owner,
                "`query_shape` and `key_shape` must have the same rank, as in a call. "
                f"Received: query_shape={query_shape}, key_shape={key_shape}",
            )
        )
    if training is not None:
        training = validation.validate_call_flag(owner, "training", training)
    return_attention_scores = validation.validate_call_flag(
        owner, "return_attention_scores", return_attention_scores
    )
    use_causal_mask = validation.validate_call_flag(owner, "use_causal_mask", use_causal_mask)
    layout = layer._layout(len(query_shape))

    def length(shape):
        dims = [shape[a] for a in layout.attention_axes]
        return None if None in dims else math.prod(dims)

    batch_dims = [query_shape[0]] + [query_shape[a] for a in layout.batch_axes]
    batch = None if None in batch_dims else math.prod(batch_dims)
    shapes = (batch, length(query_shape)), (batch, length(key_shape))
    return select_kernel(
        request_for(
            layer,
            *shapes,
            layer._weights_needed(training, return_attention_scores),
            causal=use_causal_mask,
            dropout=layer._dropout_callable(training) is not None,
        )
    )


def _shape_argument(owner, argument, shape):
    """`shape` (a tuple, a `TensorShape` or a tensor's) as a tuple of ints or
    None, of rank >= 3 as a call needs; our error naming `argument` else."""
    shape = shape.shape if hasattr(shape, "shape") and hasattr(shape, "dtype") else shape
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__"):
        raise TypeError(
            validation.error(
                owner,
                f"`{argument}` must be a shape (a tuple of dimensions). "
                f"Received: {argument}={shape!r}",
            )
        )
    raw = tuple(shape)
    # None and symbolic sizes (a JAX shape polymorphism dimension) are unknown;
    # a bool, a float, a string or a negative number is no size at all.
    wrong = [
        d
        for d in raw
        if isinstance(d, (bool, np.bool_, str, bytes))
        or (isinstance(d, numbers.Number) and not validation.is_int(d))
        or (validation.is_int(d) and d < 0)
    ]
    dims = static_shape(raw)
    if wrong:
        raise ValueError(
            validation.error(
                owner,
                f"`{argument}` must hold non-negative integers (or None where "
                f"unknown). Received: {argument}={tuple(shape)!r}",
            )
        )
    if len(dims) < 3:
        raise ValueError(
            validation.error(
                owner,
                f"`{argument}` must have rank >= 3 (batch, time..., features), "
                f"as a call's inputs. Received: {argument}={dims}",
            )
        )
    return tuple(None if d is None else int(d) for d in dims)


def request_for(layer, query, key, weights_needed, causal=False, dropout=False):
    """The `KernelRequest` of a call (see `kernel_selector`); `query` and
    `key` are the projected heads or their `(batch, length)` shapes;
    `causal` whether the call's mask is causal; `dropout` whether
    attention dropout acts (training)."""
    # Sizes as they are: `KernelRequest` makes the unknown ones None.
    query = tuple(query.shape) if hasattr(query, "shape") else query
    key = tuple(key.shape) if hasattr(key, "shape") else key
    budget = layer.memory_budget
    if budget is None and layer.memory_efficient == "auto":
        budget = memory_budget.attention_memory_budget()
    return KernelRequest(
        sequence_parallel=layer.sequence_parallel is not None,
        flash_attention=layer.flash_attention,
        memory_efficient=layer.memory_efficient,
        memory_efficient_threshold=layer.memory_efficient_threshold,
        equal_head_dims=layer._value_dim == layer._key_dim,
        batch_size=query[0],
        num_heads=layer._num_heads,
        query_length=query[1],
        key_length=key[1],
        weights_needed=weights_needed,
        dropout=dropout,
        fused_available=fused_kernel_available(),
        flash_enabled=keras.config.is_flash_attention_enabled(),
        xla=tensorflow_xla_trace(),
        memory_budget=budget,
        blockwise_faster_from=(
            blockwise_crossover(causal)
            if layer.memory_efficient == "auto" and not tensorflow_xla_trace()
            else None
        ),
        scores_modified=layer._modifies_scores,
    )
