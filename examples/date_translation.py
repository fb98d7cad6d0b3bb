"""Translate human-readable dates (English and French) to ISO 8601.

What `make demo` runs. The script generates dates in many formats
("mardi 5 mars 2019", "Tue, Mar 5 2019", "5/3/19", ...), trains a
`Seq2SeqTranslator` (bidirectional GRU encoder, GRU decoder with attention)
to write them as "2019-03-05", and then:

1. prints the exact-match accuracy on held-out dates (dates never seen in
   training, in random formats),
2. prints a few translations with a text chart of their alignment,
3. writes an HTML alignment heatmap to `build/demo/alignment.html`,
4. exports the translator as a SavedModel (`build/demo/saved_model`), checks
   it is servable by TF Serving (`check_servable`), and translates again from
   the reloaded SavedModel in a fresh Python process.

Numeric dates are day first (`5/3/19` is 5 March 2019); two-digit years are
1950-2049 (`49` is 2049, `50` is 1950).

Usage:
    python examples/date_translation.py [--attention additive|luong|general|concat|low_rank]
    python examples/date_translation.py --train-size 2000 --epochs 1   # quick run
"""

import argparse
import datetime
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

EN_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
EN_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FR_MONTHS = [
    "janvier",
    "février",
    "mars",
    "avril",
    "mai",
    "juin",
    "juillet",
    "août",
    "septembre",
    "octobre",
    "novembre",
    "décembre",
]
FR_DAYS = ["lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche"]
FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)


def _ordinal(day):
    if 10 <= day % 100 <= 20:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th') }"


def _fr_day(day):
    return "1er" if day == 1 else str(day)


def date_formats(date):
    """Every human-readable rendering of `date` the data set uses."""
    d, m, y = date.day, date.month, date.year
    yy = f"{y % 100:02d}"
    en_m, en_w = EN_MONTHS[m - 1], EN_DAYS[date.weekday()]
    fr_m, fr_w = FR_MONTHS[m - 1], FR_DAYS[date.weekday()]
    return [
        # English
        f"{en_w[:3]}, {en_m[:3]} {d} {y}",
        f"{en_w}, {en_m} {d}, {y}",
        f"{en_m} {d}, {y}",
        f"{en_m[:3]} {d}, {y}",
        f"{d} {en_m} {y}",
        f"{d} {en_m[:3]} {y}",
        f"{en_m} {_ordinal(d)}, {y}",
        f"the {_ordinal(d)} of {en_m} {y}",
        f"{en_w} {d} {en_m} {y}",
        f"{en_m[:3]} {d} '{yy}",
        # French
        f"{fr_w} {_fr_day(d)} {fr_m} {y}",
        f"{_fr_day(d)} {fr_m} {y}",
        f"le {_fr_day(d)} {fr_m} {y}",
        f"le {fr_w} {_fr_day(d)} {fr_m} {y}",
        f"{fr_w[:3]}. {d} {fr_m[:4].rstrip('.')}. {y}",
        f"{d} {fr_m} {yy}",
        # Numeric, day first
        f"{d}/{m}/{yy}",
        f"{d:02d}/{m:02d}/{y}",
        f"{d}/{m}/{y}",
        f"{d}-{m}-{y}",
        f"{d:02d}.{m:02d}.{y}",
        f"{d:02d}.{m:02d}.{yy}",
        f"{y}/{m:02d}/{d:02d}",
        f"{y}{m:02d}{d:02d}",
    ]


def render(date, rng):
    """A random rendering of `date`, sometimes in capitals."""
    text = rng.choice(date_formats(date))
    casing = rng.random()
    if casing < 0.1:
        text = text.upper()
    elif casing < 0.2:
        text = text.title()
    return text


