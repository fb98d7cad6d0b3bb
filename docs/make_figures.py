"""Regenerates the README's and the guides' figures with the library itself.

    python docs/make_figures.py          # or: make figures

1. A screenshot of each widget (DecodingStepper, AttentionExplorer,
   LiveAttention): the widget is written by `keras_attention.widgets.export_html`
   and opened from disk in headless chromium (Playwright driving the system
   chromium, no browser download), then saved as a small palette PNG in
   docs/figures/.
2. benchmarks/long_sequence.png redrawn from benchmarks/long_sequence.json
   (`long_sequence_benchmark.py --replot`; rerun the benchmark itself for new
   numbers, see benchmarks/RESULTS.md).

The translator is trained here for a few seconds on number words -> digits,
so the stepper shows a real, learned alignment. Takes about a minute.
"""

import os
import subprocess
import sys
import tempfile

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "figures")
MAX_BYTES = 150_000
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def number_pairs(count, rng):
    pairs = []
    for _ in range(count):
        digits = [int(d) for d in rng.integers(0, 10, size=rng.integers(1, 6))]
        pairs.append((" ".join(WORDS[d] for d in digits), " ".join(map(str, digits))))
    return pairs


def decoding_stepper():
    import keras
    import numpy as np

    from keras_attention.models import Seq2SeqTranslator
    from keras_attention.widgets import DecodingStepper

    keras.utils.set_random_seed(1)
    sources, targets = zip(*number_pairs(1200, np.random.default_rng(1)), strict=True)
    translator = Seq2SeqTranslator.from_texts(
        sources,
        targets,
        source_split="whitespace",
        target_split="whitespace",
        max_source_length=6,
        max_target_length=7,
        embedding_dim=16,
        units=32,
        seed=1,
    )
    translator.compile(optimizer=keras.optimizers.Adam(1e-2))
    translator.fit(
        translator.make_dataset(sources, targets, batch_size=32, seed=1), epochs=6, verbose=0
    )
    stepper = DecodingStepper(translator, "three one four one five", top_k=4)
    for _ in range(3):
        stepper.next_token()
    return stepper


def attention_explorer():
    import keras
    import numpy as np

    import keras_attention
    from keras_attention.widgets import AttentionExplorer

    keras.utils.set_random_seed(0)
    tokens = ["the", "black", "cat", "sat", "on", "the", "warm", "mat"]
    inputs = keras.Input((len(tokens), 16))
    x = keras_attention.MultiHeadAttention(4, 4, name="self_attention")(inputs)
    model = keras.Model(inputs, keras_attention.LuongAttention(name="luong")(x))
    sample = np.random.default_rng(0).normal(size=(1, len(tokens), 16)).astype("float32")
    return AttentionExplorer(model, sample, query_tokens=tokens)


def live_attention():
    import keras
    import numpy as np

    import keras_attention
    from keras_attention.widgets import LiveAttention

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 4)),
            keras_attention.LuongAttention(score="general", name="attention"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    x = np.random.default_rng(0).normal(size=(64, 8, 4)).astype("float32")
    live = LiveAttention(
        model, x[:2], every_n_batches=1, min_interval_s=0, overhead_budget=1.0, snapshot_dir=None
    )
    model.fit(x, x[:, :, :1].sum(axis=1), batch_size=8, epochs=3, verbose=0, callbacks=[live])
    return live


def screenshot(html_path, png_path):
    """Opens the exported file in headless chromium and saves a small PNG."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from keras_attention.widgets.export import CHROMIUM_ARGS
    from keras_attention.widgets.export import find_chromium

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("needs chromium (Debian: apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.goto("file://" + os.path.abspath(html_path))
            page.wait_for_function(
                "window.Bokeh && Bokeh.documents.length > 0 && "
                "Bokeh.documents.every((d) => d.is_idle)"
            )
            page.wait_for_timeout(1000)  # let BokehJS finish drawing
            raw = png_path + ".full.png"
            page.screenshot(path=raw, full_page=True)
        finally:
            browser.close()
    image = Image.open(raw).convert("RGB")
    os.remove(raw)
    box = Image.eval(image, lambda v: 255 - v).getbbox()  # crop the white margin
    if box:
        image = image.crop(
            (
                max(box[0] - 8, 0),
                max(box[1] - 8, 0),
                min(box[2] + 8, image.width),
                min(box[3] + 8, image.height),
            )
        )
    colors = 64
    while True:
        image.quantize(colors).save(png_path, optimize=True)
        if os.path.getsize(png_path) <= MAX_BYTES or colors <= 16:
            break
        colors //= 2
    return png_path


def main():
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    from keras_attention.widgets import export_html

    os.makedirs(FIGURES, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name, build in [
            ("decoding_stepper", decoding_stepper),
            ("attention_explorer", attention_explorer),
            ("live_attention", live_attention),
        ]:
            html = export_html(build(), os.path.join(scratch, f"{name}.html"))
            png = screenshot(html, os.path.join(FIGURES, f"{name}.png"))
            print(f"{png}: {os.path.getsize(png) // 1024} KiB")
    benchmark = os.path.join(ROOT, "benchmarks", "long_sequence_benchmark.py")
    subprocess.run(
        [
            sys.executable,
            benchmark,
            "--replot",
            os.path.join(ROOT, "benchmarks", "long_sequence.json"),
        ],
        check=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
