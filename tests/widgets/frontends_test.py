"""Each widget in JupyterLab 4, Notebook 7 and Voila, in Debian chromium.

One Jupyter server on 127.0.0.1 serves all three front ends for the whole
module (JupyterLab at /lab, Notebook 7 at /notebooks, Voila at
/voila/render). For every (widget, front end) a notebook is written (LiveAttention
and the explorer share one: a page and its kernel cost ~10 s before any widget),
opened and run in the page (Voila runs it itself), and the test reads the BokehJS
data sources of the page and compares them with what the kernel holds:
state set in the cell that creates a widget must be drawn, and later changes
must arrive.

Screenshots of every widget and the measured latencies (`latency.json`) are
kept under the module's pytest tmp dir (`frontends*/`), or under
`$KA_BROWSER_ARTIFACTS` when set (pytest prunes old tmp dirs); the path is
printed at the end.
"""

import contextlib
import json
import os
import pathlib
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

from keras_attention.widgets.export import CHROMIUM_ARGS
from keras_attention.widgets.export import find_chromium
from tests.widgets import bokeh_page
from tests.widgets import text_boxes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM = find_chromium()
MALICIOUS = "<img/src=x/onerror=alert(1)>"  # the slashes make it a valid <img> with onerror
FRONT_ENDS = ("lab", "notebook", "voila")


# (front end, themes) of the pages `make test` opens: the Voila-only tests' (light), then
# each parametrized test's kept page (`matrix`).
KEPT_PAGES = [("voila", ("light",))]


def matrix(pages, kept):
    """`pages` for a parametrize, each but `kept` marked `front_end_matrix`. `make test`
    opens the kept page of each test, chosen so that every front end and both themes are
    covered (JupyterLab 3 pages, Notebook 7 two, Voila three; Dark in each front end);
    `make test-browsers` opens every page. A page costs 20-50 s of a CI core (its kernel,
    front end and widgets), and the widgets' own code is the same in every front end."""
    assert kept in pages, (kept, pages)
    KEPT_PAGES.append((kept, ("light",)) if isinstance(kept, str) else kept[:2])
    marked = pytest.mark.front_end_matrix
    return [
        page
        if page == kept
        else pytest.param(page, marks=marked)
        if isinstance(page, str)
        else pytest.param(*page, marks=marked)
        for page in pages
    ]


pytestmark = [
    pytest.mark.slow,
    pytest.mark.tf_only,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium installed (run .ci/install-browser.sh)"
    ),
]

SETUP_CELL = """
import json, os
from keras_attention.widgets import output_notebook
output_notebook()  # BokehJS from the package, no CDN, stored once

def dump(into="", **state):
    # What the kernel holds, for the test to compare with the page (a file per widget
    # where a page shows two: `into` names it).
    path = DUMP.replace(".json", f"_{into}.json") if into else DUMP
    with open(path + ".tmp", "w") as handle:
        json.dump(state, handle)
    os.replace(path + ".tmp", path)
"""

STEPPER_CELLS = [
    f"""
from keras_attention.models import Seq2SeqTranslator
from keras_attention.widgets import DecodingStepper
MALICIOUS = {MALICIOUS!r}
SOURCE = "il a m' entarté " + MALICIOUS
translator = Seq2SeqTranslator.from_texts(
    [SOURCE, "il a"], ["he hit me with a pie " + MALICIOUS, "he hit"],
    source_split="whitespace", target_split="whitespace", units=8, embedding_dim=4)
stepper = DecodingStepper(translator, SOURCE)

def dump_stepper(_=None):
    history = stepper.session.history
    dump(attention=[s.attention.tolist() for s in history], tokens=[s.token for s in history],
         candidates=[s.candidates for s in history])

stepper.next_button.on_click(dump_stepper)  # runs after the stepper's own handler
stepper.candidate_source.selected.on_change("indices", lambda attr, old, new: dump_stepper())
# Three steps in the creating cell, before any view of the widget exists
# (forced, so that an untrained model cannot end the sentence early).
for token in (MALICIOUS, "he", "hit"):
    stepper.next_token(force_token=token)
dump_stepper()
stepper.widget
""",
]

EXPLORER_CELLS = [
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
explorer = AttentionExplorer(model, x, query_tokens=["a", "b", {MALICIOUS!r}, "d", "e"],
                             targets=np.zeros((1, 5, 8), "float32"), loss="mse")
explorer.head_choice.value = 2  # chosen in the creating cell

def dump_explorer():
    dump("explorer", weights={{name: w.tolist() for name, w in explorer.weights.items()}},
         rollout=explorer.select("rollout (all layers)").tolist(),
         masked=explorer.masked_heads(), loss=explorer.loss)

dump_explorer()
# After the explorer's own handler: the state a click on the head grid leaves.
explorer.importance_source.selected.on_change("indices", lambda attr, old, new: dump_explorer())
explorer.widget
""",
]

LIVE_CELLS = [
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

def fit(_=None, model=model, x=x, y=y):  # its own: the explorer's cell reuses the names
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[live, slow], verbose=0)
    dump("live", weight=live._latest["att"][0].ravel().tolist(), updates=live.updates,
         title=live.figures["att"].title.text, first=live.frames[0][1]["att"].ravel().tolist(),
         frames=len(live.frames))

train.on_click(fit)
box = ipywidgets.VBox([train, live.widget])  # the widget and its comm exist from here on
fit()  # every update is sent before any view of the widget exists
box
""",
]

# Both translators, each stepped three tokens in its creating cell (no view exists yet).
PANELS_CELLS = [
    """
from keras_attention.models import Seq2SeqTranslator, TransformerTranslator
from keras_attention.widgets import DecodingStepper
SOURCE = "il a m' entarté"
TEXTS = dict(source_texts=[SOURCE, "il a"], target_texts=["he hit me with a pie", "he hit"],
             source_split="whitespace", target_split="whitespace")
seq2seq = Seq2SeqTranslator.from_texts(**TEXTS, units=8, embedding_dim=4)
transformer = TransformerTranslator.from_texts(**TEXTS, num_layers=2, num_heads=2, hidden_dim=8,
                                               intermediate_dim=16)
steppers = [DecodingStepper(seq2seq, SOURCE), DecodingStepper(transformer, SOURCE)]
for stepper in steppers:
    for token in ("he", "hit", "me"):
        stepper.next_token(force_token=token)
dump(tokens=[[s.token for s in stepper.history] for stepper in steppers])
""",
    "steppers[0].widget",
    "steppers[1].widget",
]

# A long input (a 64-token window of 80) and a 10-token one: the head view's first draw.
HEAD_VIEW_CELLS = [
    """
import keras, numpy as np
import keras_attention
from keras_attention.widgets import AttentionExplorer

keras.utils.set_random_seed(0)
def explorer(length, **options):
    # Two layers: rollout and flow (10 tokens) in the menu, and a head grid.
    inputs = keras.Input((length, 8))
    hidden = keras_attention.MultiHeadAttention(2, 4, name=f"mha{length}")(inputs)
    model = keras.Model(inputs, keras_attention.MultiHeadAttention(2, 4, name="top")(hidden))
    x = np.random.default_rng(0).normal(size=(1, length, 8)).astype("float32")
    return AttentionExplorer(model, x, query_tokens=[f"t{i}" for i in range(length)],
                             max_tokens=64, **options)
# The short one scores its heads (a loss in the grid's title); the long one has no targets.
explorers = [explorer(10, targets=np.zeros((1, 10, 8), "float32"), loss="mse"), explorer(80)]
dump(ready=True)
""",
    "explorers[0].widget",
    "explorers[1].widget",
]

# Widget and training in separate cells, as a notebook has them: with Voila's
# progressive rendering (examples/notebooks/voila.json) the widget is on the
# page while the next cell trains.
PROGRESSIVE_LIVE_CELLS = [
    """
import time
import keras, numpy as np
import keras_attention
from keras_attention.widgets import LiveAttention

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((6, 4)),
                          keras_attention.LuongAttention(score="general", name="att"),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
x = np.random.default_rng(0).normal(size=(32, 6, 4)).astype("float32")
y = x[:, :, :1].sum(axis=1)
live = LiveAttention(model, x[:2], every_n_batches=1, min_interval_s=0, overhead_budget=1.0)
live.widget
""",
    """
slow = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.5))
model.fit(x, y, batch_size=4, epochs=2, callbacks=[live, slow], verbose=0)
dump(weight=live._latest["att"][0].ravel().tolist(), title=live.figures["att"].title.text)
print("fit done")
""",
]

