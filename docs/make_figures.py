"""Regenerates every figure the README, the guides and the docs site show.

    python docs/make_figures.py          # or: make figures

1. Screenshots of the widgets as a notebook shows them (buttons, dropdowns,
   the candidates row): one notebook (`NOTEBOOK_CELLS`) is served by Voila on
   127.0.0.1 and opened in headless chromium (Playwright driving the system
   chromium, no browser download), light and dark; each widget is saved as a
   small palette PNG. The steppers decode the lecture's sentence, "il a m'
   entarté", greedily with the shipped pretrained seed translators
   (examples/notebooks/pretrained/): "he hit me with a pie", il->he, m'->me,
   entarté->hit and pie. The explorer and LiveAttention show models trained
   here, in the notebook, for a few seconds.
2. benchmarks/long_sequence.png redrawn from benchmarks/long_sequence.json
   (`long_sequence_benchmark.py --replot`; rerun the benchmark itself for new
   numbers, see benchmarks/RESULTS.md).

Before a page is saved, its figures pass the browser tests' painted-text check
(`tests/widgets/legibility.py`: no title or tick label cut, no two
labels of an axis overlapping, every label at WCAG 3:1 contrast or more) and
the page logged no error; otherwise nothing is written and this exits with the
problem. `PUBLISHED` lists every image a page of ours shows:
tests/docs/published_figures_test.py fails when a Markdown page shows one it lacks.
Takes about two minutes on two cores (1 min 50 s on a shared, loaded pair).
"""

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BYTES = 150_000
SENTENCE = "il a m' entarté"


@dataclasses.dataclass(frozen=True)
class Shot:
    """One screenshot: the widget shown by cell `widget`, in a `width` px window."""

    path: str  # relative to the repository root
    widget: str
    theme: str = "light"
    width: int = 1280


SHOTS = (
    # The README's first picture: the Seq2Seq stepper (at 1000 px Voila's output area cut
    # the alignment after its fifth row, hiding the lecture's entarté -> pie cell).
    Shot("docs/figures/decoding_stepper.png", "decoding_stepper"),
    Shot("docs/figures/decoding_stepper_1280.png", "decoding_stepper"),
    Shot("docs/figures/decoding_stepper_1280_dark.png", "decoding_stepper", theme="dark"),
    Shot("docs/figures/transformer_stepper_1280.png", "transformer_stepper"),
    Shot("docs/figures/transformer_stepper_1280_dark.png", "transformer_stepper", theme="dark"),
    Shot("docs/figures/causal_stepper.png", "causal_stepper", width=1100),
    Shot("docs/figures/attention_explorer.png", "attention_explorer", width=1100),
    Shot("docs/figures/live_attention.png", "live_attention", width=1100),
)
LONG_SEQUENCE_PLOT = "benchmarks/long_sequence.png"
# Every image that README.md, docs/**/*.md or examples/notebooks/README.md shows.
PUBLISHED = tuple(shot.path for shot in SHOTS) + (LONG_SEQUENCE_PLOT,)

PRETRAINED = os.path.join(ROOT, "examples", "notebooks", "pretrained")

# The notebook Voila runs: one cell per widget, each tagged with the CSS class
# `figure-<name>` that the screenshot looks for.
SETUP_CELL = """
import os
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
import keras, numpy as np
import keras_attention
from keras_attention.widgets import AttentionExplorer, DecodingStepper, LiveAttention
from keras_attention.widgets import output_notebook
output_notebook()

def show(widget, name):
    widget.widget.add_class(f"figure-{name}")
    return widget.widget
"""