def make_dates(train_size, test_size, seed=0):
    """Training and held-out (source, ISO) pairs; no held-out date is trained on."""
    rng = random.Random(seed)
    days = (LAST_DATE - FIRST_DATE).days + 1
    all_dates = [FIRST_DATE + datetime.timedelta(days=i) for i in range(days)]
    rng.shuffle(all_dates)
    test_dates, train_dates = all_dates[:test_size], all_dates[test_size:]
    train = [
        (render(d, rng), d.isoformat())
        for d in (rng.choice(train_dates) for _ in range(train_size))
    ]
    test = [(render(d, rng), d.isoformat()) for d in test_dates]
    return train, test


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--attention",
        default="additive",
        choices=["additive", "luong", "general", "concat", "low_rank"],
    )
    parser.add_argument("--rnn", default="gru", choices=["gru", "lstm"])
    parser.add_argument("--train-size", type=int, default=30000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--embedding-dim", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument(
        "--examples", type=int, default=3, help="translations printed with their alignment chart"
    )
    parser.add_argument("--output-dir", default=os.path.join("build", "demo"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--min-accuracy",
        type=float,
        default=0.99,
        help="exit with status 2 below this held-out accuracy",
    )
    return parser.parse_args(argv)


RELOAD_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["keras_attention"] = None  # prove it is not needed
    import tensorflow as tf
    import tensorflow_text  # registers the tokenizer ops; nothing else needed
    model = tf.saved_model.load(sys.argv[1])
    texts = tf.constant(sys.argv[2:])
    outputs = model.signatures["serving_default"](text=texts)
    for source, target in zip(sys.argv[2:], outputs["translation"].numpy()):
        print(f"  {source!r:32} -> {target.decode()}")
""")


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    import keras

    from keras_attention.export import check_servable
    from keras_attention.export import export_translator
    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.models.alignment_chart import alignment_html
    from keras_attention.models.alignment_chart import alignment_text

    keras.utils.set_random_seed(args.seed)
    train, test = make_dates(args.train_size, args.test_size, args.seed)
    sources, targets = zip(*train, strict=True)
    print(f"{len(train)} training dates, e.g. {sources[0]!r} -> {targets[0]!r}")

    translator = Seq2SeqTranslator.from_texts(
        sources,
        targets,
        max_source_length=40,
        max_target_length=11,  # "yyyy-mm-dd" and <end>
        embedding_dim=args.embedding_dim,
        units=args.units,
        rnn=args.rnn,
        attention=args.attention,
        seed=args.seed,
    )
    steps = args.epochs * -(-len(train) // args.batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(
        args.learning_rate, decay_steps=steps, alpha=0.05
    )
    translator.compile(optimizer=keras.optimizers.Adam(schedule, clipnorm=1.0))
    dataset = translator.make_dataset(sources, targets, batch_size=args.batch_size, seed=args.seed)
    fit_start = time.time()
    # make_dataset already shuffles each epoch; fit must not try to.
    translator.fit(dataset, epochs=args.epochs, verbose=2, shuffle=False)
    print(
        f"trained in {time.time() - fit_start:.0f} s "
        f"({args.attention} attention, {translator.count_params()} weights)"
    )

    test_sources = [s for s, _ in test]
    results = translator.translate(test_sources)
    correct = sum(r.text == t for r, (_, t) in zip(results, test, strict=True))
    accuracy = correct / len(test)
    print(f"held-out exact match: {correct}/{len(test)} = {accuracy:.1%}")
    wrong = [(s, r.text, t) for r, (s, t) in zip(results, test, strict=True) if r.text != t]
    for source, got, want in wrong[:5]:
        print(f"  wrong: {source!r} -> {got!r} (expected {want!r})")

    showcase = ["mardi 5 mars 2019", "Tue, Mar 5 2019", "5/3/19"][: args.examples]
    showcase += test_sources[: max(0, args.examples - len(showcase))]
    shown = translator.translate(showcase, beam_width=3)
    for translation in shown:
        print(
            f"\n{''.join(translation.source_tokens)!r} -> {translation.text!r}"
            f" (beam 3, log-prob {translation.score:.3f})"
        )
        print(alignment_text(translation))

    os.makedirs(args.output_dir, exist_ok=True)
    html_path = os.path.join(args.output_dir, "alignment.html")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write(alignment_html(shown, title=f"Date translation ({args.attention})"))
    print(f"\nalignment heatmap: {html_path}")

    export_path = os.path.join(args.output_dir, "saved_model")
    export_translator(translator, export_path)
    print(f"SavedModel: {export_path}")
    report = check_servable(export_path)
    print(report.summary())
    if not report.ok:
        return 1

    print(
        "translated again by the SavedModel in a fresh process (tensorflow + tensorflow_text only):"
    )
    env = dict(os.environ, PYTHONPATH="")
    with tempfile.TemporaryDirectory() as scratch:  # a cwd without the repo
        reload = subprocess.run(
            [sys.executable, "-c", RELOAD_SCRIPT, os.path.abspath(export_path), *showcase],
            capture_output=True,
            text=True,
            env=env,
            cwd=scratch,
        )
    print(reload.stdout.rstrip())
    if reload.returncode != 0:
        print(reload.stderr[-2000:])
        return 1
    print(f"\ndemo finished in {time.time() - start:.0f} s")
    if accuracy < args.min_accuracy:
        print(f"held-out accuracy {accuracy:.1%} is below --min-accuracy {args.min_accuracy:.1%}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