PRETRAINED = os.path.join(ROOT, "examples", "notebooks", "pretrained")


# The lecture's sentence and a notebook's pretrained translator, stepped as the shipped
# notebook does while the widget is shown: Python steps (each streamed to the page), then a
# forced alternative and Back (the alignment made shorter, then grown again).
def walk_cells(translator_file):
    return [
        f"""
import keras
from keras_attention.widgets import DecodingStepper
translator = keras.models.load_model({os.path.join(PRETRAINED, translator_file)!r})
stepper = DecodingStepper(translator, "il a m' entarté", top_k=4)
stepper.widget
""",
        """
for _ in range(3):
    stepper.next_token()
stepper.force(stepper.history[-1].candidates[1][0])
stepper.next_token()
stepper.back()
dump(tokens=[s.token for s in stepper.history], num_source=len(stepper.source_tokens))
""",
    ]


# examples/notebooks/decoding_stepper.ipynb as shipped, without its Transformer cells (they
# come after the first stepper and leave it alone): in Voila, where no one clicks, its first
# stepper is what a reader sees. Run beside its pretrained translators (a link to them). The
# test's own last cell (no output) dumps what the walk in the same page starts from.
def shipped_stepper_cells():
    with open(os.path.join(ROOT, "examples", "notebooks", "decoding_stepper.ipynb")) as handle:
        cells = json.load(handle)["cells"]
    return [
        "".join(cell["source"])
        for cell in cells
        if cell["cell_type"] == "code" and "TransformerTranslator" not in "".join(cell["source"])
    ] + ["dump(tokens=[s.token for s in stepper.history], num_source=len(stepper.source_tokens))"]


NOTEBOOKS = {
    "stepper": STEPPER_CELLS,
    # One page (one kernel) per front end for both: LiveAttention first (its replay slider
    # is the page's first), then the explorer.
    "live_and_explorer": LIVE_CELLS + EXPLORER_CELLS,
    "panels": PANELS_CELLS,
    "head_view": HEAD_VIEW_CELLS,
    "progressive_live": PROGRESSIVE_LIVE_CELLS,
    "walk": walk_cells("seed_seq2seq.keras"),
    "walk_transformer": walk_cells("seed_transformer.keras"),
    "shipped_stepper": shipped_stepper_cells(),
}


def column(name):
    return f"(data instanceof Map ? Array.from(data.get({name!r})) : Array.from(data[{name!r}]))"


def read_source(source_name, columns):
    """JS function returning `{column: [...]}` of the newest document holding `source_name`."""
    fields = ", ".join(f"{c}: {column(c)}" for c in columns)
    return f"""
() => {{
  if (!window.Bokeh || !window.Bokeh.documents) return null;
  const docs = window.Bokeh.documents;
  for (let i = docs.length - 1; i >= 0; i--) {{
    const source = docs[i].get_model_by_name({source_name!r});
    if (source) {{ const data = source.data; return {{{fields}}}; }}
  }}
  return null;
}}"""


READ_ALIGNMENT = read_source("alignment_source", ["weight", "row", "col", "y_token"])
READ_LIVE = read_source("heatmap_source", ["weight"])
# The title of the LiveAttention heatmap drawn last (it names the update shown).
READ_LIVE_TITLE = """
() => {
  if (!window.Bokeh || !window.Bokeh.documents) return null;
  const docs = window.Bokeh.documents;
  for (let i = docs.length - 1; i >= 0; i--) {
    if (!docs[i].get_model_by_name("heatmap_source")) continue;
    for (const model of docs[i].all_models) {
      if (model.title != null && model.renderers !== undefined) return model.title.text;
    }
  }
  return null;
}
"""
READ_DETAIL = """
() => {
  if (!window.Bokeh || !window.Bokeh.documents) return null;
  const docs = window.Bokeh.documents;
  for (let i = docs.length - 1; i >= 0; i--) {
    const source = docs[i].get_model_by_name("detail_source");
    if (!source) continue;
    const fig = docs[i].get_model_by_name("detail_figure");
    const data = source.data;
    const column = (name) => Array.from(data instanceof Map ? data.get(name) : data[name]);
    const axis = fig.above.find((r) => r.major_label_overrides !== undefined);  // x axis on top
    const overrides = axis.major_label_overrides;
    return {title: fig.title.text, weight: column("weight"), x_token: column("x_token"),
            x_labels: Array.from(
              overrides instanceof Map ? overrides.values() : Object.values(overrides)),
            x_end: fig.x_range.end, y_start: fig.y_range.start};
  }
  return null;
}
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterServer:
    """One `jupyter server` (JupyterLab, Notebook 7 and Voila extensions) on 127.0.0.1."""

    def __init__(self, root, *extra_args):
        self.root = root
        self.progressive = "--VoilaConfiguration.progressive_rendering=True" in extra_args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "KERAS_BACKEND": "tensorflow",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "JUPYTER_CONFIG_DIR": str(root / ".jupyter"),
            "JUPYTERLAB_WORKSPACES_DIR": str(root / ".ws"),
        }
        # No "get Jupyter news?" toast over the widgets in screenshots.
        labconfig = root / ".jupyter" / "labconfig"
        labconfig.mkdir(parents=True, exist_ok=True)
        (labconfig / "page_config.json").write_text(
            json.dumps(
                {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}
            )
        )
        self.log_path = root / ("server_progressive.log" if self.progressive else "server.log")
        # Open until stop(): the server writes to it for the whole test.
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "server",
                "--no-browser",
                "--allow-root",
                f"--ServerApp.port={self.port}",
                "--ServerApp.ip=127.0.0.1",
                "--ServerApp.port_retries=0",
                "--IdentityProvider.token=",
                "--ServerApp.password=",
                "--ServerApp.disable_check_xsrf=True",
                f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True",
                "--JupyterNotebookApp.expose_app_in_browser=True",
                "--VoilaConfiguration.show_tracebacks=True",
                # A finished test's kernel is stopped at once, not asked to exit and waited
                # for: its graceful exit (TensorFlow's teardown) took 1.3-2.5 s a page, 27
                # pages a run, and nothing the tests read is written at exit.
                "--KernelManager.shutdown_wait_time=0",
                *extra_args,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # the server answers, whatever it says
            except OSError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "jupyter server did not start: " + self.log_tail()
                    ) from error
                time.sleep(0.5)

    def log_tail(self):
        self.log.flush()
        return self.log_path.read_text()[-3000:]

    def shutdown_kernels(self):
        """Frees the kernels of a finished test (each holds TensorFlow, ~1 GB)."""
        with contextlib.suppress(OSError):
            for kernel in json.load(urllib.request.urlopen(f"{self.url}/api/kernels", timeout=10)):
                request = urllib.request.Request(
                    f"{self.url}/api/kernels/{kernel['id']}", method="DELETE"
                )
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(request, timeout=10)

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    if os.environ.get("KA_BROWSER_ARTIFACTS"):
        directory = pathlib.Path(os.environ["KA_BROWSER_ARTIFACTS"])
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = tmp_path_factory.mktemp("frontends")
    latencies = {}
    yield directory, latencies
    (directory / "latency.json").write_text(json.dumps(latencies, indent=1))
    print(f"\nbrowser artifacts (screenshots, latency.json): {directory}\n{json.dumps(latencies)}")


@pytest.fixture(scope="module")
def server(artifacts):
    directory, _ = artifacts
    server = JupyterServer(directory)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def progressive_server(artifacts):
    """A server whose Voila renders progressively, as examples/notebooks/voila.json asks."""
    directory, _ = artifacts
    with open(
        os.path.join(ROOT, "examples", "notebooks", "voila.json"), encoding="utf-8"
    ) as handle:
        options = json.load(handle)["VoilaConfiguration"]
    assert options == {"progressive_rendering": True}
    server = JupyterServer(directory, "--VoilaConfiguration.progressive_rendering=True")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_ARGS), headless=True
        )
        try:
            yield browser
        finally:
            browser.close()


class Run:
    """A notebook opened (and run) in one front end; `page` is its browser page."""

    def __init__(
        self,
        server,
        browser,
        artifacts,
        widget,
        front_end,
        width=1400,
        height=1000,
        label="",
        voila_theme=None,
    ):
        self.voila_theme = voila_theme  # Voila's theme is chosen by the URL (`?theme=dark`)
        self.directory, self.latencies = artifacts
        self.name = f"{widget}_{front_end}{label}"
        self.front_end = front_end
        self.dump = self.directory / f"{self.name}.json"
        self.dumps = {"": self.dump}
        for into in ("live", "explorer"):
            self.dumps[into] = self.directory / f"{self.name}_{into}.json"
        cells = [f"DUMP = {str(self.dump)!r}\n" + SETUP_CELL, *NOTEBOOKS[widget]]
        notebook = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(c.strip()) for c in cells]
        )
        notebook.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nbformat.write(notebook, str(self.directory / f"{self.name}.ipynb"))
        self.server = server
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.page.alerts = []
        self.page.on(
            "dialog", lambda dialog: (self.page.alerts.append(dialog.message), dialog.dismiss())
        )
        self.page.console_errors = []
        self.page.on(
            "console",
            lambda m: m.type in ("error", "warning") and self.page.console_errors.append(m.text),
        )
        self.page.on("pageerror", lambda e: self.page.console_errors.append(f"pageerror: {e}"))

    def open(self):
        """Opens the notebook; JupyterLab and Notebook 7 then run all its cells in the page."""
        page, path = self.page, f"{self.name}.ipynb"
        self.started = time.perf_counter()
        if self.front_end == "voila":
            # Progressive rendering streams the page while the cells run.
            query = f"?theme={self.voila_theme}" if self.voila_theme else ""
            page.goto(
                f"{self.server.url}/voila/render/{path}{query}",
                timeout=180_000,
                wait_until="commit" if self.server.progressive else "load",
            )
            return
        url = (
            f"{self.server.url}/lab/tree/{path}?reset"
            if self.front_end == "lab"
            else f"{self.server.url}/notebooks/{path}"
        )
        page.goto(url, timeout=180_000)
        page.wait_for_function(
            "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            " return !!(w && w.sessionContext && w.sessionContext.session"
            " && w.sessionContext.session.kernel); }",
            timeout=120_000,
        )
        page.evaluate(
            "async () => { const w = window.jupyterapp.shell.currentWidget;"
            " await w.sessionContext.ready;"
            " await window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
        )

    def kernel_state(self, ready=lambda state: True, timeout_s=120, into=""):
        deadline = time.monotonic() + timeout_s
        dump = self.dumps[into]
        while True:
            if dump.exists():
                state = json.loads(dump.read_text())
                if ready(state):
                    return state
            assert time.monotonic() < deadline, (
                f"the kernel never wrote the expected state ({self.name})"
            )
            time.sleep(0.2)

    def wait(self, expression, timeout_s=120):
        """Waits for a JS expression; returns the seconds it took."""
        start = time.perf_counter()
        self.page.wait_for_function(expression, timeout=timeout_s * 1000, polling=10)
        return time.perf_counter() - start

    def record(self, **seconds):
        self.latencies.setdefault(self.name, {}).update(
            {k: round(v, 3) for k, v in seconds.items()}
        )

    def screenshot(self, label="", widget=None):
        """The page's first widget, or `widget` (a locator)."""
        path = self.directory / f"{self.name}{label}.png"
        widget = widget or self.page.locator(".widget-vbox").first
        widget.scroll_into_view_if_needed()
        self.page.wait_for_timeout(300)
        widget.screenshot(path=str(path))
        return path

    def close(self):
        # The whole page as the test left it (the first thing to look at after a failure).
        with contextlib.suppress(Exception):
            self.page.screenshot(path=str(self.directory / f"{self.name}_page.png"))
        self.page.close()
        self.server.shutdown_kernels()