# Greedy decoding to <end> with the shipped translator: the notebook's first picture.
STEPPER_CELLS = {
    "decoding_stepper": f"""
translator = keras.models.load_model({os.path.join(PRETRAINED, "seed_seq2seq.keras")!r})
stepper = DecodingStepper(translator, {SENTENCE!r}, top_k=4)
stepper.go_to(translator.max_target_length)
assert [s.token for s in stepper.history] == "he hit me with a pie <end>".split()
show(stepper, "decoding_stepper")
""",
    # The last layer's first head: he->il, hit->entarté (the mean of its heads blurs them).
    "transformer_stepper": f"""
transformer = keras.models.load_model({os.path.join(PRETRAINED, "seed_transformer.keras")!r})
transformer_stepper = DecodingStepper(transformer, {SENTENCE!r}, top_k=4)
transformer_stepper.go_to(transformer.max_target_length)
assert [s.token for s in transformer_stepper.history] == "he hit me with a pie <end>".split()
transformer_stepper.layer_choice.value = 1
transformer_stepper.head_choice.value = 0
show(transformer_stepper, "transformer_stepper")
""",
}

# A causal LM (#52): the tests' tiny Gemma (its own SentencePiece vocabulary, random
# weights; layer 0 local with a window of 3 keys) with our attention, six tokens decoded:
# the cache panel shows layer 0's 3-slot ring wrapped, layer 1 keeping every position.
CAUSAL_STEPPER_CELL = f"""
import sys
sys.path.insert(0, {ROOT!r})
from tests.causal_lms import gemma_causal_lm
from keras_attention.interchange.keras_hub_models import replace_keras_hub_attention
causal_lm = gemma_causal_lm(0, 12, sliding_window=3)
replace_keras_hub_attention(causal_lm)
causal_stepper = DecodingStepper(causal_lm, "keras", max_length=12, top_k=3)
causal_stepper.go_to(6)
causal_stepper.show(0, 0)
show(causal_stepper, "causal_stepper")
"""

# Is "cat" in the sentence? Self-attention, then attention pooling, trained for a few
# seconds: the pooling learns to look at "cat", the heads at the nouns.
EXPLORER_CELL = """
keras.utils.set_random_seed(0)
WORDS = "the a big small red old cat dog fox sat ran slept on under near mat rug".split()
rng = np.random.default_rng(0)
ids = rng.integers(1, len(WORDS), size=(3000, 8))
labels = (ids == WORDS.index("cat")).any(axis=1).astype("int32")
# One label in ten flipped: a model sure of every answer has a loss of 0 in float32,
# and no gradient for the head-importance grid to show.
labels = np.where(rng.random(len(labels)) < 0.1, 1 - labels, labels)
inputs = keras.Input((8,), dtype="int32")
x = keras.layers.Embedding(len(WORDS), 16)(inputs)
x = x + keras_attention.MultiHeadAttention(num_heads=2, key_dim=8, name="self_attention")(x)
x = keras_attention.AttentionPooling(name="pooling")(x)
outputs = keras.layers.Dense(2, activation="softmax")(x)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
model.fit(ids, labels, batch_size=64, epochs=4, verbose=0)
sentence = "the big cat sat on the red mat".split()
# targets: the sentence has a cat (label 1), so the head grid shows each head's importance.
explorer = AttentionExplorer(model, np.array([[WORDS.index(w) for w in sentence]]),
                             query_tokens=sentence, targets=np.array([1]))
show(explorer, "attention_explorer")
"""

# Output the token one position earlier (examples/notebooks/live_attention.ipynb's task):
# the sub-diagonal forms while `fit` runs.
LIVE_CELL = """
keras.utils.set_random_seed(0)
LENGTH, VOCABULARY = 10, 12

class AddPositions(keras.layers.Layer):
    def build(self, input_shape):
        self.positions = self.add_weight(shape=input_shape[1:], initializer="random_normal")
    def call(self, x):
        return x + self.positions

inputs = keras.Input((LENGTH,), dtype="int32")
x = AddPositions()(keras.layers.Embedding(VOCABULARY, 24)(inputs))
x = keras_attention.LuongAttention(score="general", name="self_attention")(x, use_causal_mask=True)
model = keras.Model(inputs, keras.layers.Dense(VOCABULARY)(x))
model.compile(optimizer=keras.optimizers.Adam(0.0007),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
tokens = np.random.default_rng(0).integers(1, VOCABULARY, size=(2048, LENGTH)).astype("int32")
previous = np.concatenate([np.zeros((len(tokens), 1), "int32"), tokens[:, :-1]], axis=1)
live = LiveAttention(model, tokens[:1], every_n_batches=16, min_interval_s=0, overhead_budget=1.0,
                     query_tokens=[str(t) for t in tokens[0]], snapshot_dir=None)
model.fit(tokens, previous, batch_size=32, epochs=10, callbacks=[live], verbose=0)
show(live, "live_attention")
"""

