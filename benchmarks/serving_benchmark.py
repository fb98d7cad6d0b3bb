"""Serving throughput of exported translators under TF Serving's v1 loader.

For each translator (a Seq2Seq GRU and a Transformer trained briefly on the
number-words task of the tests), exports a SavedModel, loads it with
`tf.compat.v1.saved_model.loader.load` in a `tf.compat.v1.Session` (the
loader TF Serving uses) and times `greedy` and `beam_search` (width 4) at
batch 1, 8 and 64 against `translate()` on the same batch: sentences per
second and p50/p99 latency per request.

Usage:
    python benchmarks/serving_benchmark.py [--repeats 20] [--quick]

`--quick` (the suite's smoke test) trains on fewer pairs for one epoch and
times batch 1 only; its figures mean nothing.
"""

import argparse
import os
import random
import sys
import tempfile
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def pairs(count, seed):
    rng = random.Random(seed)
    result = []
    for _ in range(count):
        digits = [rng.randrange(10) for _ in range(rng.randint(1, 5))]
        result.append((" ".join(WORDS[d] for d in digits), " ".join(str(d) for d in digits)))
    return result


def translators(pair_count=1200, epochs=3):
    import keras

    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.models import TransformerTranslator

    sources, targets = zip(*pairs(pair_count, 0), strict=True)
    common = dict(
        source_split="whitespace",
        target_split="whitespace",
        max_source_length=6,
        max_target_length=7,
    )
    keras.utils.set_random_seed(0)
    built = {
        "Seq2SeqTranslator (GRU 64)": Seq2SeqTranslator.from_texts(
            sources, targets, units=64, embedding_dim=32, **common
        ),
        "TransformerTranslator (2 layers, d 64)": TransformerTranslator.from_texts(
            sources,
            targets,
            num_layers=2,
            num_heads=4,
            hidden_dim=64,
            intermediate_dim=128,
            **common,
        ),
    }
    for translator in built.values():
        translator.compile(optimizer=keras.optimizers.Adam(5e-3))
        translator.fit(
            translator.make_dataset(sources, targets, 32, seed=0), epochs=epochs, verbose=0
        )
    return built


def timed_pair(first, second, repeats):
    """Latencies of two callables, alternating which runs first each repeat.

    The machine's load drifts; alternating the two in one loop exposes both
    to the same drift, and the per-repeat ratio first/second is what the
    comparison reports (median over repeats).
    """
    first(), second()  # warm up (traces, first-run allocations)
    times = ([], [])
    for repeat in range(repeats):
        order = (0, 1) if repeat % 2 == 0 else (1, 0)
        for index in order:
            function = (first, second)[index]
            start = time.perf_counter()
            function()
            times[index].append(time.perf_counter() - start)
    ratios = sorted(a / b for a, b in zip(*times, strict=True))
    return sorted(times[0]), sorted(times[1]), ratios


def percentile(values, q):
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: little training, batch 1 only"
    )
    args = parser.parse_args(argv)
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the ops, as TF Serving links them)

    from keras_attention.export import export_translator

    texts = [s for s, _ in pairs(64, 1)]
    rows = []
    built = translators(64, 1) if args.quick else translators()
    batches = (1,) if args.quick else (1, 8, 64)
    for name, translator in built.items():
        with tempfile.TemporaryDirectory() as scratch:
            path = export_translator(translator, os.path.join(scratch, "model"))
            graph = tf.Graph()
            session = tf.compat.v1.Session(graph=graph)
            with graph.as_default():
                meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
            # translate() runs eagerly, outside the served graph's context.
            for mode, width in (("greedy", 1), ("beam 4", 4)):
                signature = meta.signature_def["greedy" if width == 1 else "beam_search"]
                fetch = {k: v.name for k, v in signature.outputs.items()}
                for batch in batches:
                    feed = {signature.inputs["text"].name: np.array(texts[:batch], dtype=object)}
                    if width > 1:
                        feed[signature.inputs["beam_width"].name] = np.int32(width)
                    served, local, ratios = timed_pair(
                        lambda session=session, fetch=fetch, feed=feed: session.run(fetch, feed),
                        lambda translator=translator, batch=batch, width=width: (
                            translator.translate(texts[:batch], beam_width=width)
                        ),
                        args.repeats,
                    )
                    rows.append((name, mode, batch, served, local, ratios))
                    print(
                        f"{name:40} {mode:7} batch {batch:3}: served "
                        f"{batch / np.median(served):8.1f}/s, translate() "
                        f"{batch / np.median(local):8.1f}/s, served/translate "
                        f"time {np.median(ratios):.2f}",
                        flush=True,
                    )
            session.close()
    print(
        "\n| translator | decoding | batch | served sentences/s | served p50 ms "
        "| served p99 ms | translate() sentences/s | translate() p50 ms "
        "| served/translate time (median of paired repeats) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, mode, batch, served, local, ratios in rows:
        print(
            f"| {name} | {mode} | {batch} | {batch / np.median(served):.1f} | "
            f"{1e3 * percentile(served, 0.5):.1f} | "
            f"{1e3 * percentile(served, 0.99):.1f} | "
            f"{batch / np.median(local):.1f} | {1e3 * percentile(local, 0.5):.1f} | "
            f"{np.median(ratios):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
