"""FAVOR+ (Performer) random features and linear-time kernelised attention.

Choromanski et al. 2021, "Rethinking Attention with Performers"
(https://arxiv.org/abs/2009.14794). The softmax kernel `exp(q . k)` is
approximated by `phi(q) . phi(k)` with positive random features

    phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)

so attention `D^-1 A V` becomes `phi(Q) (phi(K)^T V)` normalised by
`phi(Q) (phi(K)^T 1)`, which costs `O(L m d)` instead of `O(L^2 d)`.

Feature maps are computed in float32 whatever the input dtype. Queries and
keys are scaled by `d^-1/4` each (so `q . k` gets the usual `1 / sqrt(d)`),
the largest exponent is subtracted before `exp` (per query row, and per
batch and head over all valid keys: both constants cancel in the
normalisation), and a small epsilon keeps features strictly positive.
"""

import math

import numpy as np
from keras import ops

from keras_attention import validation
from keras_attention.ops import checks
from keras_attention.ops import loops
from keras_attention.ops import masking
from keras_attention.ops import online_softmax
from keras_attention.ops.shapes import static_dim

# Layout used inside this module: (B, H, T, m) features, (B, H, T, Dv) values.


def gaussian_projection(num_features, dim, rng):
    """`(num_features, dim)` i.i.d. standard normal rows (NumPy)."""
    return rng.standard_normal((num_features, dim))


