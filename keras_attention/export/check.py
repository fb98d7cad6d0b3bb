"""`check_servable`: will TF Serving load and run this SavedModel?"""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

from keras_attention import _extras
from keras_attention import validation
from keras_attention.export import serving_process
from keras_attention.export import tf_serving
from keras_attention.progress import progress_bar

# Ops TF Serving cannot run: Python callbacks, and XLA-only ops (TF Serving's
# XLA is off by default).
FORBIDDEN_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc", "XlaCallModule")


class NotASavedModelError(ValueError):
    """Raised by `check_servable` for a path that holds no SavedModel."""


def _is_forbidden(op):
    return op in FORBIDDEN_OPS or op.startswith("Xla") or op.startswith("_Xla")


@dataclasses.dataclass
class CheckReport:
    """What `check_servable` found.

    Attributes:
        path: the SavedModel directory.
        problems: reasons TF Serving would fail; empty when servable.
        notes: things worth knowing that are not failures.
        op_counts: `{op: number of nodes}` over the graph and its function
            library.
        op_sources: `{op: "tensorflow" | "tensorflow-text" | "unregistered"}`;
            `"tensorflow-text (not importable here)"` for an op TF Serving
            links from tensorflow-text when this environment lacks it.
        signature_inputs, signature_outputs: of `serving_default`,
            `{name: "dtype shape"}`.
        signatures: every signature, `{name: {"inputs": {...}, "outputs":
            {...}}}` in the same form.
        warmup: one dict per warmup request replayed in the fresh process.
        streaming: for a causal LM (`export_causal_lm`), one dict per warmup
            `generate` request streamed through `prefill` and `decode_step`
            in the fresh process: `decode_steps`, `tokens_compared` and
            `mismatches` (empty when every streamed token is `generate`'s),
            and `generate`: what the served `generate` answered, as lists.
        tensorflow_text_version: the tensorflow-text the fresh process
            imported (None when not loaded).
        tf_serving_tensorflow_text_version: the release TF Serving's standard
            build links.
    """

    path: str
    problems: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    op_counts: dict = dataclasses.field(default_factory=dict)
    op_sources: dict = dataclasses.field(default_factory=dict)
    signature_inputs: dict = dataclasses.field(default_factory=dict)
    signature_outputs: dict = dataclasses.field(default_factory=dict)
    warmup: list = dataclasses.field(default_factory=list)
    streaming: list = dataclasses.field(default_factory=list)
    signatures: dict = dataclasses.field(default_factory=dict)
    tensorflow_text_version: str = None
    tf_serving_tensorflow_text_version: str = tf_serving.TENSORFLOW_TEXT_VERSION

    @property
    def ok(self):
        return not self.problems

    def summary(self, list_ops=False):
        lines = [
            f"check_servable {self.path}: "
            + ("OK, servable by TF Serving" if self.ok else "FAILED")
        ]
        for name, signature in sorted(self.signatures.items()):
            lines.append(
                f"  {name} inputs: "
                + ", ".join(f"{k} ({v})" for k, v in sorted(signature["inputs"].items()))
            )
            lines.append(
                f"  {name} outputs: "
                + ", ".join(f"{k} ({v})" for k, v in sorted(signature["outputs"].items()))
            )
        by_source = collections.defaultdict(list)
        for op in sorted(self.op_counts):
            by_source[self.op_sources.get(op, "unchecked")].append(op)
        if self.op_counts:
            lines.append(
                f"  {len(self.op_counts)} distinct ops: "
                + "; ".join(f"{len(ops)} {source}" for source, ops in sorted(by_source.items()))
            )
        for source, ops in sorted(by_source.items()):
            if list_ops or source != "tensorflow":
                lines.append(f"    {source}: {', '.join(ops)}")
        for entry in self.warmup:
            if "error" in entry:
                lines.append(f"  warmup request {entry['index']}: ERROR {entry['error']}")
            else:
                shapes = ", ".join(
                    f"{k} {tuple(v['shape'])}" for k, v in sorted(entry["outputs"].items())
                )
                lines.append(
                    f"  warmup request {entry['index']} ({entry.get('signature')}): ran ({shapes})"
                )
        for entry in self.streaming:
            if "error" not in entry and not entry["mismatches"]:
                lines.append(
                    f"  streamed warmup request {entry['index']}: prefill + "
                    f"{entry['decode_steps']} decode_step calls gave generate's "
                    f"{entry.get('tokens_compared', 0)} tokens"
                )
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  PROBLEM: {problem}" for problem in self.problems]
        return "\n".join(lines)


