"""Ring attention on 4 forced host devices (see ring_attention_test).

Usage: python -m tests.distribution.ring_worker
Prints one JSON object: largest differences of outputs and gradients from a
NumPy float64 reference, per mask case; what the jaxprs contain; how many
key/value blocks each case computed; the layer against the exact layer.
"""

import functools
import json
import os

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

# Imported after the environment above: Keras and JAX read it at import.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import keras_attention as ka  # noqa: E402
from keras_attention.ops import ring  # noqa: E402
from keras_attention.ops.attention_mask import AttentionMask  # noqa: E402
from tests.gradients import layer_gradients  # noqa: E402

B, H, D, DV = 2, 2, 4, 3


def reference(q, k, v, key_mask, query_mask, causal, d_out):
    """Output and (dq, dk, dv) of masked softmax attention, NumPy float64."""
    q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
    tq, tk = q.shape[1], k.shape[1]
    scale = 1.0 / np.sqrt(q.shape[-1])
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    allowed = np.ones((q.shape[0], 1, tq, tk), bool)
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
    if causal:
        allowed &= np.tril(np.ones((tq, tk), bool))[None, None]
    logits = np.where(allowed, logits, -np.inf)
    row_max = np.max(logits, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    exp = np.exp(logits - row_max)
    total = exp.sum(-1, keepdims=True)
    probs = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    keep = np.ones((q.shape[0], tq), bool) if query_mask is None else query_mask
    out = np.einsum("bhqk,bkhd->bqhd", probs, v) * keep[:, :, None, None]
    d_out = d_out * keep[:, :, None, None]
    d_v = np.einsum("bhqk,bqhd->bkhd", probs, d_out)
    d_probs = np.einsum("bqhd,bkhd->bhqk", d_out, v)
    d_logits = probs * (d_probs - np.sum(d_probs * probs, -1, keepdims=True))
    d_q = np.einsum("bhqk,bkhd->bqhd", d_logits, k) * scale
    d_k = np.einsum("bhqk,bqhd->bkhd", d_logits, q) * scale
    seen = allowed & keep[:, None, :, None]
    lse = np.log(np.sum(np.where(seen, np.exp(logits - row_max), 0.0), -1)) + row_max[..., 0]
    lse = np.where(seen.any(-1), lse, -np.inf)  # (B, H, Tq)
    return out, (d_q, d_k, d_v), lse


CASES = {
    "plain": dict(tq=16, tk=16),
    "padding": dict(tq=16, tk=16, key_mask=True, query_mask=True),
    "causal": dict(tq=16, tk=16, causal=True),
    "causal_contiguous": dict(tq=16, tk=16, causal=True, balance="contiguous"),
    "causal_padding": dict(tq=16, tk=16, causal=True, key_mask=True, query_mask=True),
    "cross_attention": dict(tq=8, tk=20, key_mask=True),
    "fully_masked_rows": dict(tq=16, tk=16, key_mask="empty_row", causal=True),
}


def inputs(case, seed=0):
    rng = np.random.default_rng(seed)
    tq, tk = case["tq"], case["tk"]
    q = rng.normal(size=(B, tq, H, D)).astype("float32")
    k = rng.normal(size=(B, tk, H, D)).astype("float32")
    v = rng.normal(size=(B, tk, H, DV)).astype("float32")
    d_out = rng.normal(size=(B, tq, H, DV)).astype("float32")
    key_mask = query_mask = None
    if case.get("key_mask"):
        key_mask = rng.random((B, tk)) > 0.3
        key_mask[:, 0] = True
        if case["key_mask"] == "empty_row":
            key_mask[1, :] = False  # batch row 1 attends nothing
    if case.get("query_mask"):
        query_mask = rng.random((B, tq)) > 0.25
    return q, k, v, key_mask, query_mask, d_out


def _forward_backward(mesh, key_mask, query_mask, causal, balance):
    """Ring attention's output and input gradients, compiled for one case."""

    @jax.jit
    def forward_backward(q, k, v, d_out):
        def attend(q, k, v):
            return ring.ring_attention(
                q,
                k,
                v,
                mesh=mesh,
                mask=AttentionMask(key_mask=key_mask, query_mask=query_mask, causal=causal),
                balance=balance,
                return_statistics=True,
            )

        out, pullback, statistics = jax.vjp(attend, q, k, v, has_aux=True)
        return out, pullback(d_out), statistics["logsumexp"]

    return forward_backward


def op_checks(mesh):
    report = {}
    for name, case in CASES.items():
        q, k, v, key_mask, query_mask, d_out = inputs(case)
        causal = case.get("causal", False)
        forward_backward = _forward_backward(
            mesh, key_mask, query_mask, causal, case.get("balance", "auto")
        )
        out, grads, lse = forward_backward(q, k, v, d_out)
        want_out, want_grads, want_lse = reference(q, k, v, key_mask, query_mask, causal, d_out)
        lse, finite = np.asarray(lse), np.isfinite(want_lse)
        report[name] = {
            "logsumexp": float(np.max(np.abs(lse[finite] - want_lse[finite]))),
            "no_key_rows": bool(np.array_equal(np.isneginf(lse), ~finite)),
            "output": float(np.max(np.abs(np.asarray(out) - want_out))),
            "gradients": [
                float(np.max(np.abs(np.asarray(g) - w)))
                for g, w in zip(grads, want_grads, strict=True)
            ],
            "finite": bool(all(np.isfinite(np.asarray(x)).all() for x in (out,) + tuple(grads))),
            "scale": float(np.max(np.abs(want_out))),
        }
    return report


def jaxpr_checks(mesh):
    q, k, v, key_mask, _, d_out = inputs(CASES["causal_padding"])

    def loss(q, k, v):
        mask = AttentionMask(key_mask=key_mask, causal=True)
        out = ring.ring_attention(q, k, v, mesh=mesh, mask=mask)
        return jnp.sum(out * d_out)

    forward = str(jax.make_jaxpr(lambda q, k, v: ring.ring_attention(q, k, v, mesh=mesh))(q, k, v))
    backward = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    return {
        "forward_has_shard_map": "shard_map" in forward,
        "forward_ppermutes": forward.count("ppermute"),
        "backward_ppermutes": backward.count("ppermute"),
        "backward_has_cond": "cond" in backward,
    }


def blocks_computed(mesh):
    """Tiles each device computed, counted on the devices.

    `{"full" | "causal" | "causal_contiguous": [tiles of device 0, 1, ...]}`;
    a zigzag tile is a (half-block x half-block) tile.
    """
    counts = {}
    original = ring._part_plan
    devices = mesh.shape["sequence"]

    def counted(part, q_shape, *rest):
        plan = original(part, q_shape, *rest)
        visited = sum(counts.sum() for _, counts, _ in plan.kinds())
        jax.debug.callback(
            lambda first, size, tiles: calls.append((int(first), int(size), int(tiles))),
            part.query_offset,
            q_shape[1],
            visited,
        )
        return plan

    ring._part_plan = counted
    try:
        for name, causal, balance in (
            ("full", False, "auto"),
            ("causal", True, "auto"),
            ("causal_contiguous", True, "contiguous"),
        ):
            calls = []
            q, k, v, *_ = inputs(CASES["plain"])
            out = jax.jit(
                functools.partial(
                    ring.ring_attention,
                    mesh=mesh,
                    mask=AttentionMask(causal=causal),
                    balance=balance,
                )
            )(q, k, v)
            jax.block_until_ready(out)
            jax.effects_barrier()
            per_device = [0] * devices
            for first, size, tiles in calls:
                block = first // size  # which block (or half-block) of the sequence
                if size * devices == q.shape[1]:
                    device = block
                else:  # zigzag: half-blocks i and 2N - 1 - i on device i
                    device = block if block < devices else 2 * devices - 1 - block
                per_device[device] += tiles
            counts[name] = per_device
    finally:
        ring._part_plan = original
    return counts


def layer_checks():
    """Our MultiHeadAttention with sequence_parallel vs the exact layer."""
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((1, 4), ("batch", "sequence"), devices)
    distribution = keras.distribution.ModelParallel(
        layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="batch"
    )
    rng = np.random.default_rng(1)
    x = rng.normal(size=(B, 16, 8)).astype("float32")
    mask = np.ones((B, 16), bool)
    mask[1, 11:] = False
    cotangent = rng.normal(size=(B, 16, 8)).astype("float32")
    exact = ka.MultiHeadAttention(4, 4, num_key_value_heads=2, memory_efficient=False)
    exact.build(x.shape, x.shape)
    call = dict(query_mask=mask, value_mask=mask, use_causal_mask=True)
    want = layer_gradients(exact, [x, x], cotangent, jit=True, **call)
    report = {"modified": modified_checks(mesh, distribution, x, mask, cotangent)}
    with distribution.scope():
        layer = ka.MultiHeadAttention(4, 4, num_key_value_heads=2, sequence_parallel="sequence")
        layer.build(x.shape, x.shape)
        layer.set_weights(exact.get_weights())
        ran = []
        original = ring.ring_attention

        def spy(*args, **kwargs):
            ran.append("ring")
            return original(*args, **kwargs)

        ring.ring_attention = spy
        try:
            got = layer_gradients(layer, [x, x], cotangent, jit=True, **call)
        finally:
            ring.ring_attention = original
        report["kernel"] = ran[0] if ran else None
        report["output"] = float(np.max(np.abs(got[0] - want[0])))
        report["input_gradients"] = max(
            float(np.max(np.abs(g - w))) for g, w in zip(got[1], want[1], strict=True)
        )
        report["weight_gradients"] = max(
            float(np.max(np.abs(g - w))) for g, w in zip(got[2], want[2], strict=True)
        )
        report["errors"] = {}
        for label, fn in {
            "indivisible": lambda: layer(x[:, :14], x[:, :14]),
            "attention_mask": lambda: layer(x, x, attention_mask=np.ones((B, 16, 16), bool)),
            "scores": lambda: layer(x, x, return_attention_scores=True),
            "unknown_axis": lambda: ka.MultiHeadAttention(2, 4, sequence_parallel="context")(x, x),
        }.items():
            try:
                fn()
                report["errors"][label] = None
            except ValueError as error:
                report["errors"][label] = str(error)
    try:
        ka.MultiHeadAttention(2, 4, sequence_parallel="sequence")(x, x)
        report["errors"]["no_distribution"] = None
    except ValueError as error:
        report["errors"]["no_distribution"] = str(error)
    return report


def modified_checks(mesh, distribution, x, mask, cotangent):
    """#36: every score modifier (learned sinks too) and the call-level rules
    (packed documents, a prefix per example, a `mask_mod`) on the ring,
    against the float64 NumPy reference of the same layer (random weights)."""
    from tests.attention_reference import SOFT_CAP
    from tests.attention_reference import mask_mod
    from tests.attention_reference import positional
    from tests.attention_reference import reference
    from tests.attention_reference import score_mod

    options = dict(
        logit_soft_cap=SOFT_CAP,
        alibi=True,
        score_mod=score_mod,
        attention_sinks=True,
        mask_mod=mask_mod,
        num_key_value_heads=2,
    )
    length = x.shape[1]
    documents = np.array([[0] * 5 + [1] * 11, [0] * 9 + [1] * 7], "int32")
    prefix = np.array([3, 6], "int32")
    window = dict(sliding_window=5, sink_tokens=2)  # #50: every rule on the ring
    calls = {
        "documents": ({}, dict(segment_ids=documents, use_causal_mask=True)),
        "prefix": ({}, dict(prefix_length=prefix)),
        "window": (window, dict(use_causal_mask=True)),
    }
    report = {}
    with distribution.scope():
        for name, (rules, call) in calls.items():
            layer = ka.MultiHeadAttention(4, 4, sequence_parallel="sequence", **options, **rules)
            layer.build(x.shape, x.shape)
            rng = np.random.default_rng(2)
            layer.set_weights([rng.normal(scale=0.7, size=w.shape) for w in layer.get_weights()])
            weights = {
                w.path.split("/", 1)[1]: np.asarray(w.value, np.float64) for w in layer.weights
            }
            ran = []
            original = ring.ring_attention

            def spy(*args, _original=original, _ran=ran, **kwargs):
                _ran.append("ring")
                return _original(*args, **kwargs)

            ring.ring_attention = spy
            try:
                got = layer_gradients(layer, [x], cotangent, jit=True, query_mask=mask, **call)
            finally:
                ring.ring_attention = original
            rows = np.arange(length)
            allowed = positional(
                rows,
                rows,
                True,
                rules.get("sliding_window"),
                sink_tokens=rules.get("sink_tokens"),
                prefix=prefix if name == "prefix" else None,
                mask_mod=True,
                batch=x.shape[0],
                heads=4,
            )
            allowed = allowed & mask[:, None, :, None] & mask[:, None, None, :]
            if name == "documents":
                allowed = allowed & (documents[:, None, :, None] == documents[:, None, None, :])
            x64 = x.astype(np.float64)
            want, _ = reference(weights, x64, x64, allowed, 4, 2, False, "all")
            report[name] = {
                "kernel": ran[0] if ran else None,
                "output": float(np.max(np.abs(got[0] - want))),
                "finite": bool(all(np.isfinite(g).all() for g in got[1] + got[2])),
            }
    return report


def main():
    import time

    mesh = Mesh(np.array(jax.devices()), ("sequence",))
    results = {"devices": len(jax.devices()), "seconds": {}}
    for name, check in (
        ("ops", lambda: op_checks(mesh)),
        ("jaxpr", lambda: jaxpr_checks(mesh)),
        ("blocks", lambda: blocks_computed(mesh)),
        ("layer", layer_checks),
    ):
        start = time.perf_counter()
        results[name] = check()
        results["seconds"][name] = time.perf_counter() - start
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