@pytest.fixture
def run(server, browser, artifacts):
    runs = []

    def start(widget, front_end, **options):
        runs.append(Run(server, browser, artifacts, widget, front_end, **options))
        runs[-1].open()
        return runs[-1]

    yield start
    for opened in runs:
        opened.close()


def test_make_tests_pages_cover_every_front_end_in_light_and_dark():
    covered = {(front_end, theme) for front_end, themes in KEPT_PAGES for theme in themes}
    assert covered == {(f, t) for f in FRONT_ENDS for t in ("light", "dark")}, KEPT_PAGES
    assert len(KEPT_PAGES) == 7  # the two Voila-only tests' entry, then six parametrized tests


def same_numbers(read, expected, atol=1e-6):
    """JS expression: `read()` returns `{weight: [...]}` equal to `expected` (flat)."""
    return (
        f"(() => {{ const d = ({read})(); const k = {json.dumps(np.ravel(expected).tolist())};"
        f" return d !== null && d.weight.length === k.length"
        f" && d.weight.every((v, i) => Math.abs(v - k[i]) < {atol}); }})()"
    )


def page_id(value):
    """Test ids: the themes one page is checked in, `light+dark`."""
    return "+".join(value) if isinstance(value, tuple) else None


def assert_no_script_ran(page):
    page.wait_for_timeout(300)
    assert page.alerts == []
    assert page.evaluate("document.querySelectorAll('img[onerror]').length") == 0


@pytest.mark.parametrize("front_end", matrix(FRONT_ENDS, "lab"))
def test_stepper_draws_the_steps_of_its_creating_cell_then_each_next(run, front_end):
    opened = run("stepper", front_end)
    kernel = opened.kernel_state()
    assert len(kernel["tokens"]) == 3 and kernel["tokens"][0] == MALICIOUS
    opened.wait(same_numbers(READ_ALIGNMENT, kernel["attention"]))
    opened.record(render_s=time.perf_counter() - opened.started)
    drawn = opened.page.evaluate(READ_ALIGNMENT)
    num_source = len(kernel["attention"][0])
    assert drawn["row"] == [r for r in range(3) for _ in range(num_source)]
    assert drawn["y_token"][::num_source] == kernel["tokens"]
    opened.screenshot()

    opened.page.get_by_role("button", name="Next token").click()
    next_s = opened.wait(f"({READ_ALIGNMENT})().row.length === {4 * num_source}")
    kernel = opened.kernel_state(lambda state: len(state["tokens"]) == 4)
    opened.wait(same_numbers(READ_ALIGNMENT, kernel["attention"]))
    drawn = opened.page.evaluate(READ_ALIGNMENT)
    # All four rows, not only the new one.
    assert drawn["row"] == [r for r in range(4) for _ in range(num_source)]
    assert drawn["y_token"][::num_source] == kernel["tokens"]
    opened.record(next_s=next_s)
    opened.screenshot("_next")
    # A click on candidate 1's row, right of its bar (p < 0.97: the bar ends before), forces it.
    alternative, probability = kernel["candidates"][-1][1]
    assert probability < 0.97
    opened.page.mouse.click(*bokeh_page.point_of(opened.page, "candidate_figure", 0.97, 1))
    tap_s = opened.wait(
        f"(() => {{ const d = ({READ_ALIGNMENT})(); return d.row.length === {4 * num_source}"
        f" && d.y_token[d.y_token.length - 1] === {json.dumps(alternative)}; }})()"
    )
    kernel = opened.kernel_state(
        lambda state: state["tokens"][-1] == alternative and len(state["tokens"]) == 4
    )
    opened.wait(same_numbers(READ_ALIGNMENT, kernel["attention"]))
    drawn = opened.page.evaluate(READ_ALIGNMENT)
    opened.record(tap_s=tap_s)
    # Play (the page's Play widget ticks, the kernel decodes) grows it further.
    opened.page.locator(".widget-play button").first.click()
    opened.wait(
        f"({READ_ALIGNMENT})().row.length >= {6 * num_source}"
        " || document.querySelector('button.mod-primary').disabled"
    )
    opened.page.locator(".widget-play button").nth(1).click()  # pause
    played = opened.page.evaluate(READ_ALIGNMENT)
    assert played["weight"][: 4 * num_source] == drawn["weight"]
    assert MALICIOUS in opened.page.inner_text("body")
    assert_no_script_ran(opened.page)