def _tensor_description(info):
    from tensorflow.core.framework import types_pb2

    dtype = types_pb2.DataType.Name(info.dtype).replace("DT_", "").lower()
    if info.tensor_shape.unknown_rank:
        return f"{dtype} unknown shape"
    dims = [d.size if d.size >= 0 else None for d in info.tensor_shape.dim]
    return f"{dtype} {tuple(dims)}"


def read_saved_model(path):
    """Parses `saved_model.pb` (or `.pbtxt`); raises `NotASavedModelError`."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    if not os.path.isdir(path):
        raise NotASavedModelError(
            f"check_servable: {path!r} is not a SavedModel directory "
            f"({'a file' if os.path.exists(path) else 'it does not exist'})."
        )
    proto = saved_model_pb2.SavedModel()
    binary = os.path.join(path, "saved_model.pb")
    text = os.path.join(path, "saved_model.pbtxt")
    if os.path.exists(binary):
        name = "saved_model.pb"
    elif os.path.exists(text):
        name = "saved_model.pbtxt"
    else:
        raise NotASavedModelError(
            f"check_servable: {path!r} is not a SavedModel directory: it "
            "has no saved_model.pb or saved_model.pbtxt."
        )
    try:
        if name == "saved_model.pb":
            with open(binary, "rb") as f:
                proto.ParseFromString(f.read())
        else:
            with open(text, encoding="utf-8") as f:
                text_format.Parse(f.read(), proto)
    except Exception as error:
        raise NotASavedModelError(
            f"check_servable: {path!r} has a {name} that does not "
            f"parse as a SavedModel: {type(error).__name__}: {error}"
        ) from error
    return proto


def graph_ops(meta_graph):
    """`(Counter of op names, names of functions marked XLA must-compile)`."""
    counts = collections.Counter(node.op for node in meta_graph.graph_def.node)
    must_compile = []
    for function in meta_graph.graph_def.library.function:
        counts.update(node.op for node in function.node_def)
        attr = function.attr.get("_XlaMustCompile")
        if attr is not None and attr.b:
            must_compile.append(function.signature.name)
    # Function names are op types too; they are defined, not registered.
    defined = {f.signature.name for f in meta_graph.graph_def.library.function}
    for name in defined:
        counts.pop(name, None)
    return counts, must_compile


def check_servable(path, load=True, timeout=600, verbose="auto"):
    """Checks that TF Serving can load `path` and answer its warmup requests.

    1. The SavedModel has a MetaGraph tagged `serve` with a `serving_default`
       signature.
    2. Every op in the graph and its function library is registered by
       TensorFlow core or by tensorflow-text, and each tensorflow-text op is
       one that TF Serving's standard build links (tensorflow-text's
       `ops_lib` target, at the release TF Serving pins: see
       `keras_attention.export.tf_serving`); `PyFunc`, `EagerPyFunc`,
       `XlaCallModule` and other XLA ops, and functions marked XLA
       must-compile, are problems. The report notes the tensorflow-text
       version TF Serving links next to the one used here.
    3. In a fresh Python process that imports only TensorFlow and
       tensorflow-text (keras_attention is blocked), the model loads with the
       v1 session loader (`tf.compat.v1.saved_model.loader.load`, as TF
       Serving does) and each request of
       `assets.extra/tf_serving_warmup_requests` runs. For a causal LM
       (`export_causal_lm`), each warmup `generate` request is then streamed
       as a client would, `prefill` and one `decode_step` per token, and
       every token must be `generate`'s (`report.streaming`).

    Args:
        path: the SavedModel directory.
        load: run step 3 (set False for a quick static check of 1 and 2).
        timeout: seconds allowed for the fresh process.
        verbose: 0 silent, 1 a `keras.utils.Progbar` over the stages (read,
            ops, fresh-process load), 2 one line when done; `"auto"` is 1
            when `load` (the fresh process takes 10-20 s), else 0.

    Returns:
        A `CheckReport`; `report.ok` is True when nothing failed and
        `report.summary()` explains the result.

    Raises:
        NotASavedModelError: `path` is not a SavedModel directory.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            "check_servable: `path` must be a string or os.PathLike naming a "
            f"SavedModel directory. Received: path={path!r}"
        )
    path = os.fspath(path)
    load = validation.validate_bool("check_servable", "load", load)
    if (
        isinstance(timeout, bool)
        or not validation.is_real(timeout)
        or not validation.as_python_scalar(timeout) > 0
    ):
        raise ValueError(
            "check_servable: `timeout` must be a positive number of seconds. "
            f"Received: timeout={timeout!r}"
        )
    timeout = float(validation.as_python_scalar(timeout))
    stages = 3 if load else 2
    progress = progress_bar(stages, verbose, unit_name="stage", auto=load, owner="check_servable")
    proto = read_saved_model(path)
    report = CheckReport(path=path)
    _advance(progress, 1, stages)
    serve = [m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags]
    if not serve:
        tags = [list(m.meta_info_def.tags) for m in proto.meta_graphs]
        report.problems.append(
            f"no MetaGraph is tagged 'serve' (tags found: {tags}); TF Serving "
            "loads the 'serve' MetaGraph."
        )
        _advance(progress, stages, stages)
        return report
    meta_graph = serve[0]
    report.signatures = {
        name: {
            "inputs": {k: _tensor_description(v) for k, v in sig.inputs.items()},
            "outputs": {k: _tensor_description(v) for k, v in sig.outputs.items()},
        }
        for name, sig in meta_graph.signature_def.items()
        if name != "__saved_model_init_op"
    }
    signature = meta_graph.signature_def.get("serving_default")
    if signature is None:
        report.problems.append(
            "no 'serving_default' signature (signatures found: "
            f"{sorted(meta_graph.signature_def)}); TF Serving uses it when a "
            "request names no signature."
        )
    else:
        report.signature_inputs = {k: _tensor_description(v) for k, v in signature.inputs.items()}
        report.signature_outputs = {k: _tensor_description(v) for k, v in signature.outputs.items()}
    counts, must_compile = graph_ops(meta_graph)
    report.op_counts = dict(sorted(counts.items()))
    _advance(progress, 2, stages)
    for op in sorted(counts):
        if _is_forbidden(op):
            report.problems.append(
                f"op {op} ({counts[op]} nodes) cannot run in TF Serving "
                "(Python callbacks and XLA-only ops are not available)."
            )
    for name in must_compile:
        report.problems.append(
            f"function {name} is marked XLA must-compile (jit_compile=True); "
            "TF Serving runs without XLA."
        )
    if not os.path.exists(os.path.join(path, serving_process.WARMUP_FILE)):
        report.notes.append(
            f"no {serving_process.WARMUP_FILE}: TF Serving will not warm up "
            "on load, so the first request is slow."
        )
    if load:
        _check_in_fresh_process(report, sorted(counts), timeout)
        _advance(progress, 3, stages)
    else:
        report.notes.append("not loaded in a fresh process (load=False).")
    return report


