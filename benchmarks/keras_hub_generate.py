"""KerasHub's cached `generate` against the same causal LM on our attention (#51).

For each family (Gemma, Llama, and Gemma 3 on request) a tiny causal LM is
built twice with the same random weights: KerasHub's, and a copy whose
attention layers `replace_keras_hub_attention` swapped for ours. Both run
`generate` (greedy, batch 2, a 16-token prompt then `--new-tokens` new ones,
no stop token) in ONE process: the first call of each traces and compiles
(XLA on TensorFlow, `jax.jit` on JAX) and is not timed; then the calls
alternate, theirs then ours, `--repeats` times, and the medians are printed
with the ratio ours / KerasHub. The tokens of every call must be KerasHub's
(the script stops otherwise).

`--cache-length L` measures memory instead: each LM's `generate` on a buffer
of `L` tokens stops after one step (every token a stop token), and the bytes
of the cache its `_build_cache` hands the sampler (the cache the decoding
loop carries) are printed, KerasHub's and ours. The windowed families
(`gemma2`: Gemma with local even layers; `mistral`; `gpt_oss`: local odd
layers; `gemma3`: local layers) have windows of `--window` keys (64), so
after the swap their local layers carry rings of that many slots (GPT-OSS
one more).

    KERAS_BACKEND=tensorflow python benchmarks/keras_hub_generate.py
    KERAS_BACKEND=jax python benchmarks/keras_hub_generate.py --families gemma llama gemma3
    KERAS_BACKEND=jax python benchmarks/keras_hub_generate.py --cache-length 4096 \
        --families gemma2 mistral gpt_oss gemma3
"""

import argparse
import os
import statistics
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")

import keras_attention  # noqa: E402,F401  (first: a quiet TensorFlow start)

# isort: split
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention.interchange import keras_hub_models  # noqa: E402

FAMILIES = ("gemma", "llama", "gemma3", "gemma2", "mistral", "gpt_oss")
PROMPT = 16
WINDOW = 64