# Every glyph of the newest stepper document as BokehJS last set it (`data_size`, the
# rows of the cells, the bars' values) and placed it on screen (`sy`, `stop`, `sright`).
READ_PAINTED = """
() => {
  const docs = window.Bokeh?.documents ?? [];
  const doc = [...docs].reverse().find((d) => d.get_model_by_name("alignment_source"));
  if (!doc) return null;
  const finite = (a) => a === undefined || Array.from(a).every(Number.isFinite);
  return [...Bokeh.index.all_views()]
    .filter((v) => v.glyph && v.model.data_source && v.model.document === doc && v.model.visible)
    .map((v) => ({source: v.model.data_source.name, length: v.model.data_source.get_length(),
                  drawn: v.glyph.data_size, rows: Array.from(v.glyph.y ?? []),
                  bars: Array.from(v.glyph.top ?? v.glyph.right ?? []),
                  on_screen: [v.glyph.sy, v.glyph.stop, v.glyph.sright].every(finite)}));
}
"""


def assert_painted(page, rows, num_source):
    """Every alignment row and every bar is drawn from the source's current rows."""
    glyphs = page.evaluate(READ_PAINTED)
    assert glyphs, "no stepper glyph in the page"
    for glyph in glyphs:
        assert glyph["drawn"] == glyph["length"] and glyph["on_screen"], glyph
    alignment = [g for g in glyphs if g["source"] == "alignment_source"]
    assert len(alignment) == 1 and alignment[0]["length"] == rows * num_source, alignment
    assert sorted(set(alignment[0]["rows"])) == list(range(rows)), alignment[0]["rows"]
    bars = [g for g in glyphs if g["source"] in ("distribution_source", "candidate_source")]
    assert len(bars) >= 2 and all(len(g["bars"]) == g["length"] > 0 for g in bars), bars


# The Seq2Seq stepper in every front end, light and Dark; the Transformer's in Voila (its
# cheapest front end; the page's BokehJS code is the same for both translators). JupyterLab
# and Notebook 7 switch themes by command: one page (one kernel) walks in light, then again in
# Dark; Voila is served dark by its URL, a page of its own. Voila's light walk is taken on the
# shipped notebook's page (the same pretrained translator; one kernel, not two), below.
WALKS = [(f, ("light", "dark"), "walk") for f in ("lab", "notebook")] + [
    ("voila", ("dark",), "walk"),
    ("voila", ("light",), "walk_transformer"),
]


@pytest.mark.parametrize(
    ("front_end", "themes", "notebook"),
    matrix(WALKS, ("lab", ("light", "dark"), "walk")),
    ids=page_id,
)
def test_stepper_paints_every_row_after_reset_and_back(run, front_end, themes, notebook):
    served_dark = themes == ("dark",)
    opened = open_in_layout(run, notebook, front_end, 1280, DARK if served_dark else None)
    tokens = opened.kernel_state()["tokens"]
    assert tokens[:2] == ["he", "hit"] and len(tokens) == 3  # the 3rd forced
    try:
        rows = 3  # the notebook's steps
        for theme in themes:
            if theme == "dark" and not served_dark:
                switch_theme(opened.page, DARK)
            rows = walk_reset_next_back_next(opened, rows)
            if theme == "dark":  # every label readable on the dark background (WCAG 3:1), no frames
                bokeh_page.assert_text_contrasts(opened.page)
                bokeh_page.assert_no_frames(opened.page)
    finally:
        if "dark" in themes:
            restore_light_theme(opened)


def walk_reset_next_back_next(opened, drawn_rows):
    """From `drawn_rows` rows on the page: Reset, Next token until the end, Back, Next token;
    every row and bar painted after each click. Returns the rows drawn at the end."""
    num_source, page = opened.kernel_state()["num_source"], opened.page
    rows_are = f"(() => {{ const d = ({READ_ALIGNMENT})(); return d !== null && d.row.length === "

    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    def click_and_check(name, rows):
        page.get_by_role("button", name=name).click()
        with contextlib.suppress(PlaywrightTimeout):  # assert_painted says what was drawn
            opened.wait(f"{rows_are}{rows * num_source}; }})()", timeout_s=30)
        page.wait_for_timeout(300)  # BokehJS paints on the next frame
        assert_painted(page, rows, num_source)

    opened.wait(f"{rows_are}{drawn_rows * num_source}; }})()")
    assert_painted(page, drawn_rows, num_source)
    click_and_check("Reset", 0)
    rows, next_button = 0, page.get_by_role("button", name="Next token")
    while not next_button.is_disabled():
        rows += 1
        click_and_check("Next token", rows)
        assert rows <= 10
    # The greedy translation of the lecture's sentence, every row coloured.
    drawn = opened.page.evaluate(READ_ALIGNMENT)
    assert drawn["y_token"][::num_source] == ["he", "hit", "me", "with", "a", "pie", "<end>"]
    click_and_check("Back", rows - 1)
    click_and_check("Next token", rows)
    opened.screenshot("_walk")
    return rows


def test_voila_first_shows_the_greedy_translation_with_the_lectures_alignment(run, artifacts):
    """The shipped stepper notebook in Voila, where no one clicks: what the page draws once
    every cell ran is the greedy translation and its alignment (a later cell forces a
    candidate and steps back; the first picture was a forced "he hit you", #42). Then, on the
    same page, the walk the other front ends take (Reset, Next token to the end, Back, Next)."""
    directory, _ = artifacts
    if not (directory / "pretrained").exists():
        (directory / "pretrained").symlink_to(PRETRAINED, target_is_directory=True)
    opened = run("shipped_stepper", "voila", width=1280, height=900)
    tokens = ["he", "hit", "me", "with", "a", "pie", "<end>"]
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with contextlib.suppress(PlaywrightTimeout):  # the assertions below say what was drawn
        opened.wait(f"({READ_ALIGNMENT})()?.row.length === {len(tokens) * 4}", timeout_s=60)
    opened.page.wait_for_timeout(300)  # BokehJS paints on the next frame
    drawn = opened.page.evaluate(READ_ALIGNMENT)
    assert drawn["y_token"][::4] == tokens
    assert_painted(opened.page, len(tokens), 4)
    # The lecture's alignment, read from the page: each word's row peaks at its source word.
    weights = np.reshape(drawn["weight"], (len(tokens), 4))
    source = ["il", "a", "m'", "entarté"]
    peaks = {token: source[int(np.argmax(row))] for token, row in zip(tokens, weights, strict=True)}
    expected = {"he": "il", "hit": "entarté", "me": "m'", "pie": "entarté"}
    assert {token: peaks[token] for token in expected} == expected, peaks
    title = opened.page.evaluate(f"({bokeh_page.MODEL})('candidate_figure').title.text")
    assert title.startswith("4. Prediction") and "(forced)" not in title, title
    opened.screenshot()
    assert opened.kernel_state()["tokens"] == tokens
    walk_reset_next_back_next(opened, len(tokens))


