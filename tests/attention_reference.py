"""float64 NumPy references of multi-head attention, written from the definitions.

`reference` is `keras_attention.MultiHeadAttention` (projections, grouped
heads, gate, output projection) with the #36 score modifiers (`modifier`:
"soft_cap", "alibi", "sinks", "score_mod", "all", or a tuple of them);
`positional` the
causal / sliding-window / written-cache rules. Shared by the combinations
test and the layer tests of the modifiers; never calls our ops.
"""

import keras
import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@keras.saving.register_keras_serializable(package="keras_attention_tests")
def score_mod(score, batch, head, q_idx, k_idx):
    """A `score_mod` that reads every index (#36), in `keras.ops`."""
    wave = keras.ops.cos(keras.ops.cast(q_idx - 2 * k_idx + head, score.dtype))
    return score + 0.5 * wave - 0.25 * keras.ops.cast(batch, score.dtype)


def _numpy_score_mod(score, batch, head, q_idx, k_idx):
    return score + 0.5 * np.cos(q_idx - 2 * k_idx + head) - 0.25 * batch


@keras.saving.register_keras_serializable(package="keras_attention_tests")
def learned_alibi(score, batch, head, q_idx, k_idx, slopes):
    """A `score_mod` with a weight: ALiBi whose `(H,)` slopes are learned."""
    distance = keras.ops.cast(keras.ops.abs(q_idx - k_idx), score.dtype)
    return score - keras.ops.take(slopes, head) * distance


SOFT_CAP = 1.5  # small enough to bite on these random weights' logits