NOTEBOOK_CELLS = [
    SETUP_CELL,
    *STEPPER_CELLS.values(),
    CAUSAL_STEPPER_CELL,
    EXPLORER_CELL,
    LIVE_CELL,
]


def write_notebook(path):
    import nbformat

    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(cell.strip()) for cell in NOTEBOOK_CELLS]
    )
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, path)
    return path


@contextlib.contextmanager
def voila(notebook, scratch):
    """Serves `notebook` with Voila on 127.0.0.1; yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "JUPYTER_CONFIG_DIR": os.path.join(scratch, ".jupyter"),
    }
    log_path = os.path.join(scratch, "voila.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "voila",
                "--no-browser",
                f"--port={port}",
                "--Voila.ip=127.0.0.1",
                "--VoilaConfiguration.show_tracebacks=True",
                notebook,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(url + "api/status", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # the server answers
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    with open(log_path) as log:
                        raise SystemExit("voila did not start:\n" + log.read()[-3000:]) from None
                time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        process.wait(timeout=30)


def watch_errors(page):
    """Every uncaught page error and BokehJS console error, as the browser tests count them."""
    errors = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.on(
        "console",
        lambda message: (
            errors.append(f"console: {message.text}")
            if message.type == "error" and "bokeh" in message.text.lower()
            else None
        ),
    )
    return errors


def assert_page_legible(page, minimum_axes):
    """The painted-text check of the browser tests, on every figure of the page."""
    sys.path.insert(0, ROOT)  # the page checker is the browser tests' (not shipped)
    from tests.widgets import legibility

    legibility.wait_until_drawn(page)
    page.wait_for_timeout(500)  # BokehJS paints on the next frame
    checked = legibility.assert_legible(page, minimum_axes=minimum_axes)
    legibility.assert_text_contrasts(page)
    return checked


# The box of an element and of every canvas it paints: a figure may run past the
# element's own box (canvases sit in Bokeh's shadow roots), and a screenshot of the
# element's box would cut it. Other descendants (hidden tooltips) do not count.
DRAWN_BOX = """(element) => {
  const box = element.getBoundingClientRect();
  let [left, top, right, bottom] = [box.left, box.top, box.right, box.bottom];
  const visit = (node) => {
    for (const child of node.children) {
      const r = child.getBoundingClientRect();
      if (child.tagName === "CANVAS" && r.width > 0 && r.height > 0) {
        [left, top] = [Math.min(left, r.left), Math.min(top, r.top)];
        [right, bottom] = [Math.max(right, r.right), Math.max(bottom, r.bottom)];
      }
      visit(child);
      if (child.shadowRoot) visit(child.shadowRoot);
    }
  };
  visit(element);
  return {x: Math.max(left, 0), y: Math.max(top, 0), width: right - Math.max(left, 0),
          height: bottom - Math.max(top, 0)};
}"""


def save_palette_png(raw, path, margin=8):
    """`raw` PNG bytes, cropped to what differs from its corner's colour (the page's
    background) plus `margin` px -> a palette PNG at `path` of at most MAX_BYTES."""
    import io

    from PIL import Image
    from PIL import ImageChops

    image = Image.open(io.BytesIO(raw)).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box:
        image = image.crop(
            (
                max(box[0] - margin, 0),
                max(box[1] - margin, 0),
                min(box[2] + margin, image.width),
                min(box[3] + margin, image.height),
            )
        )
    colors = 64
    while True:
        image.quantize(colors).save(path, optimize=True)
        if os.path.getsize(path) <= MAX_BYTES or colors <= 16:
            break
        colors //= 2
    if os.path.getsize(path) > MAX_BYTES:
        raise SystemExit(f"{path}: {os.path.getsize(path)} bytes, more than {MAX_BYTES}")
    return path


def shoot(page, shots, staging):
    """Checks the page at each shot's width, then saves each shot's widget into `staging`."""
    for width in sorted({shot.width for shot in shots}, reverse=True):
        page.set_viewport_size({"width": width, "height": 900})
        # Every widget draws a heatmap at least: two axes and a colour bar's.
        minimum_axes = 3 * len({shot.widget for shot in shots})
        try:
            assert_page_legible(page, minimum_axes=minimum_axes)
        except AssertionError as error:
            raise SystemExit(f"illegible at {width} px ({shots[0].theme}): {error}") from error
        for shot in shots:
            if shot.width != width:
                continue
            widget = page.locator(f".figure-{shot.widget}")
            # A window tall enough for all it draws (Voila's page scrolls, not the widget).
            height = int(widget.evaluate(DRAWN_BOX)["height"]) + 100
            page.set_viewport_size({"width": width, "height": max(height, 900)})
            widget.evaluate("(element) => element.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)
            raw = page.screenshot(clip=widget.evaluate(DRAWN_BOX))
            save_palette_png(raw, os.path.join(staging, shot.path))
        page.set_viewport_size({"width": width, "height": 900})


def widget_figures(scratch, staging):
    """Every `SHOTS` picture, checked, written under `staging` (same relative paths)."""
    from playwright.sync_api import sync_playwright

    from keras_attention.widgets.export import CHROMIUM_ARGS
    from keras_attention.widgets.export import find_chromium

    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("needs chromium (Debian: apt-get install chromium)")
    notebook = write_notebook(os.path.join(scratch, "figures.ipynb"))
    widgets = {shot.widget for shot in SHOTS}
    with (
        voila(notebook, scratch) as url,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            for theme in ("light", "dark"):
                page, errors = open_page(browser, f"{url}?theme={theme}", widgets)
                shoot(page, [shot for shot in SHOTS if shot.theme == theme], staging)
                if errors:
                    raise SystemExit(f"errors in the {theme} page:\n" + "\n".join(errors[:20]))
                page.close()
        finally:
            browser.close()


def open_page(browser, url, widgets, tries=3):
    """A Voila page of the notebook with every widget drawn, and its list of page errors.

    Voila runs the notebook afresh for each page. On a loaded machine the page's
    widget manager sometimes gives up on a widget before the kernel sent its state
    ("Error displaying widget: model not found"); the page is then opened again.
    """
    drawn = "(names) => names.every((n) => document.querySelector('.figure-' + n))"
    for attempt in range(1, tries + 1):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = watch_errors(page)
        start = time.perf_counter()
        page.goto(url, timeout=300_000)  # Voila answers once every cell ran (or one failed)
        page.wait_for_function(
            f"(names) => ({drawn})(names) || /Traceback|Error displaying widget/"
            ".test(document.body.innerText)",
            arg=sorted(widgets),
            timeout=300_000,
        )
        text = page.inner_text("body")
        if "Traceback" in text:
            raise SystemExit("a cell failed:\n" + text[-3000:])
        if page.evaluate(drawn, sorted(widgets)):
            print(f"{url}: drawn in {time.perf_counter() - start:.1f} s (try {attempt})")
            return page, errors
        missing = [n for n in sorted(widgets) if not page.locator(f".figure-{n}").count()]
        page.close()
        print(f"{url}: {missing} not displayed (try {attempt} of {tries})")
    raise SystemExit(f"{url}: a widget was not displayed in {tries} tries")


def replot_long_sequence():
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


def main():
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    with tempfile.TemporaryDirectory() as scratch:
        staging = os.path.join(scratch, "out")
        for shot in SHOTS:
            os.makedirs(os.path.dirname(os.path.join(staging, shot.path)), exist_ok=True)
        widget_figures(scratch, staging)
        # Only once every picture passed: none is replaced by a half-checked set.
        for shot in SHOTS:
            shutil.copyfile(os.path.join(staging, shot.path), os.path.join(ROOT, shot.path))
            print(f"{shot.path}: {os.path.getsize(os.path.join(ROOT, shot.path)) // 1024} KiB")
    replot_long_sequence()
    print(f"{len(PUBLISHED)} figures made")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    sys.exit(main())
