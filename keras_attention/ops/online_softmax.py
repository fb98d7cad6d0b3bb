"""The online softmax: one engine for every chunked exact kernel.

Softmax attention over keys that arrive in blocks (Milakov & Gimelshein
2018, as FlashAttention, Dao et al. 2022): each query row keeps a running
maximum `m`, a running sum `l` of `exp(logit - m)` and a running weighted
sum `acc`; a new block rescales them by `exp(m_old - m_new)`. At the end,
`acc / l` is the output and `m + log(l)` the row's log-sum-exp, from which a
recomputing backward pass rebuilds each block's probabilities.

Used by the blockwise exact kernel (`memory_efficient.py`), the block-sparse
kernel (`block_sparse.py`) and ring attention (`ring.py`); the
masked softmax of the materialised kernels is here too, so there is one
definition of "a masked logit" and of "a row with no key".

Conventions, everywhere:
- logits are float32; a masked logit is `-inf` inside the engine (exactly
  zero probability in every block and in the backward), and the finite
  `MASKED_LOGIT` in the one-shot masked softmax (where a fully masked row
  would otherwise be `exp(-inf + inf)`);
- a row with no visible key has output 0, log-sum-exp `NO_KEY_LSE` (so its
  recomputed probabilities `exp(logit - lse)` are 0) and zero gradients;
- a NaN logit (a NaN key the row may see) keeps the row NaN: a diverging
  model stays visible.
"""

import keras
from keras import ops

from keras_attention.ops import checks

# Running maximum before any key is seen: finite, so that the correction
# `exp(m_old - m_new)` is never `exp(-inf + inf)`, and below every real logit.
INITIAL_MAX = -1e30
# Log-sum-exp stored for a row with no visible key: `exp(logit - lse)` is 0
# for every finite logit, and finite through the backward's matmuls.
NO_KEY_LSE = 1e30
# Masked logit of the one-shot softmax: exp() of it minus any row max is 0.
MASKED_LOGIT = -1e30


def row_max(x, axis=-1, keepdims=False):
    """`ops.max` that accepts empty tensors (batch 0, length 0).

    TensorFlow's eager `max` asserts on an empty tensor even when only the
    other axes are empty; with `initial=-inf` the reduction is defined for
    every shape, equal to the max otherwise, and still propagates NaN.
    """
    return ops.max(x, axis=axis, keepdims=keepdims, initial=float("-inf"))


def mask_logits(logits, allowed):
    """`logits` with `-inf` where `allowed` is False (`None`: nothing masked).

    A `where`, so a NaN logit behind the mask is dropped too.
    """
    if allowed is None:
        return logits
    return ops.where(allowed, logits, float("-inf"))


def initial_state(row_shape, value_dim):
    """`(running_max, running_sum, acc)` for rows of `row_shape`, float32."""
    return (
        ops.full(row_shape, INITIAL_MAX, dtype="float32"),
        ops.zeros(row_shape, dtype="float32"),
        ops.zeros(tuple(row_shape) + (value_dim,), dtype="float32"),
    )


def update(state, logits, weighted_sum):
    """Folds one block of keys into the running state.

    Args:
        state: `(running_max, running_sum, acc)`, shaped `rows`, `rows` and
            `rows + (Dv,)`.
        logits: `rows + (keys,)`, float32, masked with `mask_logits`.
        weighted_sum: `probs -> rows + (Dv,)`, the block's probabilities
            times its values (the layout of the matmul is the caller's).

    Returns:
        The new state.
    """
    running_max, running_sum, acc = state
    # The shift cancels in the output: no gradient flows through it (ring
    # attention differentiates this function; the other kernels recompute).
    new_max = ops.stop_gradient(ops.maximum(running_max, row_max(logits, axis=-1)))
    probs = ops.exp(logits - ops.expand_dims(new_max, -1))
    correction = ops.exp(running_max - new_max)
    running_sum = running_sum * correction + ops.sum(probs, axis=-1)
    acc = acc * ops.expand_dims(correction, -1) + weighted_sum(probs)
    return new_max, running_sum, acc


