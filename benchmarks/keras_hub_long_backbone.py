"""A swapped KerasHub backbone and causal LM at 32768 tokens (#51 item 3).

A tiny Gemma 2-style configuration (2 blocks: a local layer with a 512-key
window, then a global one; 4 query heads of 16, 2 key/value heads, hidden
64, vocabulary 256), random weights, batch 1, float32:

- `ours`: the backbone after `replace_keras_hub_attention(lm,
  memory_efficient=True)` (the blockwise kernel at every length: `"auto"`
  materialises the logits while they fit the memory budget), one
  compiled forward pass (`predict_on_batch`) over `L` tokens, padding mask
  all ones. The decoder blocks hand causal and padding to our layer as rules
  (no `(B, L, L)` mask).
- `ours_generate`: the swapped causal LM's `generate` on a prompt of
  `L - 1` tokens with `max_length=L`: a cached prefill over `L` slots, then
  one step.
- `ours_decode` / `theirs_decode` (#51's window caches): a tiny Mistral
  (2 layers, every one with a `--window`-key sliding window; otherwise the
  Gemma sizes above) generates `--new-tokens` after a prompt of
  `L - new_tokens`, `max_length=L`. Ours decodes from window-sized ring
  caches on every layer (the swap's `generate`), KerasHub's from caches
  of `L` slots. Reported: the decoding rate, `(new_tokens - 1)` over the
  difference between this call and the same compiled call with one new
  token (the prefill and one step); `keras_hub_generate.py --cache-bytes`
  measures the carried caches' bytes.
- `theirs` / `theirs_generate`: the same calls on KerasHub's own model,
  which builds the dense mask and logits, at each of `--their-lengths`, in a
  process capped at `--cap-gib` of address space; the largest length that
  fits is the row to read.

Each row runs in its own process (a fresh `ru_maxrss`): the call traced and
run once (`first_s`), then timed once more (`seconds`); the peak RSS is the
process's. TensorFlow or JAX by KERAS_BACKEND.

    PYTHONPATH=$PWD KERAS_BACKEND=tensorflow python benchmarks/keras_hub_long_backbone.py
    PYTHONPATH=$PWD KERAS_BACKEND=tensorflow python benchmarks/keras_hub_long_backbone.py \\
        --lengths 8192,16384,32768 --their-lengths 4096,8192,16384 --cap-gib 10
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

VOCABULARY, WINDOW = 256, 512


def _lm(family, **window):
    """A tiny causal LM of KerasHub's `family` ("Gemma" or "Mistral") with
    random weights and the greedy sampler; `window`: its window arguments."""
    import keras_hub
    import numpy as np

    models = keras_hub.models
    backbone = getattr(models, f"{family}Backbone")(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        head_dim=16,
        **window,
    )
    rng = np.random.default_rng(0)
    backbone.set_weights([rng.normal(scale=0.05, size=w.shape) for w in backbone.get_weights()])
    lm = getattr(models, f"{family}CausalLM")(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    return lm


def decode(kind, length, new_tokens, window):
    """The decoding rate of `generate` after a long prompt (see the module
    docstring)."""
    import numpy as np

    from keras_attention.interchange import keras_hub_models

    lm = _lm("Mistral", sliding_window=window)
    if kind.startswith("ours"):
        keras_hub_models.replace_keras_hub_attention(lm, memory_efficient=True)
    ids = np.random.default_rng(1).integers(1, VOCABULARY, size=(1, length)).astype("int32")

    def call(new):
        padding = np.ones((1, length), bool)
        padding[:, length - new :] = False
        inputs = {"token_ids": ids, "padding_mask": padding}
        start = time.perf_counter()
        out = lm.generate(inputs, max_length=length, stop_token_ids=None)["token_ids"]
        np.asarray(out)
        return time.perf_counter() - start

    first = call(new_tokens)  # traces and compiles
    one = min(call(1) for _ in range(2))
    many = min(call(new_tokens) for _ in range(2))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(
        kind=kind,
        length=length,
        new_tokens=new_tokens,
        window=window,
        decode_tokens_per_s=round((new_tokens - 1) / max(many - one, 1e-9), 1),
        seconds=round(many, 2),
        first_s=round(first, 2),
        peak_rss_mib=round(peak),
    )


def _model():
    # Gemma 2's layout: block 0 local, block 1 global.
    return _lm("Gemma", use_sliding_window_attention=True, sliding_window_size=WINDOW)


def run(kind, length):
    import numpy as np

    from keras_attention.interchange import keras_hub_models

    lm = _model()
    if kind.startswith("ours"):
        keras_hub_models.replace_keras_hub_attention(lm, memory_efficient=True)
    ids = np.random.default_rng(1).integers(1, VOCABULARY, size=(1, length)).astype("int32")
    if kind.endswith("generate"):
        padding = np.ones((1, length), bool)
        padding[:, -1] = False  # a prompt of L - 1 tokens: one step after the prefill
        inputs = {"token_ids": ids, "padding_mask": padding}

        def call():
            return lm.generate(inputs, max_length=length, stop_token_ids=None)["token_ids"]

    else:
        inputs = {"token_ids": ids, "padding_mask": np.ones((1, length), "int32")}

        def call():
            return lm.backbone.predict_on_batch(inputs)

    start = time.perf_counter()
    out = np.asarray(call())
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = np.asarray(call())
    seconds = time.perf_counter() - start
    finite = bool(np.all(np.isfinite(out))) if out.dtype.kind == "f" else True
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(
        kind=kind,
        length=length,
        seconds=round(seconds, 2),
        first_s=round(first, 2),
        peak_rss_mib=round(peak),
        finite=finite,
    )


def in_child(kind, length, cap_gib=None, extra=()):
    """`run`'s row from a fresh process, or the reason it died."""
    extra = list(extra)

    def limit():
        if cap_gib:
            cap = int(cap_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(length)] + extra,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        env=os.environ,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
    return dict(kind=kind, length=length, failed=f"rc {done.returncode}: {tail}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192,16384,32768")
    parser.add_argument("--their-lengths", default="4096,8192,16384")
    parser.add_argument("--cap-gib", type=float, default=10.0)
    parser.add_argument("--kinds", default="ours,ours_generate,theirs,theirs_generate")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        kind, length = args.child
        if kind.endswith("decode"):
            row = decode(kind, int(length), args.new_tokens, args.window)
        else:
            row = run(kind, int(length))
        print("RESULT " + json.dumps(row), flush=True)
        return
    import keras

    for kind in args.kinds.split(","):
        ours = kind.startswith("ours")
        lengths = args.lengths if ours else args.their_lengths
        for length in (int(n) for n in lengths.split(",")):
            extra = ["--new-tokens", str(args.new_tokens), "--window", str(args.window)]
            row = in_child(kind, length, None if ours else args.cap_gib, extra)
            print(json.dumps(dict(backend=keras.backend.backend(), **row)), flush=True)


if __name__ == "__main__":
    main()