def check_explorer_draws_the_head_chosen_in_its_creating_cell_then_each_choice(opened):
    # The outermost box holding the layer menu: the explorer's (for its screenshots).
    explorer_widget = opened.page.locator(
        ".widget-vbox", has=opened.page.get_by_label("layer")
    ).first
    weights = {
        name: np.asarray(w) for name, w in opened.kernel_state(into="explorer")["weights"].items()
    }
    assert weights["mha"].shape == (4, 5, 5) and weights["luong"].shape == (1, 5, 5)

    def shows(title, matrix):
        return (
            f"(() => {{ const d = ({READ_DETAIL})();"
            f" return d !== null && d.title === {json.dumps(title)}"
            f" && {same_numbers(READ_DETAIL, matrix)}; }})()"
        )

    # The first draw (the latency of the page's first draw is recorded by the live check).
    opened.wait(shows("mha, head 2", weights["mha"][2]))
    # The bars preview the first query before any hover (the panel was empty, #42).
    opened.wait("(" + bokeh_page.MODEL + ")('head_view_bars').get_length() === 5", timeout_s=30)
    detail = opened.page.evaluate(READ_DETAIL)
    tokens = ["a", "b", MALICIOUS, "d", "e"]
    assert detail["x_token"][:5] == tokens and detail["x_labels"] == tokens
    assert (detail["x_end"], detail["y_start"]) == (4.5, 4.5)
    opened.screenshot("_explorer", widget=explorer_widget)

    opened.page.get_by_label("layer").select_option("luong")
    choice_s = opened.wait(shows("luong, head 0", weights["luong"][0]))
    opened.record(layer_choice_s=choice_s)
    assert opened.page.evaluate(READ_DETAIL)["x_labels"] == tokens
    opened.page.get_by_label("layer").select_option("mha")
    opened.wait(shows("mha, mean of heads", weights["mha"].mean(axis=0)))
    # Model view: a click on thumbnail (mha, head 3) goes to the kernel, which draws that head.
    page = opened.page
    page.mouse.click(*bokeh_page.thumbnail_point(page, 3))
    click_s = opened.wait(shows("mha, head 3", weights["mha"][3]))
    opened.wait(
        "(" + bokeh_page.MODEL + ")('model_view_source').selected.indices.join() === '3'"
    )  # outlined
    opened.record(thumbnail_click_s=click_s)
    # Head view (in the page's BokehJS): hovering query "b" highlights its row, the bars show
    # its weights.
    start = time.perf_counter()
    page.mouse.move(*bokeh_page.token_point(page, 1))
    opened.wait(
        "(() => { const s = ("
        + bokeh_page.MODEL
        + ")('detail_source'); return s.selected.indices.join() === "
        + json.dumps(",".join(str(i) for i in range(5, 10)))
        + "; })()"
    )
    opened.record(token_hover_s=time.perf_counter() - start)
    np.testing.assert_allclose(
        bokeh_page.column(page, "head_view_bars", "weight"), weights["mha"][3][1], atol=1e-6
    )
    # A click on key "d" keeps its column, also for the next head the kernel draws.
    page.mouse.click(*bokeh_page.token_point(page, 3, side="key"))
    page.mouse.move(5, 5)
    opened.wait(
        "(() => { const s = ("
        + bokeh_page.MODEL
        + ")('detail_source'); return s.selected.indices.join() === "
        "'3,8,13,18,23'; })()"
    )
    page.mouse.click(*bokeh_page.thumbnail_point(page, 0))
    opened.wait(shows("mha, head 0", weights["mha"][0]))
    read_bars = (
        "() => { const d = (" + bokeh_page.MODEL + ")('head_view_bars').data;"
        " return {weight: Array.from(d instanceof Map ? d.get('weight') : d.weight)}; }"
    )
    opened.wait(same_numbers(read_bars, weights["mha"][0][:, 3]))
    opened.screenshot("_head_view", widget=explorer_widget)
    # Rollout, from the layer menu: the kernel's rollout of the captured weights.
    rollout = opened.kernel_state(into="explorer")["rollout"]
    page.get_by_label("layer").select_option("rollout (all layers)")
    opened.wait(shows("rollout (all layers), mean of heads", rollout))
    # A click on the head grid's (mha, head 1) masks it in the kernel: the loss, the grid's
    # cross and the maps (luong's input changed, so the rollout did) follow in the page.
    opened.dumps["explorer"].unlink()
    start = time.perf_counter()
    page.mouse.click(*bokeh_page.point_of(page, "head_importance_figure", 1, 0))
    kernel = opened.kernel_state(lambda state: state["masked"] == [["mha", 1]], into="explorer")
    assert not np.allclose(kernel["rollout"], rollout, atol=1e-4)
    opened.wait(shows("rollout (all layers), mean of heads", kernel["rollout"]))
    opened.record(head_mask_click_s=time.perf_counter() - start)
    opened.wait(f"document.body.innerText.includes('loss {kernel['loss']:.4f} (1 head masked')")
    opened.wait("(" + bokeh_page.MODEL + ")('head_mask_source').get_length() === 1")
    # The model view crosses it out too, and the widget says what it changed: the map after
    # it, and the output (unmasked beside masked), since its own map stays (#52).
    opened.wait("(" + bokeh_page.MODEL + ")('model_view_mask_source').get_length() === 1")
    opened.wait(
        "document.body.innerText.includes('the maps of the 1 layer after mha (luong) change')"
        " && document.querySelectorAll('table.prediction tr').length === 2"
    )
    opened.screenshot("_masked", widget=explorer_widget)
    assert_no_script_ran(page)


WATCH = """
(read) => {
  // Records every distinct state of the heatmap the page shows.
  window.__states = [];
  let last = null;
  window.__watch = setInterval(() => {
    const now = read();
    const key = JSON.stringify(now && now.weight);
    if (now && key !== last) { window.__states.push(now.weight); last = key; }
  }, 20);
}
"""


@pytest.mark.parametrize("front_end", matrix(FRONT_ENDS, "notebook"))
def test_live_attention_and_explorer_draw_their_creating_cells_then_follow_the_page(run, front_end):
    """LiveAttention, then the AttentionExplorer, in one page and kernel per front end: the
    checks are each widget's own (they read their own Bokeh sources and kernel dumps)."""
    opened = run("live_and_explorer", front_end)
    check_live_attention_draws_the_end_of_its_creating_cell_then_redraws_while_training(opened)
    check_explorer_draws_the_head_chosen_in_its_creating_cell_then_each_choice(opened)


def check_live_attention_draws_the_end_of_its_creating_cell_then_redraws_while_training(opened):
    kernel = opened.kernel_state(into="live")
    assert (
        kernel["updates"] == 16
    )  # 2 epochs of 8 batches: before batches 2..8 and at each epoch end
    opened.wait(same_numbers(READ_LIVE, kernel["weight"]))
    opened.record(live_render_s=time.perf_counter() - opened.started)
    opened.screenshot("_live")
    opened.dumps["live"].unlink()

    opened.page.evaluate(f"({WATCH})({READ_LIVE})")
    # exact: Lab's file browser lists a folder "pretrained", which "Train" matches otherwise.
    opened.page.get_by_role("button", name="Train", exact=True).click()
    kernel = opened.kernel_state(into="live")
    assert kernel["updates"] == 32
    opened.wait(same_numbers(READ_LIVE, kernel["weight"]), timeout_s=30)
    # The last frame shown is the last epoch's: weights and the title that names the update.
    assert kernel["title"].startswith("att · epoch 2 end"), kernel["title"]
    opened.wait(f"({READ_LIVE_TITLE})() === {json.dumps(kernel['title'])}", timeout_s=30)
    opened.page.evaluate("clearInterval(window.__watch)")
    seen = opened.page.evaluate("window.__states")
    # The page showed states between the first and the last: it redrew
    # during training, not only at the end.
    assert len(seen) >= 4, len(seen)
    for heatmap in seen:
        np.testing.assert_allclose(np.reshape(heatmap, (6, 6)).sum(axis=1), 1.0, atol=1e-5)
    # After fit, the replay slider goes back to the first frame (before any training).
    assert kernel["frames"] == 33
    handle = opened.page.locator(".widget-slider .noUi-handle").first
    handle.focus()
    handle.press("Home")
    replay_s = opened.wait(same_numbers(READ_LIVE, kernel["first"]), timeout_s=30)
    opened.record(replay_s=replay_s)


def test_voila_shows_live_attention_while_the_next_cell_trains(
    progressive_server, browser, artifacts
):
    opened = Run(progressive_server, browser, artifacts, "progressive_live", "voila")
    try:
        opened.open()
        drawn_s = opened.wait(f"({READ_LIVE})() !== null", timeout_s=180)
        # Drawn while `fit` (16 batches of >= 0.5 s: 8 s for the page to draw it) still runs:
        # the dump comes after it.
        assert not opened.dump.exists(), "the widget appeared only after training"
        opened.page.evaluate(f"({WATCH})({READ_LIVE})")
        kernel = opened.kernel_state(timeout_s=120)
        opened.wait(same_numbers(READ_LIVE, kernel["weight"]), timeout_s=30)
        opened.wait(f"({READ_LIVE_TITLE})() === {json.dumps(kernel['title'])}", timeout_s=30)
        opened.page.evaluate("clearInterval(window.__watch)")
        seen = opened.page.evaluate("window.__states")
        assert len(seen) >= 4, len(seen)  # it redrew during training
        opened.record(first_draw_s=time.perf_counter() - opened.started, waited_s=drawn_s)
    finally:
        opened.close()


