"""French to English phrases with a Transformer: alignments that cross.

A small French grammar is generated here: noun phrases put the adjective
after the noun ("le chat noir" -> "the black cat"), so the alignment is not
monotonic, and "a m' entarté" becomes five English words ("hit me with a
pie", the seed lecture's example of one-to-many alignment). A
`TransformerTranslator` learns it; the script prints the held-out exact-match
accuracy, the cross-attention of the last decoder layer (averaged over heads)
as a text chart, and writes an HTML heatmap to `build/phrases/`. It then
exports the translator as a SavedModel (`build/phrases/saved_model`), checks
that TF Serving can serve it (`check_servable`), and translates the showcase
again with the SavedModel in a fresh process without keras_attention.

With `--split wordpiece` source and target are cut into subwords
(tensorflow-text's `FastWordpieceTokenizer`, vocabulary learned from the
training phrases), so unseen inflections such as "grises" still tokenize
("grise", "##s"); the charts merge the subwords back into words.

Usage:
    python examples/phrase_translation.py [--train-size 6000 --epochs 8]
    python examples/phrase_translation.py --split wordpiece
"""

import argparse
import os
import random
import sys
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# French noun -> (English noun, grammatical gender)
NOUNS = {
    "chat": ("cat", "m"),
    "chien": ("dog", "m"),
    "lapin": ("rabbit", "m"),
    "garçon": ("boy", "m"),
    "souris": ("mouse", "f"),
    "fille": ("girl", "f"),
    "voiture": ("car", "f"),
    "maison": ("house", "f"),
}
# English adjective -> (masculine, feminine); all follow the noun in French.
ADJECTIVES = {
    "black": ("noir", "noire"),
    "white": ("blanc", "blanche"),
    "green": ("vert", "verte"),
    "grey": ("gris", "grise"),
    "red": ("rouge", "rouge"),
    "happy": ("content", "contente"),
}
VERBS = {"mange": "eats", "voit": "sees", "aime": "loves", "suit": "follows"}
PRONOUNS = {"il": "he", "elle": "she"}


def noun_phrase(rng):
    noun = rng.choice(sorted(NOUNS))
    english, gender = NOUNS[noun]
    definite = rng.random() < 0.6
    french = [
        ("le" if gender == "m" else "la") if definite else ("un" if gender == "m" else "une"),
        noun,
    ]
    english_words = ["the" if definite else "a"]
    if rng.random() < 0.7:
        adjective = rng.choice(sorted(ADJECTIVES))
        french.append(ADJECTIVES[adjective][0 if gender == "m" else 1])
        english_words.append(adjective)
    english_words.append(english)
    return french, english_words


def sentence(rng):
    """One (French, English) pair."""
    if rng.random() < 0.2:
        subject = rng.choice(sorted(PRONOUNS))
        french, english = [subject], [PRONOUNS[subject]]
    else:
        french, english = noun_phrase(rng)
    if rng.random() < 0.25:
        # "il a m' entarté": one French verb, five English words.
        return (
            " ".join(french + ["a", "m'", "entarté"]),
            " ".join(english + ["hit", "me", "with", "a", "pie"]),
        )
    verb = rng.choice(sorted(VERBS))
    object_french, object_english = noun_phrase(rng)
    return (
        " ".join(french + [verb] + object_french),
        " ".join(english + [VERBS[verb]] + object_english),
    )


def make_pairs(train_size, test_size, seed=0):
    """Training pairs and held-out pairs whose sentences are not trained on."""
    rng = random.Random(seed)
    seen, train, test = set(), [], []
    while len(test) < test_size:
        pair = sentence(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            test.append(pair)
    seen_in_test = seen
    while len(train) < train_size:
        pair = sentence(rng)
        if pair[0] not in seen_in_test:
            train.append(pair)
    return train, test


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--test-size", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--output-dir", default=os.path.join("build", "phrases"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=("whitespace", "wordpiece"), default="whitespace")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    import keras
    import numpy as np

    from keras_attention.export import check_servable
    from keras_attention.export import export_translator
    from keras_attention.export.check import run_in_serving_process
    from keras_attention.models import TransformerTranslator
    from keras_attention.models.alignment_chart import alignment_html
    from keras_attention.models.alignment_chart import alignment_text
    from keras_attention.models.alignment_chart import merge_subwords

    keras.utils.set_random_seed(args.seed)
    train, test = make_pairs(args.train_size, args.test_size, args.seed)
    sources, targets = zip(*train, strict=True)
    print(f"{len(train)} training phrases, e.g. {sources[0]!r} -> {targets[0]!r}")
    translator = TransformerTranslator.from_texts(
        sources,
        targets,
        source_split=args.split,
        target_split=args.split,
        max_source_length=24 if args.split == "wordpiece" else 12,
        max_target_length=24 if args.split == "wordpiece" else 14,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        hidden_dim=args.hidden_dim,
        intermediate_dim=2 * args.hidden_dim,
        seed=args.seed,
    )
    steps = args.epochs * -(-len(train) // args.batch_size)
    translator.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.CosineDecay(2e-3, steps, alpha=0.05), clipnorm=1.0
        )
    )
    translator.fit(
        translator.make_dataset(sources, targets, args.batch_size, seed=args.seed),
        epochs=args.epochs,
        verbose=2,
    )
    results = translator.translate([s for s, _ in test])
    correct = sum(r.text == t for r, (_, t) in zip(results, test, strict=True))
    print(f"held-out exact match: {correct}/{len(test)} = {correct / len(test):.1%}")

    showcase = [
        "le chat noir mange la souris grise",
        "il a m' entarté",
        "une fille contente voit un lapin vert",
    ]
    translations = translator.translate(showcase)
    # Subwords back into words for the charts (a no-op for whitespace).
    shown = [merge_subwords(t) for t in translations]
    for translation in shown:
        print(f"\n{' '.join(translation.source_tokens)!r} -> {translation.text!r}")
        # Last decoder layer, mean over heads (alignment_text's default).
        print(alignment_text(translation))
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, "alignment.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(alignment_html(shown, title="French to English (last layer, mean over heads)"))
    print(f"\nalignment heatmap: {path}")

    export_path = os.path.join(args.output_dir, "saved_model")
    export_translator(translator, export_path)
    print(f"SavedModel: {export_path}")
    report = check_servable(export_path)
    print(report.summary())
    if not report.ok:
        return 1
    _, served = run_in_serving_process(export_path, feed={"text": np.array(showcase, dtype=object)})
    print(
        "translated again by the SavedModel in a fresh process (tensorflow + tensorflow_text only):"
    )
    for source, target, expected in zip(showcase, served["translation"], translations, strict=True):
        print(f"  {source!r:42} -> {target.decode()}")
        if target.decode() != expected.text:
            print(f"  differs from translate(): {expected.text!r}")
            return 1
    print(f"finished in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