# A row may skip the running maximum when the bound of its logits is at most
# this: with `|logit| <= bound`, `exp(logit - bound) >= exp(-2 * bound)`, so
# the row's largest term stays a normal float32 (>= 1e-26) and nothing that
# matters underflows.
FIXED_SHIFT_MAX = 30.0

# A soft cap `c` bounds every logit to [-c, c] whatever the inputs, so a capped
# row may skip the running maximum with no shift at all: its terms lie in
# [exp(-c), exp(c)], normal float32 numbers for c <= 60 (>= 8.7e-27), and a
# row's sum stays finite below 3e12 keys (exp(60) = 1.1e26).
SOFT_CAP_FIXED_MAX = 2 * FIXED_SHIFT_MAX


def logit_bound(queries, keys, query_axis=-2, key_axis=-2):
    """Per query row, `|q| * max_j |k_j|` >= every `|q . k_j|` (Cauchy-Schwarz).

    `queries` `(..., rows, D)` (already scaled), `keys` `(..., keys, D)` with
    the same leading axes (broadcastable). The bound is a valid fixed shift
    for `update_fixed_shift` when it is at most `FIXED_SHIFT_MAX`; a NaN or
    infinite input makes it NaN/inf, which fails that test.
    """
    query_norm = ops.sqrt(ops.sum(ops.square(queries), axis=-1))
    key_norm = ops.max(ops.sqrt(ops.sum(ops.square(keys), axis=-1)), axis=key_axis, keepdims=True)
    return query_norm * key_norm


def fixed_shift_state(shift, value_dim):
    """The initial state of `update_fixed_shift` for rows shifted by `shift`."""
    return (
        ops.cast(shift, "float32"),
        ops.zeros(ops.shape(shift), dtype="float32"),
        ops.zeros(tuple(ops.shape(shift)) + (value_dim,), dtype="float32"),
    )


def update_fixed_shift(state, shifted_logits, weighted_sum):
    """`update` for rows whose shift is fixed in advance (`logit_bound`).

    `shifted_logits` are `logits - shift` (masked with `mask_logits`), formed
    by the caller's matmul (`append_column`); no running maximum, no
    rescaling: two elementwise passes over the block (exp, sum) instead of
    four. `finish` gives the same output and log-sum-exp as `update` would.
    """
    shift, running_sum, acc = state
    probs = ops.exp(shifted_logits)
    return shift, running_sum + ops.sum(probs, axis=-1), acc + weighted_sum(probs)


def finish(state):
    """`(output, lse)` of a finished state; a row with no key gives zeros."""
    running_max, running_sum, acc = state
    # `!= 0`, not `> 0`: a NaN row must stay NaN (the dense kernels propagate
    # it), so a diverging model stays visible.
    attended = ops.not_equal(running_sum, 0.0)
    safe_sum = ops.where(attended, running_sum, 1.0)
    output = ops.where(ops.expand_dims(attended, -1), acc / ops.expand_dims(safe_sum, -1), 0.0)
    lse = ops.where(attended, running_max + ops.log(safe_sum), NO_KEY_LSE)
    return output, lse


def probabilities(logits, lse):
    """A block's probabilities recomputed from the row's log-sum-exp."""
    return ops.exp(logits - ops.expand_dims(lse, -1))


def output_delta(output, d_output):
    """`rowsum(dO * O)`: the softmax backward's row term."""
    return ops.sum(d_output * output, axis=-1)


def logits_gradient(probs, d_probs, delta):
    """`dL/dlogits = P * (dP - delta)` for one block."""
    return probs * (d_probs - ops.expand_dims(delta, -1))


def recomputing_gradient(forward, backward, closure_free=False):
    """`f(*inputs)` whose gradient is `backward`, with nothing autodiff keeps.

    `forward(*inputs) -> (outputs, saved)` and
    `backward(inputs, saved, d_outputs) -> gradients` (one per input). The
    forward pass's intermediates are dropped: the backward recomputes what
    it needs from `inputs` and `saved` (for attention: the outputs and the
    log-sum-exp), so memory stays linear in the sequence length.

    `closure_free=True` (the tiled engine): on JAX, the two functions are
    traced and their constants passed explicitly (`_jax_recomputing_gradient`),
    so JAX may transform the call after tracing it. Its gradients must have
    their inputs' shapes (the Performer kernel's do not, and keeps Keras'
    `custom_gradient`).
    """

    if closure_free and keras.backend.backend() == "jax":
        return _jax_recomputing_gradient(forward, backward)

    @ops.custom_gradient
    def function(*inputs):
        outputs, saved = forward(*inputs)

        def grad(*args, upstream=None):
            # Keras passes the upstream gradient positionally on TensorFlow
            # and as `upstream=` on JAX.
            if upstream is None:  # one per output (a tuple for several)
                upstream = args[0] if len(args) == 1 else tuple(args)
            return backward(inputs, saved, upstream)

        return outputs, grad

    return function


