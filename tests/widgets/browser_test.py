"""Real-browser checks: Voila serves a notebook, Debian chromium drives it.

Skipped only when no chromium is installed (`.ci/install-browser.sh` installs
it). Playwright's own browser download is not used: chromium is launched from
its system path with flags that keep it off the network.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import nbformat
import numpy as np
import pytest

from keras_attention.widgets import export_html
from keras_attention.widgets import figures
from keras_attention.widgets.export import CHROMIUM_ARGS
from keras_attention.widgets.export import find_chromium

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = find_chromium()
MALICIOUS = "<img/src=x/onerror=alert(1)>"  # the slashes make it a valid <img> with onerror

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (run .ci/install-browser.sh)"),
]

NOTEBOOK_CELLS = [
    """
import json, os
from bokeh.io import output_notebook
from bokeh.resources import INLINE
output_notebook(INLINE, hide_banner=True)  # BokehJS from the package, no CDN
""",
    f"""
from keras_attention.models import Seq2SeqTranslator
from keras_attention.widgets import DecodingStepper
MALICIOUS = {MALICIOUS!r}
SOURCE = "il a m' entarté " + MALICIOUS
translator = Seq2SeqTranslator.from_texts(
    [SOURCE, "il a"], ["he hit me with a pie " + MALICIOUS, "he hit"],
    source_split="whitespace", target_split="whitespace", units=8, embedding_dim=4)
stepper = DecodingStepper(translator, SOURCE)
stepper.next_token(force_token=MALICIOUS)

def dump(_=None):
    # What the kernel holds, for the test to compare with the page.
    history = stepper.session.history
    with open(os.environ["KA_STEPPER_DUMP"], "w") as handle:
        json.dump({{"attention": [s.attention.tolist() for s in history],
                   "tokens": [s.token for s in history]}}, handle)

stepper.next_button.on_click(dump)  # runs after the stepper's own handler
dump()
""",
    "stepper.widget",
]

READ_ALIGNMENT = """
() => {
  if (!window.Bokeh || !window.Bokeh.documents) return null;
  for (const doc of window.Bokeh.documents) {
    const source = doc.get_model_by_name("alignment_source");
    if (source) {
      const data = source.data;
      const column = (name) => Array.from(data instanceof Map ? data.get(name) : data[name]);
      return {weight: column("weight"), row: column("row"), col: column("col"), y_token: column("y_token")};
    }
  }
  return null;
}
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def voila(notebook, env, timeout_s=90):
    port = free_port()
    log = open(os.path.join(os.path.dirname(notebook), "voila.log"), "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "voila", "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
         "--VoilaConfiguration.show_tracebacks=True", notebook],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/voila/static/", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # the server answers, whatever it says
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError("voila did not start: " + open(log.name).read()[-3000:])
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()


@contextlib.contextmanager
def browser_page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS),
                                             headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.alerts = []
            page.on("dialog", lambda dialog: (page.alerts.append(dialog.message), dialog.dismiss()))
            try:
                yield page
            except BaseException:
                shot = tmp_path / "failure.png"
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(shot), full_page=True)
                    print(f"screenshot of the failing page: {shot}")
                raise
        finally:
            browser.close()


def write_notebook(tmp_path, name, cells, dump_variable):
    """Writes `cells` as `<name>.ipynb`; returns its path, the kernel's
    environment and the file the notebook dumps its state to."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.strip()) for c in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(notebook, str(path))
    dump = tmp_path / "kernel.json"
    env = {**os.environ, "PYTHONPATH": ROOT, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
           dump_variable: str(dump)}
    return str(path), env, dump


@pytest.mark.tf_only
def test_next_token_in_voila_adds_the_kernels_attention_row(tmp_path):
    path, env, dump = write_notebook(tmp_path, "stepper", NOTEBOOK_CELLS, "KA_STEPPER_DUMP")
    with voila(path, env) as url, browser_page(tmp_path) as page:
        page.goto(url, timeout=180_000)
        page.wait_for_function(f"({READ_ALIGNMENT})() !== null", timeout=120_000)
        before = page.evaluate(READ_ALIGNMENT)
        assert len(before["weight"]) == 5 and before["y_token"][0] == MALICIOUS

        page.get_by_role("button", name="Next token").click()
        page.wait_for_function(f"({READ_ALIGNMENT})().weight.length === 10", timeout=60_000)
        after = page.evaluate(READ_ALIGNMENT)
        deadline = time.monotonic() + 30
        while len(json.loads(dump.read_text())["attention"]) < 2:
            assert time.monotonic() < deadline, "the kernel never recorded the second step"
            time.sleep(0.2)
        kernel = json.loads(dump.read_text())

        assert after["row"][5:] == [1] * 5 and after["col"][5:] == list(range(5))
        np.testing.assert_allclose(np.reshape(after["weight"], (2, 5)), kernel["attention"], rtol=1e-6)
        assert after["y_token"][5] == kernel["tokens"][1]
        # Play (the browser's Play widget ticks, the kernel decodes) grows it further.
        page.locator(".widget-play button").first.click()
        page.wait_for_function(
            f"({READ_ALIGNMENT})().weight.length >= 20"
            " || document.querySelector('button.mod-primary').disabled", timeout=60_000)
        page.locator(".widget-play button").nth(1).click()  # pause
        played = page.evaluate(READ_ALIGNMENT)
        assert len(played["weight"]) >= 20 or page.evaluate("document.querySelector('button.mod-primary').disabled")
        assert played["row"][:10] == after["row"] and played["weight"][:10] == after["weight"]
        # The malicious token is on the page as text and never ran.
        page.wait_for_timeout(500)
        assert MALICIOUS in page.inner_text("body")
        assert page.alerts == []
        assert page.evaluate("document.querySelectorAll('img[onerror]').length") == 0


LIVE_CELLS = [
    NOTEBOOK_CELLS[0],
    """