def paper_alibi_slopes(num_heads):
    """ALiBi's slopes (Press et al., 2021, their code), written afresh."""

    def geometric(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return geometric(num_heads)
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    return geometric(closest) + geometric(2 * closest)[0::2][: num_heads - closest]


def modifier_names(modifier):
    """The set of modifier names `modifier` stands for ("learned_alibi",
    the weighted `score_mod` `learned_alibi`, only by name)."""
    if modifier is None:
        return set()
    if modifier == "all":
        return {"soft_cap", "alibi", "sinks", "score_mod"}
    return {modifier} if isinstance(modifier, str) else set(modifier)


def modified_logits(logits, modifier, rows, weights):
    """The logits `(B, H, Tq, Tk)` changed as `modifier` says; `rows` are the
    queries' absolute positions; `weights["slopes"]` are `learned_alibi`'s."""
    modifier = modifier_names(modifier)
    if not modifier:
        return logits
    batch, heads, _, k_len = logits.shape
    b = np.arange(batch)[:, None, None, None]
    h = np.arange(heads)[None, :, None, None]
    q = np.asarray(rows)[None, None, :, None]
    k = np.arange(k_len)[None, None, None, :]
    if "alibi" in modifier:
        logits = logits - np.asarray(paper_alibi_slopes(heads))[h] * np.abs(q - k)
    if "score_mod" in modifier:
        logits = _numpy_score_mod(logits, b, h, q, k)
    if "learned_alibi" in modifier:
        logits = logits - np.asarray(weights["slopes"], np.float64)[h] * np.abs(q - k)
    if "soft_cap" in modifier:
        logits = SOFT_CAP * np.tanh(logits / SOFT_CAP)
    return logits


def rotary_frequencies(spec, head_dim):
    """`(rotated features d, (d/2,) angles per position)` of a rotary
    embedding spec (`RotaryEmbedding`'s arguments), from the papers: RoPE,
    position interpolation, NTK-aware base, YaRN's ramp, Llama 3.1's bands."""
    d = int(head_dim * spec.get("rotary_fraction", 1.0))
    d -= d % 2
    base = float(spec.get("max_wavelength", 10000.0))
    kind, factor = spec.get("scaling"), float(spec.get("scaling_factor", 1.0))
    if kind == "dynamic":
        base *= factor ** (d / (d - 2))
    inverse = base ** (-np.arange(0, d, 2) / d)
    if kind == "linear":
        inverse = inverse / factor
    elif kind == "yarn":
        trained = spec["original_max_length"]

        def dimension(rotations):  # the feature pair that turns `rotations` times
            return d * np.log(trained / (rotations * 2 * np.pi)) / (2 * np.log(base))

        low = max(np.floor(dimension(spec.get("beta_fast", 32.0))), 0)
        high = min(np.ceil(dimension(spec.get("beta_slow", 1.0))), d - 1)
        interpolated = np.clip((np.arange(d // 2) - low) / max(high - low, 1e-3), 0, 1)
        inverse = interpolated * inverse / factor + (1 - interpolated) * inverse
    elif kind == "llama3":
        trained = spec["original_max_length"]
        low, high = spec.get("low_freq_factor", 1.0), spec.get("high_freq_factor", 4.0)
        wavelength = 2 * np.pi / inverse
        smooth = (trained / wavelength - low) / (high - low)
        inverse = np.where(
            wavelength < trained / high,
            inverse,
            np.where(
                wavelength > trained / low,
                inverse / factor,
                (1 - smooth) * inverse / factor + smooth * inverse,
            ),
        )
    return d, inverse


def rotate(x, positions, spec):
    """`x (B, T, H, D)` with each pair `(x[i], x[i + d/2])` (with
    `spec["interleaved"]`, `(x[2i], x[2i + 1])`) turned by `position *
    theta_i` (`positions`: `(T,)` or `(B, T)`)."""
    d, inverse = rotary_frequencies(spec, x.shape[-1])
    angles = np.reshape(np.asarray(positions, np.float64), (-1, x.shape[1]))[..., None] * inverse
    cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]
    if spec.get("scaling") == "yarn":  # the temperature, on both rotations
        temperature = 0.1 * np.log(spec.get("scaling_factor", 1.0)) + 1
        cos, sin = cos * temperature, sin * temperature
    if spec.get("interleaved"):
        first, second = x[..., 0:d:2], x[..., 1:d:2]
    else:
        first, second = x[..., : d // 2], x[..., d // 2 : d]
    turned_first = first * cos - second * sin
    turned_second = second * cos + first * sin
    if spec.get("interleaved"):
        pairs = np.stack([turned_first, turned_second], axis=-1)
        return np.concatenate([pairs.reshape(*x.shape[:-1], d), x[..., d:]], axis=-1)
    return np.concatenate([turned_first, turned_second, x[..., d:]], axis=-1)


def rms_norm(x, scale, epsilon):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon) * scale


def reference(
    weights,
    query,
    key_value,
    allowed,
    num_heads,
    num_kv_heads,
    gate,
    modifier=None,
    rows=None,
    projection=None,
    query_positions=None,
    key_positions=None,
    head_mask=None,
    dropped=None,
):
    """`(output (B, Tq, F), weights (B, H, Tq, Tk))` in float64.

    `query (B, Tq, F)`, `key_value (B, Tk, F)` (self-attention inputs for
    keys and values), `allowed (B, H, Tq, Tk)` boolean; `modifier` changes
    the logits (at absolute query positions `rows`, default `0..Tq-1`), and
    with sinks one more logit per head joins each row's denominator. A row
    with nothing allowed has zero weights and a zero context: its output is
    the output projection's bias. `projection` (#37): a dict with `rotary`
    (a `RotaryEmbedding` spec; queries at `query_positions`, default
    `rows`, keys at `key_positions`, default `0..Tk-1`), `qk_norm` (the
    epsilon), `query_scale` and `use_bias` (a bool or the names of the
    projections with one; a bias in `weights` that it does not name fails).
    `head_mask` (`(H,)` or `(B, H)`) scales each head's context before the
    output projection (the weights returned are unscaled). `dropped`
    (`(B, H, Tq, Tk)`, dropout's `keep / (1 - rate)`) multiplies the weights
    in the context (the weights returned are before it).
    """
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    projection = projection or {}
    use_bias = projection.get("use_bias", True)

    def bias(name):
        named = (
            use_bias if isinstance(use_bias, bool) else name.replace("attention_", "") in use_bias
        )
        if not named:
            assert f"{name}/bias" not in w, f"{name} has a bias it was not given"
            return 0.0
        return w[f"{name}/bias"]

    def project(x, name):
        return np.einsum("btf,fhd->bthd", x, w[f"{name}/kernel"]) + bias(name)

    q, k, v = project(query, "query"), project(key_value, "key"), project(key_value, "value")
    rows = np.arange(query.shape[1]) if rows is None else rows
    if projection.get("qk_norm") is not None:
        q = rms_norm(q, w["query_norm/scale"], projection["qk_norm"])
        k = rms_norm(k, w["key_norm/scale"], projection["qk_norm"])
    if projection.get("rotary") is not None:
        spec = projection["rotary"]
        q = rotate(q, rows if query_positions is None else query_positions, spec)
        k = rotate(k, np.arange(k.shape[1]) if key_positions is None else key_positions, spec)
    groups = num_heads // num_kv_heads
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scale = projection.get("query_scale") or 1.0 / np.sqrt(q.shape[-1])
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    logits = modified_logits(logits, modifier, rows, w)
    logits = np.where(allowed, logits, -np.inf)
    peak = np.max(logits, axis=-1, keepdims=True)
    sinks = None
    if "sinks" in modifier_names(modifier):
        sinks = w["sinks"][None, :, None, None]
        peak = np.maximum(peak, sinks)
    exp = np.exp(logits - np.where(np.isfinite(peak), peak, 0.0))
    total = exp.sum(-1, keepdims=True)
    if sinks is not None:  # zero rows stay zero: the sink has no value
        total = total + np.exp(sinks - peak)
    probs = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    context = np.einsum("bhqk,bkhd->bqhd", probs * (1.0 if dropped is None else dropped), v)
    if gate:
        context = context * sigmoid(project(query, "gate"))
    if head_mask is not None:
        head_scale = np.asarray(head_mask, np.float64)
        context = context * (
            head_scale[None, None, :, None]
            if head_scale.ndim == 1
            else head_scale[:, None, :, None]
        )
    output = np.einsum("bqhd,hdo->bqo", context, w["attention_output/kernel"])
    return output + bias("attention_output"), probs


def positional(
    rows,
    cols,
    causal,
    window,
    key_length=None,
    prefix=None,
    sink_tokens=None,
    mask_mod=False,
    batch=1,
    heads=1,
):
    """`(B|1, H|1, Tq, Tk)` boolean: the positional rules at absolute query
    positions `rows` and key positions `cols`. `prefix` (with `causal`): an
    int or one per example; `sink_tokens` (with `window`); `mask_mod=True`
    applies `numpy_mask_mod` over `batch` examples and `heads` heads."""
    q = np.asarray(rows)[None, None, :, None]
    k = np.asarray(cols)[None, None, None, :]
    allowed = np.ones((1, 1, q.shape[2], k.shape[3]), bool)
    if causal:
        seen = k <= q
        if prefix is not None:
            seen = seen | (k < np.reshape(prefix, (-1, 1, 1, 1)))
        allowed = allowed & seen
    if window is not None:
        allowed = allowed & ((np.abs(q - k) < window) | (k < (sink_tokens or 0)))
    if key_length is not None:
        allowed = allowed & (k < key_length)
    if mask_mod:
        b = np.arange(batch)[:, None, None, None]
        h = np.arange(heads)[None, :, None, None]
        allowed = allowed & numpy_mask_mod(b, h, q, k)
    return allowed


@keras.saving.register_keras_serializable(package="keras_attention_tests")
def mask_mod(batch, head, q_idx, k_idx):
    """A `mask_mod` that reads every index (#36), in `keras.ops`."""
    return keras.ops.not_equal((q_idx + 2 * k_idx + head + batch) % 3, 0)


def numpy_mask_mod(batch, head, q_idx, k_idx):
    return (q_idx + 2 * k_idx + head + batch) % 3 != 0