# Every stepper document of the page: each stage panel's range, visibility,
# title and data, read from Bokeh's models as drawn.
READ_STEPPERS = """
() => {
  if (!window.Bokeh || !window.Bokeh.documents) return [];
  const steppers = [];
  for (const doc of window.Bokeh.documents) {
    const alignment = doc.get_model_by_name("alignment_source");
    if (!alignment) continue;
    const columns = (source) => { const d = source.data; const out = {};
      for (const [k, v] of (d instanceof Map ? d.entries() : Object.entries(d))) {
        out[k] = Array.from(v);
      }
      return out; };
    const panel = (figure_name, source_name) => {
      const fig = doc.get_model_by_name(figure_name), source = doc.get_model_by_name(source_name);
      if (!fig) return null;
      return {visible: fig.visible, title: fig.title.text, height: fig.height,
              x: [fig.x_range.start, fig.x_range.end], y: [fig.y_range.start, fig.y_range.end],
              data: columns(source)};
    };
    const weighted = panel("weighted_sum_figure", "weighted_sum_source");
    steppers.push({
      alignment: panel("alignment_figure", "alignment_source"),
      scores: panel("scores_figure", "scores_source"),
      distribution: panel("distribution_figure", "distribution_source"),
      weighted: weighted,
      candidate: panel("candidate_figure", "candidate_source"),
    });
  }
  return steppers;
}
"""


# [name, drawn width in px, min_width] of every stage panel that stretches to its cell.
READ_PANEL_WIDTHS = """
() => [...Bokeh.index.all_views()].filter((view) => view.model.sizing_mode === "stretch_width"
    && ["scores_figure", "distribution_figure", "candidate_figure"].includes(view.model.name))
  .map((view) => [view.model.name, view.el.getBoundingClientRect().width, view.model.min_width])
"""


def by_translator(steppers):
    """`{"seq2seq": ..., "transformer": ...}`: the Transformer's alignment names its layer."""
    found = {
        ("transformer" if "layer" in s["alignment"]["title"] else "seq2seq"): s for s in steppers
    }
    assert len(found) == 2, [s["alignment"]["title"] for s in steppers]
    return found


# Every plot's background and border colours, as the page holds them.
READ_BACKGROUNDS = """
() => {
  const out = [];
  for (const doc of window.Bokeh.documents) {
    for (const model of doc.all_models) {
      if (model.renderers !== undefined && "border_fill_color" in model.properties) {
        out.push([String(model.background_fill_color), String(model.border_fill_color)]);
      }
    }
  }
  return out;
}
"""


def assert_backgrounds(page, dark):
    """Every plot on the page is painted for the page's theme (white cards in Dark were the bug)."""
    colours = page.evaluate(READ_BACKGROUNDS)
    assert colours, "no Bokeh plot on the page"
    # Fills are transparent ("null") on the front end's own background, or white in light.
    white = [c for pair in colours for c in pair if c.lower() in ("#ffffff", "white")]
    light = [c for pair in colours for c in pair if c.lower() in ("#ffffff", "white", "null")]
    assert (not white) if dark else len(light) == 2 * len(colours), colours


def assert_holds(span, values, what):
    low, high = min(span), max(span)
    assert low <= min(values) and max(values) <= high, (
        f"{what}: range {span} does not hold {min(values)}..{max(values)}"
    )


def assert_stepper_panels_drawn(stepper, rows, transformer):
    """Every stage panel visible, non-empty, and its range holds its data."""
    stages = ["scores", "distribution", "weighted", "candidate"]
    for name in stages:
        panel = stepper[name]
        assert panel is not None and panel["visible"], f"stage panel {name} is missing or hidden"
        values = panel["data"].get("weight") or panel["data"].get("probability")
        assert values and any(abs(v) > 0 for v in values), f"stage panel {name} is empty"
        assert panel["title"].split(".")[0] in "1234" and "'" in panel["title"], panel["title"]
    assert_holds(stepper["scores"]["y"], stepper["scores"]["data"]["weight"], "scores y")
    # ... and fits them (a range left at another step's, or at [-1, 1], clips or flattens the bars).
    scores = stepper["scores"]["data"]["weight"]
    extent = max(0.0, max(scores)) - min(0.0, min(scores))
    assert max(stepper["scores"]["y"]) - min(stepper["scores"]["y"]) <= 1.25 * extent, (
        stepper["scores"]["y"],
        extent,
    )
    assert_holds(stepper["scores"]["x"], stepper["scores"]["data"]["position"], "scores x")
    assert_holds(
        stepper["distribution"]["y"], stepper["distribution"]["data"]["weight"], "distribution y"
    )
    assert_holds(
        stepper["candidate"]["x"], stepper["candidate"]["data"]["probability"], "candidate x"
    )
    assert_holds(stepper["candidate"]["y"], stepper["candidate"]["data"]["rank"], "candidate y")
    weighted = stepper["weighted"]["data"]
    assert_holds(stepper["weighted"]["y"], weighted["row"], "weighted-sum rows")
    assert_holds(stepper["weighted"]["x"], weighted["col"], "weighted-sum columns")
    alignment = stepper["alignment"]
    assert sorted(set(alignment["data"]["row"])) == list(range(rows))
    # The rows decoded fill the heatmap: no row clipped, none blank.
    assert sorted(alignment["y"]) == [-0.5, rows - 0.5], alignment["y"]
    assert_holds(alignment["x"], alignment["data"]["col"], "alignment columns")


DARK = "JupyterLab Dark"
# (front end, themes): each page opens at 1280 px in light; the panels test then widens the
# same page to 1920 px (one kernel run per layout, not two), and in JupyterLab switches the
# same page to Dark and checks it again (and back to light).
PANEL_PAGES = [("lab", ("light", "dark")), ("notebook", ("light",)), ("voila", ("light",))]
# Light and dark in every front end: JupyterLab and Notebook 7 switch by command, so one page
# (one kernel) is checked in light, then in Dark (and light again); Voila is served dark by its
# URL and cannot switch back, a page of its own.
THEMED_PAGES = [(f, ("light", "dark")) for f in ("lab", "notebook")] + [
    ("voila", ("light",)),
    ("voila", ("dark",)),
]
WIDE = {"width": 1920, "height": 1080}


def open_in_layout(run, notebook, front_end, width, theme):
    label = f"_{width}" + ("_dark" if theme else "")
    voila_dark = front_end == "voila" and theme is not None
    opened = run(
        notebook,
        front_end,
        width=width,
        height=900 if width == 1280 else 1080,
        label=label,
        voila_theme="dark" if voila_dark else None,
    )
    if voila_dark:  # the page is served dark; nothing to switch or restore
        opened.page.wait_for_function(
            "document.body.dataset.jpThemeLight === 'false'", timeout=60_000
        )
    elif theme:
        switch_theme(opened.page, theme)
    return opened


def switch_theme(page, theme):
    """JupyterLab's or Notebook 7's theme command; waits until the page is dark."""
    page.evaluate(
        f"() => window.jupyterapp.commands.execute('apputils:change-theme', {{theme: {theme!r}}})"
    )
    page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=60_000)


def restore_light_theme(opened):
    if opened.front_end == "voila":
        return  # served dark by its URL; the page is closed after the test
    opened.page.evaluate(
        "() => window.jupyterapp.commands.execute('apputils:change-theme',"
        " {theme: 'JupyterLab Light'})"
    )
    opened.page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=60_000)


def assert_panels_sized(page, wide):
    """The bar panels size to the cell: never below the width their labels were counted for,
    and on a 1920 px page well above it (they were fixed at 400 px, ~40% of the page)."""
    drawn = page.evaluate(READ_PANEL_WIDTHS)
    assert len(drawn) == 6, drawn  # scores, distribution, prediction of both steppers
    for name, width_px, designed in drawn:
        assert width_px >= designed - 1, (name, width_px, designed, page.viewport_size)
        if wide:
            assert width_px >= 1.25 * designed, (name, width_px, designed, page.viewport_size)


@pytest.mark.parametrize(
    ("front_end", "themes"), matrix(PANEL_PAGES, ("lab", ("light", "dark"))), ids=page_id
)
def test_every_stepper_panel_holds_its_data_for_both_translators(run, front_end, themes):
    opened = open_in_layout(run, "panels", front_end, 1280, None)
    try:
        kernel = opened.kernel_state()
        assert kernel["tokens"] == [["he", "hit", "me"]] * 2
        opened.wait(
            f"({READ_STEPPERS})().length === 2 && ({READ_STEPPERS})().every("
            "(s) => new Set(s.alignment.data.row).size === 3)"
        )
        rows = 3  # the Seq2Seq stepper's; one more each time a step is taken in the page
        for theme in themes:
            if theme == "dark":
                switch_theme(opened.page, DARK)
                opened.page.wait_for_timeout(500)  # BokehJS repaints on the next frame
            rows = check_panels(opened, rows, dark=theme == "dark")
    finally:
        if "dark" in themes:
            restore_light_theme(opened)
    if "dark" in themes:  # and back to light when the theme is switched back
        opened.wait(
            f"({READ_BACKGROUNDS})().every(([a, b]) => [a, b].every("
            "(c) => c === '#ffffff' || c === 'null'))",
            timeout_s=30,
        )
    assert_no_script_ran(opened.page)