import time
import ipywidgets, keras, numpy as np
import keras_attention
from keras_attention.widgets import LiveAttention

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((6, 4)),
    keras_attention.LuongAttention(score="general", name="att"),
    keras.layers.GlobalAveragePooling1D(),
    keras.layers.Dense(1),
])
model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
x = np.random.default_rng(0).normal(size=(32, 6, 4)).astype("float32")
y = x[:, :, :1].sum(axis=1)
live = LiveAttention(model, x[:2], every_n_batches=1, min_interval_s=0, overhead_budget=1.0)
# Slow the batches down a little so the page has time to show each update.
slow = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.15))
train = ipywidgets.Button(description="Train")

def on_train(_):
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[live, slow], verbose=0)
    # What the kernel drew last, for the test to compare with the page.
    matrix = live._latest["att"][0]
    with open(os.environ["KA_LIVE_DUMP"], "w") as handle:
        json.dump({"weight": matrix.ravel().tolist(), "updates": live.updates}, handle)

train.on_click(on_train)
""",
    "ipywidgets.VBox([train, live.widget])",
]

WATCH_HEATMAP = """
() => {
  // Record every distinct state of the heatmap the page shows.
  window.__heatmaps = [];
  const read = () => {
    for (const doc of window.Bokeh.documents) {
      const source = doc.get_model_by_name("heatmap_source");
      if (source) {
        const data = source.data;
        return Array.from(data instanceof Map ? data.get("weight") : data.weight);
      }
    }
    return null;
  };
  window.__readHeatmap = read;
  let last = null;
  window.__watch = setInterval(() => {
    const now = read();
    const key = JSON.stringify(now);
    if (now && key !== last) { window.__heatmaps.push(now); last = key; }
  }, 20);
}
"""


@pytest.mark.tf_only
def test_live_attention_in_voila_redraws_while_the_kernel_trains(tmp_path):
    path, env, dump = write_notebook(tmp_path, "live", LIVE_CELLS, "KA_LIVE_DUMP")
    with voila(path, env) as url, browser_page(tmp_path) as page:
        page.goto(url, timeout=180_000)
        page.wait_for_function(
            "window.Bokeh && window.Bokeh.documents && window.Bokeh.documents.some("
            "d => d.get_model_by_name('heatmap_source'))", timeout=120_000)
        page.evaluate(WATCH_HEATMAP)
        page.wait_for_function("window.__heatmaps.length === 1", timeout=10_000)
        before = page.evaluate("window.__heatmaps[0]")
        assert len(before) == 36

        page.get_by_role("button", name="Train").click()
        deadline = time.monotonic() + 120
        while not dump.exists() or not dump.read_text():
            assert time.monotonic() < deadline, "training in the kernel never finished"
            time.sleep(0.2)
        time.sleep(0.2)  # the dump is written in one call; let it land
        kernel = json.loads(dump.read_text())
        page.wait_for_function(
            f"(() => {{ const w = window.__readHeatmap(); const k = {json.dumps(kernel['weight'])};"
            " return w.every((v, i) => Math.abs(v - k[i]) < 1e-6); })()", timeout=30_000)
        page.evaluate("clearInterval(window.__watch)")
        seen = page.evaluate("window.__heatmaps")

    # 2 epochs of 8 batches: updates before batches 2..8 and at each epoch's end.
    assert kernel["updates"] == 16
    np.testing.assert_allclose(seen[-1], kernel["weight"], atol=1e-6)
    # Training changed the attention, and the page showed states between the
    # first and the last: it redrew during training, not only at the end.
    assert not np.allclose(before, kernel["weight"], atol=1e-3)
    assert len(seen) >= 4, len(seen)
    for heatmap in seen:
        rows = np.reshape(heatmap, (6, 6))
        np.testing.assert_allclose(rows.sum(axis=1), 1.0, atol=1e-5)


EXPLORER_CELLS = [
    NOTEBOOK_CELLS[0],
    f"""