def _advance(progress, done, stages):
    if progress is not None:
        progress.update(done, finalize=done == stages)


def _fresh_process_env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_in_serving_process(path, ops=(), feed=None, timeout=600, signature="serving_default"):
    """Runs `serving_process.py` on `path`; returns `(report dict, outputs)`.

    `feed` is an optional dict of numpy arrays for `signature`; the
    outputs are then returned as a dict of numpy arrays (None when the run
    failed: the report's `load_error` says why).
    """
    import numpy as np

    with tempfile.TemporaryDirectory() as scratch:
        report_path = os.path.join(scratch, "report.json")
        command = [
            sys.executable,
            serving_process.__file__,
            os.path.abspath(path),
            report_path,
            "--ops",
            *ops,
        ]
        if feed is not None:
            feed_path = os.path.join(scratch, "feed.npz")
            fetch_path = os.path.join(scratch, "fetch.npz")
            np.savez(feed_path, **feed)
            command += ["--feed", feed_path, "--fetch", fetch_path, "--signature", signature]
        result = _run_serving_process(command, scratch, report_path, timeout)
        outputs = None
        if feed is not None and os.path.exists(fetch_path):
            with np.load(fetch_path, allow_pickle=True) as data:
                outputs = {k: data[k] for k in data.files}
        return result, outputs