def _jax_recomputing_gradient(forward, backward):
    """`recomputing_gradient` on JAX: a `jax.custom_vjp` whose functions close
    over nothing traced. The kernels' sweeps read tensors made in the
    caller's trace (plan tables, cut masks, positions from `axis_index`);
    closed over, they leak when JAX transforms the call after tracing it
    (`jax.grad(jax.jit(f))`, the transpose of a `shard_map` body). So both
    sweeps are traced to jaxprs here and their constants passed explicitly,
    as `jax.closure_convert` does for floating values only."""
    import jax

    def function(*inputs):
        closed_forward, shapes = jax.make_jaxpr(forward, return_shape=True)(*inputs)
        out_shape, saved_shape = shapes
        closed_backward, grad_shape = jax.make_jaxpr(backward, return_shape=True)(
            inputs, saved_shape, out_shape
        )
        forward_tree = jax.tree_util.tree_structure(shapes)
        grad_tree = jax.tree_util.tree_structure(grad_shape)
        leaves = jax.tree_util.tree_leaves

        def run_forward(consts, xs):
            flat = jax.core.eval_jaxpr(closed_forward.jaxpr, consts, *leaves(xs))
            return jax.tree_util.tree_unflatten(forward_tree, flat)

        @jax.custom_vjp
        def call(forward_consts, backward_consts, xs):
            return run_forward(forward_consts, xs)[0]

        def call_forward(forward_consts, backward_consts, xs):
            outputs, saved = run_forward(forward_consts, xs)
            return outputs, (forward_consts, backward_consts, xs, saved)

        def call_backward(residuals, upstream):
            forward_consts, backward_consts, xs, saved = residuals
            flat = leaves((xs, saved, upstream))
            grads = jax.core.eval_jaxpr(closed_backward.jaxpr, backward_consts, *flat)
            grads = jax.tree_util.tree_unflatten(grad_tree, grads)
            # As `jax.custom_gradient` takes them: a gradient may drop an
            # input's unit axes or carry another float dtype.
            grads = tuple(
                None if g is None else g.reshape(x.shape).astype(x.dtype)
                for g, x in zip(grads, xs, strict=True)
            )
            nothing = jax.tree_util.tree_map(lambda _: None, (forward_consts, backward_consts))
            return nothing + (tuple(grads),)

        call.defvjp(call_forward, call_backward)
        return call(list(closed_forward.consts), list(closed_backward.consts), tuple(inputs))

    return function


def masked_softmax(logits, mask=None, axis=-1, fused=True):
    """Softmax over `axis` that ignores masked positions; float32 inside.

    Masked positions get weight exactly 0, and a row whose positions are all
    masked gets weight 0 everywhere (not a uniform distribution, not NaN).
    The result has the dtype of `logits`.

    With `fused=True` the backend's softmax op runs (one pass forward, one
    fused gradient: faster at long lengths); it is skipped for a length-1
    axis, where `ops.softmax` warns, and for other axes than the last.
    """
    checks.tensor("masked_softmax", "logits", logits)
    checks.mask("masked_softmax", "mask", mask)
    if mask is not None:
        checks.broadcastable("masked_softmax", ("logits", "mask"), (logits, mask))
    axis = checks.axis("masked_softmax", "axis", axis, max(len(logits.shape), 1))
    fused = checks.flag("masked_softmax", "fused", fused)
    dtype = logits.dtype
    logits = ops.cast(logits, "float32")
    if mask is not None and "bool" not in str(mask.dtype):
        mask = ops.not_equal(mask, 0)
    if mask is not None:
        logits = ops.where(mask, logits, MASKED_LOGIT)
    length = logits.shape[axis]
    if fused and axis in (-1, len(logits.shape) - 1) and length is not None and length > 1:
        weights = ops.softmax(logits, axis=-1)
    else:
        exp = ops.exp(logits - row_max(logits, axis=axis, keepdims=True))
        weights = exp / ops.maximum(ops.sum(exp, axis=axis, keepdims=True), 1e-30)
    if mask is not None:
        # A row with no allowed key came out uniform: zero it.
        weights = ops.where(mask, weights, 0.0)
    return ops.cast(weights, dtype)