import keras, numpy as np
import keras_attention
from keras_attention.widgets import AttentionExplorer

keras.utils.set_random_seed(0)
inputs = keras.Input((5, 8))
mixed = keras_attention.MultiHeadAttention(4, 2, name="mha")(inputs)
outputs = keras_attention.LuongAttention(name="luong")(mixed)
model = keras.Model(inputs, outputs)
x = np.random.default_rng(0).normal(size=(1, 5, 8)).astype("float32")
explorer = AttentionExplorer(model, x, query_tokens=["a", "b", {MALICIOUS!r}, "d", "e"])
with open(os.environ["KA_EXPLORER_DUMP"], "w") as handle:
    json.dump({{name: w.tolist() for name, w in explorer.weights.items()}}, handle)
""",
    "explorer.widget",
]

READ_DETAIL = """
() => {
  // The detail heatmap is the only figure titled "<layer>, <head>".
  for (const doc of window.Bokeh.documents) {
    const fig = doc.roots()[0];
    if (fig && fig.title && fig.title.text.includes(", ")) {
      const source = doc.get_model_by_name("heatmap_source");
      const data = source.data;
      const column = (name) => Array.from(data instanceof Map ? data.get(name) : data[name]);
      return {title: fig.title.text, weight: column("weight"), x_token: column("x_token")};
    }
  }
  return null;
}
"""


@pytest.mark.tf_only
def test_explorer_in_voila_shows_the_chosen_layer_and_head(tmp_path):
    path, env, dump = write_notebook(tmp_path, "explorer", EXPLORER_CELLS, "KA_EXPLORER_DUMP")

    def shows(title, matrix):
        return (f"(() => {{ const d = ({READ_DETAIL})(); const k = {json.dumps(np.ravel(matrix).tolist())};"
                f" return d !== null && d.title === {json.dumps(title)} && d.weight.length === k.length"
                " && d.weight.every((v, i) => Math.abs(v - k[i]) < 1e-6); })()")

    with voila(path, env) as url, browser_page(tmp_path) as page:
        page.goto(url, timeout=180_000)
        page.wait_for_function(f"window.Bokeh && window.Bokeh.documents && ({READ_DETAIL})() !== null",
                               timeout=120_000)
        weights = {name: np.asarray(w) for name, w in json.loads(dump.read_text()).items()}
        assert weights["mha"].shape == (4, 5, 5) and weights["luong"].shape == (1, 5, 5)
        # Opens on the first layer, mean of its heads.
        page.wait_for_function(shows("mha, mean of heads", weights["mha"].mean(axis=0)), timeout=30_000)

        page.get_by_label("head").select_option("2")
        page.wait_for_function(shows("mha, head 2", weights["mha"][2]), timeout=30_000)

        page.get_by_label("layer").select_option("luong")
        page.wait_for_function(shows("luong, head 0", weights["luong"][0]), timeout=30_000)
        detail = page.evaluate(READ_DETAIL)
        assert MALICIOUS in detail["x_token"]
        page.wait_for_timeout(300)
        assert page.alerts == []
        assert page.evaluate("document.querySelectorAll('img[onerror]').length") == 0


def test_exported_html_draws_offline_and_shows_tokens_as_text(tmp_path):
    from PIL import Image

    weights = np.random.default_rng(0).dirichlet(np.ones(4), size=3)
    fig = figures.heatmap(weights, ["il", MALICIOUS, "m'", "entarté"], ["he", "hit", MALICIOUS])
    path = export_html(fig, str(tmp_path / "heatmap.html"))
    with browser_page(tmp_path) as page:
        # Any request leaving the file would mean a CDN dependency.
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto("file://" + path)
        page.wait_for_function("window.Bokeh && Object.keys(window.Bokeh.index).length > 0", timeout=30_000)
        page.wait_for_timeout(500)
        shot = tmp_path / "heatmap.png"
        page.screenshot(path=str(shot))
        assert page.alerts == []
        assert page.evaluate("document.querySelectorAll('img[onerror]').length") == 0
        assert all(url.startswith(("file://", "data:")) for url in requests), requests
    image = np.asarray(Image.open(shot).convert("RGB"))
    colours = {tuple(pixel) for pixel in image.reshape(-1, 3)[::7]}
    assert len(colours) > 20, "the heatmap was not drawn"


def test_export_png_draws_the_figure(tmp_path):
    from PIL import Image

    from keras_attention.widgets import export_png

    fig = figures.heatmap(np.random.default_rng(1).random((5, 5)), title="png")
    path = export_png(fig, str(tmp_path / "heatmap.png"), width=500, height=450)
    image = np.asarray(Image.open(path).convert("RGB"))
    assert image.shape[:2] == (450, 500)
    assert len({tuple(p) for p in image.reshape(-1, 3)[::5]}) > 20