def check_panels(opened, rows, dark):
    """Both steppers' panels as drawn (the Seq2Seq one at `rows` rows), then after a step
    taken in the page (Next token in light; Back in Dark, where the untrained Seq2Seq
    translator may have ended its sentence), at 1280 px and widened to 1920 px. Returns the
    Seq2Seq rows now."""
    steppers = by_translator(opened.page.evaluate(READ_STEPPERS))
    for name, stepper in steppers.items():
        assert_stepper_panels_drawn(
            stepper, rows if name == "seq2seq" else 3, name == "transformer"
        )
    # Both steppers' every axis and title, as painted: no overlapping tick labels, nothing cut.
    text_boxes.assert_legible(opened.page, minimum_axes=20)
    # After a step taken in the page, the ranges are the new step's.
    button, rows = ("Back", rows - 1) if dark else ("Next token", rows + 1)
    opened.page.get_by_role("button", name=button).first.click()
    opened.wait(
        f"({READ_STEPPERS})().some((s) => !s.alignment.title.includes('layer')"
        f" && new Set(s.alignment.data.row).size === {rows})"
    )
    opened.page.wait_for_timeout(500)
    assert_stepper_panels_drawn(
        by_translator(opened.page.evaluate(READ_STEPPERS))["seq2seq"], rows, False
    )
    assert_backgrounds(opened.page, dark=dark)
    if dark:
        bokeh_page.assert_text_contrasts(opened.page)
    assert_panels_sized(opened.page, wide=False)
    save_stepper_figures(opened, dark)
    # The same page widened to 1920 px: the panels follow the cell, and stay legible.
    viewport = opened.page.viewport_size
    opened.page.set_viewport_size(WIDE)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    with contextlib.suppress(PlaywrightTimeout):  # the assertion below says what was drawn
        opened.wait(
            f"({READ_PANEL_WIDTHS})().every(([name, drawn, designed]) => drawn >= 1.25 * designed)",
            timeout_s=30,
        )
    opened.page.wait_for_timeout(500)
    assert_panels_sized(opened.page, wide=True)
    text_boxes.assert_legible(opened.page, minimum_axes=20)
    opened.page.set_viewport_size(viewport)
    return rows


def save_stepper_figures(opened, theme):
    """Screenshots of both steppers, in the artifacts (docs/figures' are `make figures`')."""
    widgets, page = opened.page.locator(".widget-vbox"), opened.page
    viewport = page.viewport_size
    for index, name in enumerate(("decoding_stepper", "transformer_stepper")):
        widget = widgets.nth(index)
        # A window tall enough for the whole widget (the notebook panel scrolls inside the page).
        page.set_viewport_size(
            {"width": viewport["width"], "height": int(widget.bounding_box()["height"]) + 400}
        )
        widget.scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        file_name = f"{name}_1280{'_dark' if theme else ''}.png"
        widget.screenshot(path=str(opened.directory / f"{opened.name}_{file_name}"))
    page.set_viewport_size(viewport)


# Every head view of the page: its range, height and tokens, and the lines' ends.
READ_HEAD_VIEWS = """
() => {
  if (!window.Bokeh || !window.Bokeh.documents) return [];
  const views = [];
  for (const doc of window.Bokeh.documents) {
    const fig = doc.get_model_by_name("head_view_figure");
    if (!fig) continue;
    const column = (source, name) => {
      const d = source.data;
      return Array.from(d instanceof Map ? d.get(name) : d[name]);
    };
    const tokens = doc.get_model_by_name("head_view_tokens");
    const detail = doc.get_model_by_name("detail_source");
    views.push({y: [fig.y_range.start, fig.y_range.end], height: fig.height,
                side: column(tokens, "side"), position: column(tokens, "position"),
                token: column(tokens, "token"),
                rows: column(detail, "row"), cols: column(detail, "col")});
  }
  return views;
}
"""


# Every overview drawn: [name, drawn width, designed width, right edge, its widget's right edge].
READ_OVERVIEW_FIT = """
() => {
  const widget = (el) => {  // the explorer's box, across BokehJS' shadow roots
    for (let e = el; e; e = e.parentElement ?? e.getRootNode()?.host) {
      if (e.classList?.contains("widget-vbox")) return e;
    }
    return document.body;
  };
  return [...Bokeh.index.all_views()]
    .filter((v) => String(v.model.name).startsWith("overview") && v.model.visible
      && v.el.getBoundingClientRect().width > 0)
    .map((v) => { const r = v.el.getBoundingClientRect();
      return [v.model.name, r.width, v.model.width, r.right,
              widget(v.el).getBoundingClientRect().right]; });
}
"""


# Every head grid drawn: [layers, heads, masked heads, whether a colour bar (importance) is drawn].
READ_HEAD_GRIDS = """
() => [...Bokeh.index.all_views()]
  .filter((v) => v.model.name === "head_importance_figure"
    && v.el.getBoundingClientRect().width > 0)
  .map((v) => { const doc = v.model.document, cells = doc.get_model_by_name(
      "head_importance_source"), marks = doc.get_model_by_name("head_mask_source");
    const column = (s, n) => Array.from(s.data instanceof Map ? s.data.get(n) : s.data[n]);
    return [new Set(column(cells, "layer")).size, new Set(column(cells, "head")).size,
            marks.get_length(), doc.get_model_by_name("head_importance_color_bar") !== null]; })
"""

# Records whether the explorer's info line ever said it was computing (rollout's first pick):
# every text the page adds is looked at, so a message replaced at once still counts.
WATCH_FOR_PROGRESS = """
() => {
  window.__progress_shown = false;
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.addedNodes) {
        if ((node.textContent || "").includes("computing it from")) window.__progress_shown = true;
      }
    }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}
"""

# Per explorer: the bottoms (px) of its detail heatmap, the bars under it and the head
# view, and the head view's height.
READ_DETAIL_BOTTOMS = """
() => {
  const box = (doc, name) => [...Bokeh.index.all_views()]
    .filter((v) => v.model.document === doc && v.model.name === name)
    .map((v) => v.el.getBoundingClientRect())[0];
  return window.Bokeh.documents.filter((d) => d.get_model_by_name("detail_source"))
    .map((d) => [box(d, "detail_figure").bottom, box(d, "head_view_bars_figure").bottom,
                 box(d, "head_view_figure").bottom, box(d, "head_view_figure").height]);
}
"""


@pytest.mark.parametrize(
    ("front_end", "themes"), matrix(THEMED_PAGES, ("notebook", ("light", "dark"))), ids=page_id
)
def test_the_head_view_has_one_label_per_token_on_first_draw(run, front_end, themes):
    served_dark = themes == ("dark",)
    opened = open_in_layout(run, "head_view", front_end, 1280, DARK if served_dark else None)
    try:
        opened.kernel_state()
        # The token labels arrive with the kernel's first frame, which a loaded
        # machine may deliver after the documents (CI: empty at 500 ms once).
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            opened.wait(
                f"(() => {{ const v = ({READ_HEAD_VIEWS})(); "
                "return v.length === 2 && v.every((x) => x.position.length > 0); })()",
                timeout_s=60,
            )
        except PlaywrightTimeout:
            views = opened.page.evaluate(READ_HEAD_VIEWS)
            raise AssertionError(
                "head views (labels, detail cells) on the page: "
                + str([(len(v["position"]), len(v["rows"])) for v in views])
                + "; documents: "
                + str(opened.page.evaluate("window.Bokeh ? window.Bokeh.documents.length : -1"))
                + "; widget boxes: "
                + str(opened.page.locator(".widget-vbox").count())
                + "; console: "
                + str(opened.page.console_errors[-20:])
            ) from None
        opened.page.wait_for_timeout(500)  # nothing touched: this is the first draw
        for theme in themes:  # ... in each theme (nothing touched but the theme)
            if theme == "dark" and not served_dark:
                switch_theme(opened.page, DARK)
                opened.page.wait_for_timeout(500)  # BokehJS repaints on the next frame
            assert_head_views_first_draw(opened, dark=theme == "dark")
        # The new views of #38, as painted, in the long explorer: its rollout (a window
        # and an overview), beside the head grids (the short explorer's with its loss).
        opened.page.evaluate(WATCH_FOR_PROGRESS)
        opened.page.get_by_label("layer").nth(1).select_option("rollout (all layers)")
        opened.wait(
            f"({READ_DETAIL})()?.title === 'rollout (all layers), mean of heads'", timeout_s=60
        )
        # The first pick said it was computing (3.7 s with no sign of work for long inputs, #52).
        assert opened.page.evaluate("window.__progress_shown") is True
        for theme in reversed(themes):  # Dark first where the page is dark now
            if theme == "light" and "dark" in themes:
                restore_light_theme(opened)
            assert_rollout_drawn(opened, dark=theme == "dark")
    finally:
        if "dark" in themes:
            restore_light_theme(opened)
    assert_no_script_ran(opened.page)