def append_column(x, column):
    """`x` with `column` (shaped like `x[..., 0]`) as one more feature.

    Folds a per-row term into a matmul: `[q, -lse] . [k, 1] = q . k - lse`,
    one elementwise pass over a tile fewer.
    """
    return ops.concatenate([x, ops.expand_dims(column, -1)], axis=-1)


def merge_attention(outputs, statistics):
    """Attention over the union of disjoint key sets, from each set's own.

    Each part is softmax attention of the same queries over one set of keys,
    `(B, Tq, H, Dv)`, with its rows' statistics (`{"logsumexp": (B, H, Tq),
    "max": ...}`, as the kernels return them with `return_statistics=True`).
    The rows' log-sum-exps weigh the parts: `out = sum_i exp(lse_i - lse)
    out_i` with `lse = log(sum_i exp(lse_i))`, which is what one kernel over
    all the keys gives (how ring attention and FlashAttention's split-KV
    decoding combine their blocks). A row no part attends gets zeros and
    `-inf`; gradients flow through both. Learned sinks belong to one part
    only (each part counts its own in its denominator).

    Returns:
        `(output, {"logsumexp": (B, H, Tq), "max": (B, H, Tq)})`.
    """
    owner = "merge_attention"
    if not isinstance(outputs, (list, tuple)) or not outputs:
        raise TypeError(
            f"{owner}: `outputs` must be a non-empty list of (B, Tq, H, Dv) "
            f"attention results. Received: outputs={outputs!r}"
        )
    if not isinstance(statistics, (list, tuple)) or len(statistics) != len(outputs):
        raise ValueError(
            f"{owner}: `statistics` must hold one dict of row statistics per "
            f"output ({len(outputs)}). Received: statistics={statistics!r}"
        )
    for index, (output, stats) in enumerate(zip(outputs, statistics, strict=True)):
        checks.tensor(owner, f"outputs[{index}]", output, rank=4)
        if not isinstance(stats, dict) or "logsumexp" not in stats:
            raise TypeError(
                f"{owner}: `statistics[{index}]` must be a dict with a "
                f"'logsumexp' (B, H, Tq) tensor. Received: statistics[{index}]={stats!r}"
            )
        checks.tensor(owner, f"statistics[{index}]['logsumexp']", stats["logsumexp"], rank=3)
    lse = ops.stack([ops.cast(s["logsumexp"], "float32") for s in statistics])  # (n, B, H, Tq)
    top = ops.max(lse, axis=0)
    seen = ops.isfinite(top)
    shift = ops.stop_gradient(ops.where(seen, top, 0.0))
    share = ops.where(ops.isfinite(lse), ops.exp(lse - shift), 0.0)
    total = ops.sum(share, axis=0)
    merged_lse = ops.where(seen, shift + ops.log(ops.where(seen, total, 1.0)), float("-inf"))
    share = share / ops.where(seen, total, 1.0)  # (n, B, H, Tq): each part's weight
    dtype = outputs[0].dtype
    output = 0.0
    for part, weight in zip(outputs, ops.unstack(share, axis=0), strict=True):
        weight = ops.expand_dims(ops.transpose(weight, (0, 2, 1)), -1)  # (B, Tq, H, 1)
        output = output + ops.cast(part, "float32") * weight
    peaks = [s["max"] for s in statistics if "max" in s]
    peak = ops.max(ops.stack(peaks), axis=0) if len(peaks) == len(statistics) else None
    merged = {"logsumexp": merged_lse}
    if peak is not None:
        merged["max"] = peak
    return ops.cast(output, dtype), merged