def _run_serving_process(command, scratch, report_path, timeout):
    """Runs serving_process.py as `command` in `scratch`; returns its report."""
    completed = subprocess.run(
        command,
        cwd=scratch,
        env=_fresh_process_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if completed.returncode != 0 or not os.path.exists(report_path):
        raise RuntimeError(
            "check_servable: the fresh serving process failed "
            f"(exit {completed.returncode}):\n{completed.stderr[-3000:]}"
        )
    with open(report_path, encoding="utf-8") as f:
        return json.load(f)


def run_feeds_in_serving_process(path, feeds, timeout=600, signature="serving_default"):
    """Runs several requests (dicts of numpy arrays) in one fresh serving
    process; returns `(report dict, [outputs dict or error string])`.
    `signature`: one name for every request, or a list of one per request."""
    import numpy as np

    names = [signature] * len(feeds) if isinstance(signature, str) else list(signature)
    if len(names) != len(feeds):
        raise ValueError(
            "run_feeds_in_serving_process: `signature` must be a name or one name per "
            f"feed ({len(feeds)}). Received: signature={signature!r}"
        )
    with tempfile.TemporaryDirectory() as scratch:
        report_path = os.path.join(scratch, "report.json")
        command = [sys.executable, serving_process.__file__, os.path.abspath(path), report_path]
        for index, feed in enumerate(feeds):
            feed_path = os.path.join(scratch, f"feed{index}.npz")
            np.savez(feed_path, **feed)
            command += ["--feed", feed_path, "--fetch", os.path.join(scratch, f"fetch{index}.npz")]
        for name in names:
            command += ["--signature", name]
        result = _run_serving_process(command, scratch, report_path, timeout)
        answers = []
        for index, error in enumerate(
            result.get("feed_errors") or [result.get("load_error")] * len(feeds)
        ):
            if error is not None:
                answers.append(error)
                continue
            with np.load(os.path.join(scratch, f"fetch{index}.npz"), allow_pickle=True) as data:
                answers.append({k: data[k] for k in data.files})
        return result, answers


def _check_in_fresh_process(report, ops, timeout):
    try:
        result, _ = run_in_serving_process(report.path, ops, timeout=timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        report.problems.append(str(error))
        return
    if result.get("keras_attention_importable"):
        report.notes.append("keras_attention was importable in the fresh process.")
    report.op_sources = result["op_sources"]
    text_error, local = result.get("tensorflow_text_error"), []
    unregistered = sorted(
        op for op, source in report.op_sources.items() if source == "unregistered"
    )
    if text_error:
        # Without tensorflow-text here, its ops are unregistered in this
        # process although TF Serving links them: a local problem, told apart
        # from ops TF Serving would not have.
        local = [op for op in unregistered if op in tf_serving.TENSORFLOW_TEXT_OPS]
        unregistered = [op for op in unregistered if op not in local]
        for op in local:
            report.op_sources[op] = "tensorflow-text (not importable here)"
        if result.get("tensorflow_text_missing"):
            cause = (
                "tensorflow-text is not installed here (a gap of this "
                "environment, not of the model; " + _extras.install_hint("text") + ")"
            )
        else:
            cause = f"tensorflow_text failed to import here ({text_error})"
        if local:
            report.problems.append(
                f"{cause}, so this check could not load and run the model. Its "
                f"tensorflow-text ops are ones TF Serving links: {', '.join(local)}."
            )
        else:
            report.notes.append(f"{cause}; the model uses none of its ops.")
    if unregistered:
        report.problems.append(
            "ops registered by neither TensorFlow nor tensorflow-text (TF "
            f"Serving would not have them): {', '.join(unregistered)}"
            if not text_error
            else "ops TensorFlow does not register that are not among the "
            "tensorflow-text ops TF Serving links (TF Serving would not have "
            "them): "
            f"{', '.join(unregistered)}"
        )
    not_linked = sorted(
        op
        for op, source in report.op_sources.items()
        if source == "tensorflow-text" and op not in tf_serving.TENSORFLOW_TEXT_OPS
    )
    if not_linked:
        report.problems.append(
            "tensorflow-text ops that TF Serving's standard build does not link "
            "(they are outside tensorflow-text's `ops_lib` target at "
            f"{tf_serving.TENSORFLOW_TEXT_VERSION}): {', '.join(not_linked)}"
        )
    report.tensorflow_text_version = result.get("tensorflow_text_version")
    if "tensorflow-text" in report.op_sources.values():
        report.notes.append(
            "TF Serving's standard build links tensorflow-text "
            f"{tf_serving.TENSORFLOW_TEXT_VERSION}; checked here with "
            f"{report.tensorflow_text_version}."
        )
    if not result.get("loaded") and text_error and local:
        pass  # the problem above says why
    elif not result.get("loaded"):
        report.problems.append(
            "the v1 session loader (as in TF Serving) could not load the model: "
            f"{result.get('load_error')}"
        )
    elif result.get("load_error"):
        report.problems.append(f"running the model failed: {result['load_error']}")
    report.warmup = result.get("warmup", [])
    warmed = {entry.get("signature") for entry in report.warmup}
    if report.warmup and set(report.signatures) - warmed:
        report.notes.append(
            "signatures without a warmup request (their first request is "
            f"slow): {', '.join(sorted(set(report.signatures) - warmed))}"
        )
    for entry in report.warmup:
        if "error" in entry:
            report.problems.append(f"warmup request {entry['index']} failed: {entry['error']}")
    report.streaming = result.get("streaming", [])
    for entry in report.streaming:
        if "error" in entry:
            report.problems.append(
                f"streaming warmup request {entry['index']} (prefill, then "
                f"decode_step per token) failed: {entry['error']}"
            )
        elif entry["mismatches"]:
            report.problems.append(
                f"streaming warmup request {entry['index']} through prefill and "
                f"{entry['decode_steps']} decode_step calls differs from generate: "
                + "; ".join(entry["mismatches"])
            )