def orthogonal_projection(num_features, dim, rng):
    """`(num_features, dim)` rows, orthogonal within blocks of `dim` rows.

    Each block is the Q of a Gaussian matrix's QR decomposition; rows are
    then rescaled by the norms of independent Gaussian vectors, so each row
    has the marginal distribution of a Gaussian row (the paper's regular
    "ORF" construction). With `num_features > dim`, `ceil(m / d)` blocks are
    stacked and the last one is truncated.
    """
    blocks = []
    for _ in range(-(-num_features // dim)):
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
        q = q * np.sign(np.diag(r))  # Haar-distributed, not QR-biased
        blocks.append(q.T)
    matrix = np.concatenate(blocks, axis=0)[:num_features]
    norms = np.linalg.norm(rng.standard_normal((num_features, dim)), axis=1)
    return matrix * norms[:, None]


def random_projection(num_features, dim, orthogonal=True, seed=None):
    """A projection for `softmax_features`, drawn with NumPy from `seed`
    (an int, a tuple of non-negative ints as NumPy's generators take, or None)."""
    num_features = checks.positive_int("random_projection", "num_features", num_features)
    dim = checks.positive_int("random_projection", "dim", dim)
    orthogonal = checks.flag("random_projection", "orthogonal", orthogonal)
    if isinstance(seed, (tuple, list)) and seed:
        if not all(validation.is_int(s) and s >= 0 for s in seed):
            raise ValueError(
                "random_projection: `seed` must be an integer, a tuple of non-negative "
                f"integers or None. Received: seed={seed!r}"
            )
    else:
        seed = validation.validate_seed("random_projection", seed)
    rng = np.random.default_rng(seed)
    draw = orthogonal_projection if orthogonal else gaussian_projection
    return draw(num_features, dim, rng).astype("float32")


def _scaled(x, projection):
    x = ops.cast(x, "float32") * (x.shape[-1] ** -0.25)
    projected = ops.einsum("bhtd,md->bhtm", x, ops.cast(projection, "float32"))
    return x, projected


def softmax_features(x, projection, *, is_query, mask=None, epsilon=1e-6):
    """Positive random features of the softmax kernel (FAVOR+).

    Args:
        x: `(B, H, T, D)` queries or keys.
        projection: `(m, D)` random projection.
        is_query: queries are stabilised per row, keys by one constant per
            batch and head (the max over valid keys), which both cancel.
        mask: `(B, T)` boolean or `None`; masked positions get zero features
            (they contribute nothing) and do not take part in the max.
        epsilon: added to every feature after stabilisation.

    Returns:
        float32 `(B, H, T, m)`.

    The gradient with respect to `x` is custom and formed from the output
    alone: with `z = W x - |x|^2 / 2 - c` and `f = (exp(z) + eps) / sqrt(m)`,
    `df/dz = f - eps / sqrt(m)` and `dz/dx = W^T - x` (the stabiliser `c`
    is a constant: it cancels in the normalisation). So the backward keeps
    only `x` and the features, not the projected `(B, H, T, m)` logits and
    the several float32 copies autodiff would store (the causal path relies
    on this; the non-causal default goes further and never holds whole
    feature maps, see `chunked_softmax_attention`). No gradient flows to
    `projection` (it is a fixed, non-trainable draw).
    """
    _check_features_args("softmax_features", x, projection, mask, epsilon)
    is_query = checks.flag("softmax_features", "is_query", is_query)
    num_features = projection.shape[0]
    root = math.sqrt(num_features)
    scale = x.shape[-1] ** -0.25
    projection = ops.stop_gradient(ops.cast(projection, "float32"))
    valid = None if mask is None else ops.cast(mask, "bool")[:, None, :, None]

    def forward(x):
        scaled = ops.cast(x, "float32") * scale
        projected = ops.einsum("bhtd,md->bhtm", scaled, projection)
        half_norm = ops.sum(ops.square(scaled), axis=-1, keepdims=True) / 2.0
        if is_query:
            shift = masking.row_max(projected, axis=-1, keepdims=True)
        else:
            # Any constant cancels; taken over the valid, finite keys, so that
            # a NaN key (see `masking.confine_nonfinite`) leaves the features
            # of the others finite.
            usable = ops.isfinite(projected)
            if valid is not None:
                usable = ops.logical_and(usable, valid)
            shift = masking.row_max(
                ops.where(usable, projected, online_softmax.INITIAL_MAX),
                axis=(2, 3),
                keepdims=True,
            )
        features = (ops.exp(projected - (half_norm + shift)) + epsilon) / root
        if valid is not None:
            features = ops.where(valid, features, 0.0)
        return features, features

    def backward(inputs, features, upstream):
        (x,) = inputs
        d_logits = upstream * (features - epsilon / root)
        if valid is not None:
            d_logits = ops.where(valid, d_logits, 0.0)
        d_scaled = ops.einsum("bhtm,md->bhtd", d_logits, projection) - ops.cast(
            x, "float32"
        ) * scale * ops.sum(d_logits, axis=-1, keepdims=True)
        return ops.cast(d_scaled * scale, x.dtype)

    features_of = online_softmax.recomputing_gradient(forward, backward)
    return features_of(x)


def relu_features(x, projection, *, mask=None, epsilon=1e-3):
    """`relu(W x) + epsilon`: the Performer's generalised ReLU kernel."""
    _check_features_args("relu_features", x, projection, mask, epsilon)
    _, projected = _scaled(x, projection)
    features = ops.relu(projected) / math.sqrt(projection.shape[0]) + epsilon
    return _apply_mask(features, mask)


def trigonometric_features(x, projection, *, mask=None):
    """`exp(|x|^2 / 2) [cos(W x), sin(W x)] / sqrt(m)`: the classic random
    Fourier features of the softmax kernel (unbiased but not positive, so
    the normaliser can vanish). Shown only for comparison."""
    x, projected = _scaled(x, projection)
    scale = ops.exp(ops.sum(ops.square(x), axis=-1, keepdims=True) / 2.0)
    features = ops.concatenate([ops.cos(projected), ops.sin(projected)], axis=-1)
    features = features * scale / math.sqrt(projection.shape[0])
    return _apply_mask(features, mask)


def _check_features_args(owner, x, projection, mask, epsilon):
    """The `(B, H, T, D)` input, `(m, D)` projection, `(B, T)` mask and
    epsilon of a feature map."""
    checks.tensor(owner, "x", x, rank=4)
    checks.tensor(owner, "projection", projection, rank=2)
    checks.same_size(owner, ("x", x, -1, "features"), ("projection", projection, -1, None))
    checks.mask(owner, "mask", mask, rank=2)
    if mask is not None:
        checks.same_size(owner, ("x", x, 2, "length"), ("mask", mask, 1, None))
    checks.real(owner, "epsilon", epsilon, low=0.0)


def _check_linear_args(owner, query_features, key_features, value):
    """The `(B, H, T, m)` features and `(B, H, Tv, Dv)` values of linear attention."""
    checks.tensor(owner, "query_features", query_features, rank=4)
    checks.tensor(owner, "key_features", key_features, rank=4)
    checks.tensor(owner, "value", value, rank=4)
    checks.same_size(
        owner,
        ("query_features", query_features, -1, "number of features"),
        ("key_features", key_features, -1, None),
    )
    checks.same_size(owner, ("key_features", key_features, 2, "length"), ("value", value, 2, None))


def _apply_mask(features, mask):
    if mask is None:
        return features
    # A `where`, not a product: a masked NaN key contributes nothing.
    return ops.where(ops.cast(mask, "bool")[:, None, :, None], features, 0.0)


def _safe_divide(numerator, denominator):
    """`numerator / denominator`, 0 where the denominator is 0 (no key)."""
    safe = ops.where(ops.equal(denominator, 0), 1.0, denominator)
    return numerator / safe[..., None]


def linear_attention(query_features, key_features, value):
    """Non-causal `phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1)` in `O(L m d)`.

    Args:
        query_features: `(B, H, Tq, m)`.
        key_features: `(B, H, Tv, m)`, zero at masked keys.
        value: `(B, H, Tv, Dv)`.
    """
    _check_linear_args("linear_attention", query_features, key_features, value)
    value = ops.cast(value, key_features.dtype)
    context = ops.einsum("bhkm,bhkd->bhmd", key_features, value)
    numerator = ops.einsum("bhqm,bhmd->bhqd", query_features, context)
    denominator = ops.einsum("bhqm,bhm->bhq", query_features, ops.sum(key_features, axis=2))
    return _safe_divide(numerator, denominator)


def _exclusive_cumsum(x):
    """Sum of the entries strictly before each position along axis 2."""
    total = ops.cumsum(x, axis=2)
    widths = [[0, 0] for _ in range(len(x.shape))]
    widths[2] = [1, 0]
    return ops.pad(total, widths)[:, :, :-1]


def causal_linear_attention(query_features, key_features, value, chunk_size=128):
    """Causal linear attention by chunked prefix sums.

    The sequence is split into chunks of `chunk_size`. Each chunk sees the
    prefix sum of `phi(K)^T V` over all earlier chunks (one `cumsum` over
    the chunk axis, which XLA compiles to a scan, no Python loop) plus an
    exact lower-triangular `chunk x chunk` product inside the chunk. Memory is
    `O(L / chunk * m * Dv + L * chunk)`: linear in `L`.

    Args: as `linear_attention`, with `Tq == Tv`.
    """
    owner = "causal_linear_attention"
    _check_linear_args(owner, query_features, key_features, value)
    checks.same_size(
        owner,
        ("query_features", query_features, 2, "length (causal)"),
        ("key_features", key_features, 2, None),
    )
    chunk_size = checks.positive_int(owner, "chunk_size", chunk_size)
    value = ops.cast(value, key_features.dtype)
    length = query_features.shape[2]
    length = length if length is not None else ops.shape(query_features)[2]
    num_chunks = (length + chunk_size - 1) // chunk_size
    padded = num_chunks * chunk_size

    def chunks(x):
        x = ops.pad(x, [[0, 0], [0, 0], [0, padded - length], [0, 0]])
        return ops.reshape(x, (ops.shape(x)[0], x.shape[1], num_chunks, chunk_size, x.shape[-1]))

    q, k, v = chunks(query_features), chunks(key_features), chunks(value)
    context = ops.einsum("bhncm,bhncd->bhnmd", k, v)  # per-chunk phi(K)^T V
    key_sums = ops.sum(k, axis=3)  # (B, H, n, m)
    # Exclusive prefix over chunks: chunk n sees chunks 0 .. n-1.
    context = _exclusive_cumsum(context)
    key_sums = _exclusive_cumsum(key_sums)
    numerator = ops.einsum("bhncm,bhnmd->bhncd", q, context)
    denominator = ops.einsum("bhncm,bhnm->bhnc", q, key_sums)
    causal = ops.greater_equal(ops.arange(chunk_size)[:, None], ops.arange(chunk_size)[None, :])
    # A `where`: a NaN key later in the chunk must not reach earlier queries.
    local = ops.where(causal, ops.einsum("bhncm,bhnkm->bhnck", q, k), 0.0)
    numerator = numerator + ops.einsum("bhnck,bhnkd->bhncd", local, v)
    denominator = denominator + ops.sum(local, axis=-1)
    output = _safe_divide(numerator, denominator)
    output = ops.reshape(output, (ops.shape(output)[0], output.shape[1], padded, -1))
    return output[:, :, :length]


def kernel_attention_weights(query_features, key_features, causal=False, mask=None):
    """The weights `phi(Q) phi(K)^T` implied by the features, row-normalised.

    `(B, H, Tq, Tv)`: `O(Tq * Tv)`, for visualisation and for explicit
    `(B, Tq, Tv)` masks that have no linear-time form.
    """
    kernel = ops.einsum("bhqm,bhkm->bhqk", query_features, key_features)
    # `where`, not products: a NaN key reaches only the queries that see it.
    if causal:
        tq, tv = ops.shape(kernel)[2], ops.shape(kernel)[3]
        kernel = ops.where(
            ops.greater_equal(ops.arange(tq)[:, None], ops.arange(tv)[None, :]),
            kernel,
            0.0,
        )
    if mask is not None:
        kernel = ops.where(ops.cast(mask, "bool")[:, None], kernel, 0.0)  # (B, 1, Tq, Tv)
    return _safe_divide(kernel, ops.sum(kernel, axis=-1))


# Rows per chunk of the chunked non-causal softmax-kernel path.
DEFAULT_FEATURE_CHUNK = 1024


def chunked_softmax_attention(
    query, key, value, projection, *, key_mask=None, chunk_size=None, epsilon=1e-6
):
    """Non-causal FAVOR+ softmax-kernel attention, chunked over the length.

    The same result as `linear_attention(softmax_features(q), softmax_features(k),
    v)` (same stabilisers, same epsilon), but the `(B, H, T, m)` feature maps
    are never held whole: one `fori_loop` over key chunks accumulates
    `phi(K)^T V` and `phi(K)^T 1` (after a first pass for the key
    stabiliser, the max over all valid keys), one over query chunks applies
    them. The gradient is custom: the backward recomputes each chunk's
    features (their gradient is formed from the features, see
    `softmax_features`), so forward + backward keeps only `O(T * D)`
    tensors, `O(m * Dv)` sums and one chunk's features.

    Args:
        query: `(B, Tq, H, D)`; key: `(B, Tv, H, D)`; value: `(B, Tv, H, Dv)`,
            with static lengths.
        projection: `(m, D)`.
        key_mask: `(B, Tv)` boolean or `None`.
        chunk_size: rows per chunk (default 1024); need not divide the length.

    Returns:
        float32 `(B, Tq, H, Dv)`.
    """
    sweeps = _ChunkedSoftmaxSweeps(query, key, value, projection, key_mask, chunk_size, epsilon)
    attend = online_softmax.recomputing_gradient(sweeps.forward, sweeps.backward)
    nq, nk, q_chunk, k_chunk = sweeps.nq, sweeps.nk, sweeps.q_chunk, sweeps.k_chunk
    out = attend(
        loops.to_time_blocks(ops.cast(query, "float32"), nq, q_chunk),
        loops.to_time_blocks(ops.cast(key, "float32"), nk, k_chunk),
        loops.to_time_blocks(ops.cast(value, "float32"), nk, k_chunk),
    )  # (nq, B, H, Tc, Dv)
    out = ops.transpose(out, (1, 0, 3, 2, 4))
    out = ops.reshape(out, (-1, nq * q_chunk, query.shape[2], value.shape[-1]))
    return out[:, : query.shape[1]]


class _ChunkedSoftmaxSweeps:
    """One call of `chunked_softmax_attention`: its chunks, a chunk's softmax
    features and their gradient, and the forward and recomputing backward
    sweeps over time blocks `(n, B, H, Tc, D)`."""

    def __init__(self, query, key, value, projection, key_mask, chunk_size, epsilon):
        q_len, self.heads, dim = query.shape[1], query.shape[2], query.shape[3]
        k_len = key.shape[1]
        self.value_dim = value.shape[-1]
        self.num_features = projection.shape[0]
        self.root = math.sqrt(self.num_features)
        self.scale = dim**-0.25
        self.epsilon = epsilon
        self.projection = ops.stop_gradient(ops.cast(projection, "float32"))
        chunk = chunk_size or DEFAULT_FEATURE_CHUNK
        self.q_chunk, self.k_chunk = min(chunk, q_len), min(chunk, k_len)
        self.nq, self.nk = -(-q_len // self.q_chunk), -(-k_len // self.k_chunk)
        self.valid = self._key_validity(key_mask, k_len)

    def _key_validity(self, key_mask, k_len):
        """`(nk, Bm, 1, Tc, 1)` valid keys per chunk, or None when all are."""
        padded = self.nk * self.k_chunk
        if key_mask is None and padded == k_len:
            return None
        valid = ops.ones((1, k_len), "bool") if key_mask is None else key_mask
        valid = ops.cast(valid, "bool")
        if padded != k_len:
            valid = ops.pad(valid, ((0, 0), (0, padded - k_len)), constant_values=False)
        valid = ops.reshape(valid, (-1, self.nk, 1, self.k_chunk, 1))
        return ops.transpose(valid, (1, 0, 2, 3, 4))

    def chunk_valid(self, j):
        return None if self.valid is None else ops.take(self.valid, j, axis=0)

    def projected(self, x):
        scaled = x * self.scale
        return scaled, ops.einsum("bhtd,md->bhtm", scaled, self.projection)

    def features(self, x, shift, mask):
        """A chunk's features; `shift` None (queries): each row's own maximum."""
        scaled, projected = self.projected(x)
        half_norm = ops.sum(ops.square(scaled), axis=-1, keepdims=True) / 2.0
        if shift is None:
            shift = masking.row_max(projected, axis=-1, keepdims=True)
        features = (ops.exp(projected - (half_norm + shift)) + self.epsilon) / self.root
        if mask is not None:
            features = ops.where(mask, features, 0.0)
        return features

    def features_grad(self, d_features, features, x, mask):
        """The gradient of a chunk's input from its features' (see `softmax_features`)."""
        d_logits = d_features * (features - self.epsilon / self.root)
        if mask is not None:
            d_logits = ops.where(mask, d_logits, 0.0)
        d_scaled = ops.einsum("bhtm,md->bhtd", d_logits, self.projection) - (
            x * self.scale
        ) * ops.sum(d_logits, axis=-1, keepdims=True)
        return d_scaled * self.scale

    def key_shift(self, k):
        """The keys' stabiliser: the maximum projection over all valid keys, `(B, H, 1, 1)`."""

        def step(j, shift):
            _, projected = self.projected(ops.take(k, j, axis=0))
            mask = self.chunk_valid(j)
            if mask is not None:
                projected = ops.where(mask, projected, online_softmax.INITIAL_MAX)
            return ops.maximum(shift, masking.row_max(projected, axis=(2, 3), keepdims=True))

        batch = ops.shape(k)[1]
        init = ops.full((batch, self.heads, 1, 1), online_softmax.INITIAL_MAX, dtype="float32")
        return loops.sequential_fori_loop(0, self.nk, step, init)

    def forward(self, q, k, v):
        """`(out, saved)`: the keys' sums `phi(K)^T V` and `phi(K)^T 1`, then each query chunk."""
        shift = self.key_shift(k)
        batch = ops.shape(k)[1]

        def key_step(j, sums):
            context, key_sum = sums
            features = self.features(ops.take(k, j, axis=0), shift, self.chunk_valid(j))
            context = context + ops.einsum("bhtm,bhtd->bhmd", features, ops.take(v, j, axis=0))
            return context, key_sum + ops.sum(features, axis=2)

        sums = (
            ops.zeros((batch, self.heads, self.num_features, self.value_dim), "float32"),
            ops.zeros((batch, self.heads, self.num_features), "float32"),
        )
        context, key_sum = loops.sequential_fori_loop(0, self.nk, key_step, sums)

        def query_step(i, buffers):
            out_buffer, den_buffer = buffers
            features = self.features(ops.take(q, i, axis=0), None, None)
            numerator = ops.einsum("bhtm,bhmd->bhtd", features, context)
            denominator = ops.einsum("bhtm,bhm->bht", features, key_sum)
            out = _safe_divide(numerator, denominator)
            return (
                loops.write_block(out_buffer, i, out),
                loops.write_block(den_buffer, i, denominator),
            )

        rows = (self.nq, batch, self.heads, self.q_chunk)
        buffers = (
            loops.block_buffer(ops.zeros(rows + (self.value_dim,), "float32")),
            loops.block_buffer(ops.zeros(rows, "float32")),
        )
        out, denominator = loops.sequential_fori_loop(0, self.nq, query_step, buffers)
        out, denominator = loops.stack_blocks(out), loops.stack_blocks(denominator)
        return out, (out, denominator, context, key_sum, shift)

    def backward(self, inputs, saved, d_out):
        """`(dq, dk, dv)`, each chunk's features recomputed."""
        q, k, v = inputs
        out, denominator, context, key_sum, shift = saved
        dq, d_context, d_key_sum = self._query_gradients(
            q, out, denominator, context, key_sum, d_out
        )
        dk, dv = self._key_gradients(k, v, shift, d_context, d_key_sum)
        return dq, dk, dv

    def _query_gradients(self, q, out, denominator, context, key_sum, d_out):
        """`dq` and the gradients of the keys' sums, one query chunk at a time."""
        no_key = ops.equal(denominator, 0)
        inverse = ops.where(no_key, 0.0, 1.0 / ops.where(no_key, 1.0, denominator))

        def query_step(i, state):
            dq_buffer, d_context, d_key_sum = state
            q_i = ops.take(q, i, axis=0)
            features = self.features(q_i, None, None)
            inverse_i = ops.take(inverse, i, axis=0)
            d_numerator = ops.take(d_out, i, axis=0) * inverse_i[..., None]
            d_denominator = -ops.sum(d_numerator * ops.take(out, i, axis=0), axis=-1)  # (B, H, Tc)
            d_features = (
                ops.einsum("bhtd,bhmd->bhtm", d_numerator, context)
                + d_denominator[..., None] * key_sum[:, :, None, :]
            )
            d_context = d_context + ops.einsum("bhtm,bhtd->bhmd", features, d_numerator)
            d_key_sum = d_key_sum + ops.einsum("bhtm,bht->bhm", features, d_denominator)
            dq = self.features_grad(d_features, features, q_i, None)
            return loops.write_block(dq_buffer, i, dq), d_context, d_key_sum

        state = (
            loops.block_buffer(ops.zeros_like(q)),
            ops.zeros_like(context),
            ops.zeros_like(key_sum),
        )
        dq, d_context, d_key_sum = loops.sequential_fori_loop(0, self.nq, query_step, state)
        return loops.stack_blocks(dq), d_context, d_key_sum

    def _key_gradients(self, k, v, shift, d_context, d_key_sum):
        """`dk` and `dv`, one key chunk at a time."""

        def key_step(j, buffers):
            dk_buffer, dv_buffer = buffers
            k_j, v_j, mask = ops.take(k, j, axis=0), ops.take(v, j, axis=0), self.chunk_valid(j)
            features = self.features(k_j, shift, mask)
            d_features = ops.einsum("bhtd,bhmd->bhtm", v_j, d_context) + d_key_sum[:, :, None, :]
            dv = ops.einsum("bhtm,bhmd->bhtd", features, d_context)
            dk = self.features_grad(d_features, features, k_j, mask)
            return loops.write_block(dk_buffer, j, dk), loops.write_block(dv_buffer, j, dv)

        buffers = (loops.block_buffer(ops.zeros_like(k)), loops.block_buffer(ops.zeros_like(v)))
        dk, dv = loops.sequential_fori_loop(0, self.nk, key_step, buffers)
        return loops.stack_blocks(dk), loops.stack_blocks(dv)


def favor_attention(
    query,
    key,
    value,
    projection,
    *,
    kernel="softmax",
    causal=False,
    key_mask=None,
    attention_mask=None,
    chunk_size=128,
    return_weights=False,
    feature_chunk_size=None,
):
    """Performer attention over projected multi-head tensors.

    Args:
        query: `(B, Tq, H, D)`.
        key: `(B, Tv, H, D)`.
        value: `(B, Tv, H, Dv)`.
        projection: `(m, D)` random projection.
        kernel: `"softmax"` (positive random features) or `"relu"`.
        causal: query `i` sees keys `j <= i` (needs `Tq == Tv`).
        key_mask: `(B, Tv)` boolean or `None`; masked keys contribute nothing.
        attention_mask: `(B, Tq, Tv)` boolean or `None`. It has no linear-time
            form, so giving one switches to the `O(Tq * Tv)` dense product
            of the same features.
        chunk_size: chunk length of the causal prefix sums.
        return_weights: also return the implied `(B, H, Tq, Tv)` weights
            (`O(Tq * Tv)`; the output is then computed from them).
        feature_chunk_size: rows per chunk of the non-causal softmax path.

    The non-causal softmax kernel with static lengths, no explicit mask and
    no weights asked for (the usual case) runs through
    `chunked_softmax_attention`, which never holds the whole feature maps;
    the other cases compute the `(B, H, T, m)` features at once.

    Returns:
        `output (B, Tq, H, Dv)` in the dtype of `value`, and with
        `return_weights` the float32 weights.
    """
    owner = "favor_attention"
    kernel = checks.choice(owner, "kernel", kernel, ("softmax", "relu"))
    causal = checks.flag(owner, "causal", causal)
    return_weights = checks.flag(owner, "return_weights", return_weights)
    chunk_size = checks.positive_int(owner, "chunk_size", chunk_size)
    feature_chunk_size = checks.positive_int(
        owner, "feature_chunk_size", feature_chunk_size, allow_none=True
    )
    for name, x in (("query", query), ("key", key), ("value", value)):
        checks.tensor(owner, name, x, rank=4)
    checks.tensor(owner, "projection", projection, rank=2)
    checks.same_size(owner, ("query", query, -1, "head size"), ("key", key, -1, None))
    checks.same_size(owner, ("key", key, 1, "length"), ("value", value, 1, None))
    checks.same_size(owner, ("query", query, -1, "head size"), ("projection", projection, -1, None))
    checks.mask(owner, "key_mask", key_mask, rank=2)
    checks.mask(owner, "attention_mask", attention_mask, rank=3)
    if causal:
        checks.same_size(owner, ("query", query, 1, "length (causal)"), ("key", key, 1, None))
    dtype = value.dtype
    if masking.is_statically_empty(query, key):
        # No query, or nothing to attend to: the zeros of a fully masked row.
        result = masking.empty_attention(
            ops.cast(query, dtype), value, return_weights=return_weights
        )
        if return_weights:
            return result[0], ops.cast(result[1], "float32")
        return result
    if (
        kernel == "softmax"
        and not causal
        and attention_mask is None
        and not return_weights
        and static_dim(query.shape[1]) is not None
        and static_dim(key.shape[1]) is not None
    ):
        output = chunked_softmax_attention(
            query,
            key,
            value,
            projection,
            key_mask=key_mask,
            chunk_size=feature_chunk_size,
        )
        return ops.cast(output, dtype)
    # Queries that cannot see a NaN/Inf key or value stay finite.
    key, value = masking.confine_nonfinite(key, value)
    q = ops.transpose(query, (0, 2, 1, 3))
    k = ops.transpose(key, (0, 2, 1, 3))
    v = ops.cast(ops.transpose(value, (0, 2, 1, 3)), "float32")
    if kernel == "softmax":
        q = softmax_features(q, projection, is_query=True)
        k = softmax_features(k, projection, is_query=False, mask=key_mask)
    elif kernel == "relu":
        q = relu_features(q, projection)
        k = relu_features(k, projection, mask=key_mask)
    else:
        raise ValueError(
            f"favor_attention: `kernel` must be 'softmax' or 'relu'. Received: kernel={kernel!r}"
        )
    weights = None
    if return_weights or attention_mask is not None:
        weights = kernel_attention_weights(q, k, causal=causal, mask=attention_mask)
        output = ops.einsum("bhqk,bhkd->bhqd", weights, v)
    elif causal:
        output = causal_linear_attention(q, k, v, chunk_size=chunk_size)
    else:
        output = linear_attention(q, k, v)
    output = ops.cast(ops.transpose(output, (0, 2, 1, 3)), dtype)
    if return_weights:
        return output, weights
    return output