def assert_head_views_first_draw(opened, dark):
    views = opened.page.evaluate(READ_HEAD_VIEWS)
    for view, length in zip(views, (10, 64), strict=True):
        low, high = min(view["y"]), max(view["y"])
        for side in ("query", "key"):
            positions = [
                p for s, p in zip(view["side"], view["position"], strict=True) if s == side
            ]
            assert positions == list(range(length))
            # Every token's label is inside the drawn range (one label per token, none cut) ...
            shown = [p for p in positions if low < p < high]
            assert shown == positions, (
                f"{side} labels drawn: {len(shown)} of {length} (range {view['y']})"
            )
        # ... with room for it (9pt labels, at least 12 px a row) ...
        assert view["height"] / (high - low) >= 12, (view["height"], view["y"])
        # ... and every line starts and ends inside the panel.
        assert all(low < v < high for v in view["rows"] + view["cols"])
    # Every explorer panel (detail heatmap, head view, model view) legible as painted ...
    text_boxes.assert_legible(opened.page, minimum_axes=10)
    if dark:  # ... its labels readable on the dark background (WCAG 3:1), no framed boxes
        bokeh_page.assert_text_contrasts(opened.page)
        bokeh_page.assert_no_frames(opened.page)
    screenshot = opened.page.locator(".widget-vbox").nth(1)
    screenshot.scroll_into_view_if_needed()
    suffix = "_dark" if dark and not opened.name.endswith("_dark") else ""
    screenshot.screenshot(path=str(opened.directory / f"{opened.name}{suffix}_long.png"))
    # The long explorer's overview keeps its width and stays inside the widget's box
    # (it was squeezed to 55 px and cut at the right beside the file browser, #42).
    opened.wait(f"({READ_OVERVIEW_FIT})().length === 1", timeout_s=30)
    overviews = opened.page.evaluate(READ_OVERVIEW_FIT)
    for _name, drawn, designed, right, box_right in overviews:
        assert drawn >= designed - 1 and right <= box_right + 1, overviews


def assert_rollout_drawn(opened, dark):
    opened.wait(f"({READ_OVERVIEW_FIT})().length === 1", timeout_s=30)
    opened.page.wait_for_timeout(500)
    grids = opened.page.evaluate(READ_HEAD_GRIDS)
    assert sorted(grids) == [[2, 2, 0, False], [2, 2, 0, True]], grids
    assert "loss " in opened.page.inner_text("body")
    text_boxes.assert_legible(opened.page, minimum_axes=14)
    if dark:
        bokeh_page.assert_text_contrasts(opened.page)
    # No empty area under the long window's heatmap: with the bars under it, it ends
    # where the tall head view beside it ends (#42).
    bottoms = opened.page.evaluate(READ_DETAIL_BOTTOMS)
    tall = [b for b in bottoms if b[3] >= 64 * 15]
    assert len(tall) == 1, bottoms
    for detail, bars, view, _height in tall:
        assert detail < bars and abs(bars - view) <= 4, bottoms
    opened.screenshot("_rollout_dark" if dark and not opened.name.endswith("_dark") else "_rollout")


# A causal LM's stepper (#52): the tiny windowed Gemma of tests/causal_lms.py
# (layer 0 a 3-slot ring, layer 1 a full cache), four steps taken in the
# creating cell; Next and Back dump what the kernel holds.
CAUSAL_CELLS = [
    f"""
import sys
sys.path.insert(0, {ROOT!r})
from tests.causal_lms import gemma_causal_lm
from keras_attention.interchange.keras_hub_models import replace_keras_hub_attention
from keras_attention.widgets import DecodingStepper
lm = gemma_causal_lm(0, 12, sliding_window=3)
replace_keras_hub_attention(lm)
stepper = DecodingStepper(lm, "keras", max_length=12, top_k=3)

def dump_causal(_=None):
    step = stepper.history[-1]
    dump(position=stepper.position, text=stepper.output_text,
         positions=[view.positions.tolist() for view in step.caches],
         written=[view.written_slot for view in step.caches],
         rows=len(step.attention.reshape(-1, step.attention.shape[-1])))

stepper.next_button.on_click(dump_causal)  # after the stepper's own handler
stepper.back_button.on_click(dump_causal)
for _ in range(4):
    stepper.next_token()
dump_causal()
stepper.widget
""",
]
NOTEBOOKS["causal"] = CAUSAL_CELLS

# The causal stepper's cache cells, model view rows and alignment rows, as the page holds them.
READ_CAUSAL = """
() => {
  const doc = (window.Bokeh?.documents ?? []).find((d) => d.get_model_by_name("cache_source"));
  if (!doc) return null;
  const column = (name, key) => { const d = doc.get_model_by_name(name).data;
    return Array.from(d instanceof Map ? d.get(key) : d[key]); };
  return {cache_row: column("cache_source", "row"), position: column("cache_source", "position"),
          state: column("cache_source", "state"),
          visible: doc.get_model_by_name("cache_figure").visible,
          heads: new Set(column("heads_source", "row")).size,
          alignment: new Set(column("alignment_source", "row")).size};
}
"""


def assert_cache_drawn(opened, kernel):
    """The page's cache panel holds the kernel's cache views, and its rows are drawn."""
    wanted = kernel["position"]
    opened.wait(
        f"(() => {{ const c = ({READ_CAUSAL})(); return c && c.alignment === {wanted}; }})()"
    )
    opened.page.wait_for_timeout(300)
    drawn = opened.page.evaluate(READ_CAUSAL)
    assert drawn["visible"] and drawn["heads"] == kernel["rows"], drawn
    for layer, positions in enumerate(kernel["positions"]):
        cells = [i for i, row in enumerate(drawn["cache_row"]) if row == layer]
        assert [drawn["position"][i] for i in cells] == positions
        assert [drawn["state"][i] for i in cells].count("written") == 1
        assert drawn["state"][cells[kernel["written"][layer]]] == "written"


@pytest.mark.parametrize(
    ("front_end", "themes"), matrix(THEMED_PAGES, ("voila", ("dark",))), ids=page_id
)
def test_causal_stepper_draws_each_layers_cache_and_every_head(run, front_end, themes):
    served_dark = themes == ("dark",)
    opened = open_in_layout(run, "causal", front_end, 1280, DARK if served_dark else None)
    try:
        kernel = opened.kernel_state(lambda state: state.get("position") == 4)
        assert_cache_drawn(opened, kernel)
        for theme in themes:
            if theme == "dark":
                if not served_dark:
                    switch_theme(opened.page, DARK)
                    opened.page.wait_for_timeout(500)
                bokeh_page.assert_text_contrasts(opened.page)
                bokeh_page.assert_no_frames(opened.page)
            # A click in the page moves the kernel's session and the page follows it.
            position = kernel["position"] + (-1 if theme == "dark" else 1)
            button = "Back" if theme == "dark" else "Next token"
            opened.page.get_by_role("button", name=button).first.click()
            kernel = opened.kernel_state(lambda state, p=position: state["position"] == p)
            assert_cache_drawn(opened, kernel)
            text_boxes.assert_legible(opened.page, minimum_axes=8)
            assert_backgrounds(opened.page, dark=theme == "dark")
            opened.screenshot(f"_causal_{theme}")
    finally:
        if "dark" in themes:
            restore_light_theme(opened)