def _backbone(family, layers, hidden, vocabulary, window=WINDOW):
    import keras_hub

    common = dict(
        vocabulary_size=vocabulary,
        num_layers=layers,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=hidden,
        intermediate_dim=2 * hidden,
    )
    models = keras_hub.models
    if family == "gemma":
        return models.GemmaBackbone(head_dim=hidden // 4, **common), models.GemmaCausalLM
    if family == "llama":
        return models.LlamaBackbone(**common), models.LlamaCausalLM
    if family == "gemma3":
        backbone = models.Gemma3Backbone(
            head_dim=hidden // 4,
            image_size=16,
            vision_encoder=None,
            use_sliding_window_attention=True,
            sliding_window_size=window,
            **common,
        )
        return backbone, models.Gemma3CausalLM
    if family == "gemma2":
        backbone = models.GemmaBackbone(
            head_dim=hidden // 4,
            use_sliding_window_attention=True,
            sliding_window_size=window,
            **common,
        )
        return backbone, models.GemmaCausalLM
    if family == "mistral":
        return models.MistralBackbone(sliding_window=window, **common), models.MistralCausalLM
    if family == "gpt_oss":
        # GPT-OSS's window keeps `window + 1` keys.
        backbone = models.GptOssBackbone(
            num_experts=2, top_k=2, head_dim=hidden // 4, sliding_window=window, **common
        )
        return backbone, models.GptOssCausalLM
    raise ValueError(f"keras_hub_generate: unknown family. Received: family={family!r}")


def build(family, layers=4, hidden=64, vocabulary=256, seed=0, window=WINDOW):
    """`(theirs, ours)`: two causal LMs with the same random weights, ours
    with every attention layer swapped for ours."""
    lms = []
    weights = None
    for _ in range(2):
        backbone, causal_lm = _backbone(family, layers, hidden, vocabulary, window)
        lm = causal_lm(backbone=backbone, preprocessor=None)
        lm.compile(sampler="greedy")
        if weights is None:
            rng = np.random.default_rng(seed)
            weights = [rng.normal(scale=0.3, size=w.shape) for w in lm.get_weights()]
        lm.set_weights(weights)
        lms.append(lm)
    theirs, ours = lms
    replaced = keras_hub_models.replace_keras_hub_attention(ours)
    if replaced != layers:
        raise RuntimeError(f"{family}: {replaced} of {layers} attention layers swapped")
    return theirs, ours


def prompt(family, batch, new_tokens, vocabulary=256, seed=1):
    """`batch` prompts of `PROMPT` tokens and room for `new_tokens` more
    (Gemma 3's with no images: its `generate` returns what it is given)."""
    ids = np.zeros((batch, PROMPT + new_tokens), "int32")
    ids[:, :PROMPT] = np.random.default_rng(seed).integers(1, vocabulary, size=(batch, PROMPT))
    inputs = {"token_ids": ids, "padding_mask": ids > 0}
    if family == "gemma3":
        inputs["images"] = np.zeros((batch, 0, 16, 16, 3), "float32")
    return inputs


def _generate(lm, inputs):
    """`(wall seconds, CPU seconds of this process, tokens)` of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = np.asarray(lm.generate(inputs, stop_token_ids=None)["token_ids"])
    return time.perf_counter() - wall, time.process_time() - cpu, tokens


def compare(family, layers=4, hidden=64, batch=2, new_tokens=240, repeats=5, window=WINDOW):
    """Median `generate` seconds (wall and CPU) of KerasHub's LM and ours,
    alternated in this process after one untimed (compiling) call each;
    raises if any call's tokens differ from KerasHub's."""
    theirs, ours = build(family, layers, hidden, window=window)
    inputs = prompt(family, batch, new_tokens)
    *_, want = _generate(theirs, inputs)
    times = {"keras_hub": ([], []), "ours": ([], [])}
    for repeat in range(repeats + 1):
        for name, lm in (("keras_hub", theirs), ("ours", ours)):
            wall, cpu, got = _generate(lm, inputs)
            if not np.array_equal(got, want):
                raise RuntimeError(f"{family}: {name}'s tokens differ from KerasHub's first call")
            if repeat:  # the first round: ours compiles (theirs did above)
                times[name][0].append(wall)
                times[name][1].append(cpu)
    row = {"family": family, "tokens": want}
    for name, (wall, cpu) in times.items():
        row[f"{name}_s"] = statistics.median(wall)
        row[f"{name}_cpu_s"] = statistics.median(cpu)
    row["ratio"] = row["ours_s"] / row["keras_hub_s"]
    row["cpu_ratio"] = row["ours_cpu_s"] / row["keras_hub_cpu_s"]
    return row


def _record_cache_bytes(lm):
    """A list that gets the bytes of each cache `lm._build_cache` returns."""
    recorded = []
    build_cache = lm._build_cache

    def spy(*args):
        hidden, cache = build_cache(*args)
        parts = keras.tree.flatten(cache)
        recorded.append(
            sum(
                int(np.prod(part.shape))
                * np.dtype(keras.backend.standardize_dtype(part.dtype)).itemsize
                for part in parts
            )
        )
        return hidden, cache

    object.__setattr__(lm, "_build_cache", spy)
    return recorded


def cache_bytes(family, cache_length, layers=4, hidden=64, batch=2, vocabulary=256, window=WINDOW):
    """The bytes of the cache KerasHub's `generate` and ours carry through
    their decoding loop at a buffer of `cache_length` tokens (one step:
    every token stops), and whether the two gave the same tokens."""
    theirs, ours = build(family, layers, hidden, vocabulary, window=window)
    inputs = prompt(family, batch, cache_length - PROMPT, vocabulary)
    row = {"family": family, "cache_length": cache_length}
    tokens = []
    for name, lm in (("keras_hub", theirs), ("ours", ours)):
        recorded = _record_cache_bytes(lm)
        output = lm.generate(inputs, stop_token_ids=tuple(range(vocabulary)))
        tokens.append(np.asarray(output["token_ids"]))
        row[f"{name}_bytes"] = recorded[-1]
    row["same_tokens"] = bool(np.array_equal(*tokens))
    row["ratio"] = row["ours_bytes"] / row["keras_hub_bytes"]
    return row


def main_cache_bytes(args):
    print(
        f"backend {keras.backend.backend()}: {args.layers} layers, hidden {args.hidden}, "
        f"batch {args.batch}, windows of {args.window} keys, a buffer of {args.cache_length} "
        "tokens: bytes of the cache the decoding loop carries"
    )
    print("| family | KerasHub bytes | ours bytes | ours / KerasHub | same tokens |")
    print("| --- | ---: | ---: | ---: | --- |")
    rows = []
    for family in args.families:
        row = cache_bytes(
            family, args.cache_length, args.layers, args.hidden, args.batch, window=args.window
        )
        rows.append(row)
        print(
            f"| {family} | {row['keras_hub_bytes']:,} | {row['ours_bytes']:,} | "
            f"{row['ratio']:.3f} | {row['same_tokens']} |",
            flush=True,
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["gemma", "llama"], choices=FAMILIES)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache-length", type=int, default=None)
    parser.add_argument("--window", type=int, default=WINDOW)
    args = parser.parse_args(argv)
    if args.cache_length is not None:
        return main_cache_bytes(args)
    print(
        f"backend {keras.backend.backend()}: {args.layers} layers, hidden {args.hidden}, "
        f"batch {args.batch}, {PROMPT}-token prompt + {args.new_tokens} new tokens, "
        f"greedy, windows of {args.window}; median of {args.repeats} alternated calls "
        "after the compiling one"
    )
    print("| family | KerasHub s | ours s | ours / KerasHub | CPU s: KerasHub | ours | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for family in args.families:
        row = compare(
            family,
            args.layers,
            args.hidden,
            args.batch,
            args.new_tokens,
            args.repeats,
            window=args.window,
        )
        rows.append(row)
        print(
            f"| {family} | {row['keras_hub_s']:.3f} | {row['ours_s']:.3f} | {row['ratio']:.2f}x "
            f"| {row['keras_hub_cpu_s']:.3f} | {row['ours_cpu_s']:.3f} | {row['cpu_ratio']:.2f}x |",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
