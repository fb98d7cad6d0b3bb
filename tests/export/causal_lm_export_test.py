"""`export_causal_lm`: a KerasHub causal LM with our attention, served token by token (#51).

One tiny Gemma causal LM (2 blocks, hidden 16, random weights) with a
SentencePiece vocabulary trained here, our attention swapped in, is exported
once. `check_servable` loads it in a fresh process as TF Serving does and
streams each warmup prompt through `prefill` and `decode_step`; its served
`generate` is compared with KerasHub's own `causal_lm.generate` (greedy
sampler, XLA-compiled, in this process), text and token ids.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from tests import causal_lms

pytestmark = pytest.mark.tf_only

keras_hub = pytest.importorskip("keras_hub")
spm = pytest.importorskip("sentencepiece")

MAX_LENGTH = 16
# Ragged on purpose: decoding starts at the shortest prompt's end while the
# longer rows are still inside theirs. With these weights, "ran" stops at
# once, "keras" writes 11 varied tokens and the longest runs to max_length.
# (A prompt of one token, or one whose continuation repeats one token, hides
# a step written at the wrong position: attention over equal values.)
PROMPTS = ["keras", "ran", "one two three four"]


def _gemma_causal_lm(seed):
    return causal_lms.gemma_causal_lm(seed, MAX_LENGTH)


@pytest.fixture(scope="module")
def keras_hub_generate():
    """KerasHub's own model (its attention), before the swap: `generate`
    (compiled with XLA) on `PROMPTS`, its strings, and its token ids and
    mask from the same compiled function; and the logits of an uncached
    forward pass over those tokens, which each streamed step must give."""
    model = _gemma_causal_lm(seed=0)
    preprocessor = model.preprocessor
    text = model.generate(PROMPTS, max_length=MAX_LENGTH)
    inputs = preprocessor.generate_preprocess(PROMPTS, sequence_length=MAX_LENGTH)
    end = preprocessor.tokenizer.end_token_id
    outputs = model.make_generate_function()(inputs, stop_token_ids=(end,))
    outputs = {k: np.asarray(v) for k, v in outputs.items()}
    ones = np.ones_like(outputs["padding_mask"])
    logits = model({"token_ids": outputs["token_ids"], "padding_mask": ones})
    return {
        "model": model,
        "text": text,
        "prompt": {k: np.asarray(v) for k, v in inputs.items()},
        "logits": np.asarray(logits),
        **outputs,
    }


@pytest.fixture(scope="module")
def causal_lm(keras_hub_generate):
    """The same model with our attention; its Python `generate` (XLA, and
    traced before the export, which must not save it) gives KerasHub's text."""
    from keras_attention.interchange.keras_hub_models import replace_keras_hub_attention

    causal_lm = keras_hub_generate["model"]
    assert replace_keras_hub_attention(causal_lm) == 2
    assert causal_lm.generate(PROMPTS, max_length=MAX_LENGTH) == keras_hub_generate["text"]
    return causal_lm


@pytest.fixture(scope="module")
def exported(causal_lm, tmp_path_factory):
    from keras_attention.export import export_causal_lm

    path = str(tmp_path_factory.mktemp("export") / "causal_lm")
    export_causal_lm(causal_lm, path, warmup_prompts=PROMPTS)
    return path


def test_prompts_exercise_early_stop_and_ragged_rows(keras_hub_generate):
    """The comparisons below would be weak on prompts that all stop at once
    or all run to the end."""
    kept = keras_hub_generate["padding_mask"]
    lengths = keras_hub_generate["prompt"]["padding_mask"].sum(axis=1)
    assert len(set(lengths.tolist())) == len(PROMPTS)
    assert kept.all(axis=1).any() and not kept.all()
    assert (kept.sum(axis=1) > lengths + 1).any()  # some row generates several tokens


def test_served_model_streams_generate_and_equals_keras_hub(exported, keras_hub_generate):
    from keras_attention.export import check_servable
    from keras_attention.export import tf_serving

    report = check_servable(exported, verbose=0)
    assert report.ok, report.summary()
    assert set(report.signatures) == {
        "serving_default",
        "generate",
        "tokenize",
        "detokenize",
        "prefill",
        "decode_step",
    }
    assert report.signatures["decode_step"]["inputs"]["cache"] == (
        "float (None, 2, 2, 16, 1, 8)"  # (B, layers, 2, max_length, Hkv, D)
    )
    # Our cache write ran, not KerasHub's (XlaDynamicUpdateSlice), and no XLA.
    assert "TensorScatterUpdate" in report.op_counts
    assert not any(op.startswith("Xla") for op in report.op_counts)
    text_ops = {op for op, source in report.op_sources.items() if source == "tensorflow-text"}
    assert "SentencepieceTokenizeOp" in text_ops and text_ops <= tf_serving.TENSORFLOW_TEXT_OPS
    # The fresh process streamed the warmup prompts token by token.
    (streamed,) = report.streaming
    assert streamed["mismatches"] == [] and streamed["decode_steps"] >= 5
    served = streamed["generate"]
    assert served["text"] == keras_hub_generate["text"]
    kept = keras_hub_generate["padding_mask"]
    np.testing.assert_array_equal(served["padding_mask"], kept)
    np.testing.assert_array_equal(
        np.where(kept, served["token_ids"], -1), np.where(kept, keras_hub_generate["token_ids"], -1)
    )


@pytest.fixture(scope="module")
def loaded(exported):
    """The SavedModel through TF 2's loader, as a Python client loads it."""
    import tensorflow_text  # noqa: F401  (a Python consumer must import it)

    return tf.saved_model.load(exported)


def test_streaming_in_python_equals_keras_hub_generate(loaded, keras_hub_generate):
    """A client of the TF 2 loader streams KerasHub's tokens, one per call."""
    from keras_attention.export.serving_process import stream_tokens

    def run(name, inputs):
        outputs = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    prompt = run("tokenize", {"text": np.array(PROMPTS, dtype=object)})
    np.testing.assert_array_equal(prompt["token_ids"], keras_hub_generate["prompt"]["token_ids"])
    lengths = prompt["padding_mask"].sum(axis=1)
    # Only the prompt tokens go in, unpadded to max_length.
    width = lengths.max()
    tokens, logits, steps = stream_tokens(
        run, prompt["token_ids"][:, :width], prompt["padding_mask"][:, :width], MAX_LENGTH - 1
    )
    assert steps == MAX_LENGTH - 1 - lengths.min()
    kept = keras_hub_generate["padding_mask"]
    np.testing.assert_array_equal(tokens[kept], keras_hub_generate["token_ids"][kept])
    # Each step's logits: KerasHub's uncached forward pass at the position before.
    chosen = kept.copy()
    chosen[:, : lengths.min()] = False
    np.testing.assert_allclose(
        logits[chosen], keras_hub_generate["logits"][:, :-1][chosen[:, 1:]], atol=1e-4
    )
    text = run("detokenize", {"token_ids": tokens, "padding_mask": kept})["text"]
    assert [t.decode() for t in text] == keras_hub_generate["text"]


def test_signatures_refuse_a_cache_index_or_prompt_past_max_length(loaded):
    prompt = {
        "token_ids": tf.ones([1, MAX_LENGTH + 1], tf.int32),
        "padding_mask": tf.ones([1, MAX_LENGTH + 1], tf.bool),
    }
    with pytest.raises(tf.errors.InvalidArgumentError, match="at most 16 tokens"):
        loaded.signatures["prefill"](**prompt)
    first = loaded.signatures["prefill"](
        token_ids=tf.constant([[1, 5]]), padding_mask=tf.constant([[True, True]])
    )
    assert int(first["index"]) == 2
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`index` must be below 16"):
        loaded.signatures["decode_step"](
            token=first["next_token"], index=tf.constant(MAX_LENGTH), cache=first["cache"]
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`token_ids` must have shape"):
        loaded.signatures["prefill"](
            token_ids=tf.constant([1, 5]), padding_mask=tf.constant([True, True])
        )


def test_export_arguments_name_themselves(causal_lm, tmp_path):
    from keras_attention.export import export_causal_lm

    (tmp_path / "a_file").write_text("not a directory")
    cases = [
        (dict(causal_lm="lm"), TypeError, r"`causal_lm` must be a KerasHub causal LM.*str"),
        (dict(path=None), TypeError, r"`path` must be a string or os.PathLike.*None"),
        (dict(path=str(tmp_path / "a_file")), ValueError, r"`path` is an existing file"),
        (dict(max_length=1), ValueError, r"`max_length` must be at least 2.*max_length=1"),
        (dict(max_length=2.5), ValueError, r"`max_length` must be a positive integer.*2.5"),
        (dict(stop_token_ids="end"), ValueError, r"`stop_token_ids` must be.*'end'"),
        (dict(stop_token_ids=[999]), ValueError, r"`stop_token_ids` must be token ids.*999"),
        (dict(stop_token_ids=7), TypeError, r"`stop_token_ids` must be.*=7"),
        (dict(warmup_prompts="hi"), TypeError, r"`warmup_prompts` must be.*'hi'"),
        (dict(warmup_prompts=[[1, 2]]), TypeError, r"`warmup_prompts` must be strings.*\[1, 2\]"),
        (dict(model_name=7), TypeError, r"`model_name` must be a string.*model_name=7"),
    ]
    for kwargs, error, pattern in cases:
        kwargs = {"causal_lm": causal_lm, "path": str(tmp_path / "model"), **kwargs}
        with pytest.raises(error, match=rf"^export_causal_lm: {pattern}"):
            export_causal_lm(**kwargs)
    assert not (tmp_path / "model").exists()


def test_token_id_mode_without_a_preprocessor_needs_max_length_and_stop_ids(causal_lm, tmp_path):
    from keras_attention.export import export_causal_lm

    bare = keras_hub.models.GemmaCausalLM(backbone=causal_lm.backbone, preprocessor=None)
    path = str(tmp_path / "model")
    with pytest.raises(ValueError, match=r"^export_causal_lm: `max_length` must be given"):
        export_causal_lm(bare, path)
    with pytest.raises(ValueError, match=r'^export_causal_lm: `stop_token_ids="auto"`'):
        export_causal_lm(bare, path, max_length=8)
    for prompts in ([["a"]], [list(range(9))]):
        with pytest.raises(ValueError, match=r"^export_causal_lm: `warmup_prompts` must be lists"):
            export_causal_lm(bare, path, max_length=8, stop_token_ids=None, warmup_prompts=prompts)


def _guide_client():
    """The REST client of the decoding guide, as written there."""
    import os
    import re

    guide = os.path.join(
        os.path.dirname(__file__), "..", "..", "docs", "guides", "decoding-and-serving.md"
    )
    with open(guide, encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    (block,) = [b for b in blocks if "def stream(" in b]
    namespace = {}
    exec(compile(block, "decoding-and-serving.md", "exec"), namespace)
    return namespace


@contextlib.contextmanager
def _rest_server(loaded):
    """A stand-in for TF Serving's REST `predict` (columnar format) over
    the loaded SavedModel: `{"outputs": {name: value}}`, or the value
    alone when the signature has one output, as TF Serving answers."""
    import http.server
    import json
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            assert self.path == "/v1/models/lm:predict", self.path
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            function = loaded.signatures[body.get("signature_name", "serving_default")]
            specs = function.structured_input_signature[1]
            inputs = {k: tf.constant(v, specs[k].dtype) for k, v in body["inputs"].items()}
            outputs = {
                name: [t.decode() for t in value.numpy()]
                if value.dtype == tf.string
                else value.numpy().tolist()
                for name, value in function(**inputs).items()
            }
            if len(outputs) == 1:
                (outputs,) = outputs.values()
            answer = json.dumps({"outputs": outputs}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/models/lm"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_guide_rest_client_streams_keras_hub_generate(causal_lm, loaded, keras_hub_generate):
    client = _guide_client()
    end = causal_lm.preprocessor.tokenizer.end_token_id
    # The prompt with the most new tokens.
    new = keras_hub_generate["padding_mask"].sum(1) - keras_hub_generate["prompt"][
        "padding_mask"
    ].sum(1)
    row = int(np.argmax(new))
    with _rest_server(loaded) as url:
        texts = list(client["stream"](client["rest_predict"](url), PROMPTS[row], MAX_LENGTH, end))
    # One text per new token, the last one KerasHub's answer.
    assert len(texts) == new[row] >= 5
    assert texts[-1] == keras_hub_generate["text"][row]


def test_token_id_mode_serves_keras_hub_tokens(causal_lm, keras_hub_generate, tmp_path):
    """Without a tokenizer in the graph, `generate` and the steps take ids."""
    from keras_attention.export import check_servable
    from keras_attention.export import export_causal_lm
    from keras_attention.export.serving_process import stream_tokens

    bare = keras_hub.models.GemmaCausalLM(backbone=causal_lm.backbone, preprocessor=None)
    prompt = keras_hub_generate["prompt"]
    width = prompt["padding_mask"].sum(axis=1).max()
    token_ids, padding_mask = prompt["token_ids"][:, :width], prompt["padding_mask"][:, :width]
    end = causal_lm.preprocessor.tokenizer.end_token_id
    path = str(tmp_path / "ids")
    export_causal_lm(bare, path, max_length=MAX_LENGTH, stop_token_ids=[end])
    report = check_servable(path, load=False)
    assert report.ok and "TensorScatterUpdate" in report.op_counts, report.summary()
    loaded = tf.saved_model.load(path)
    assert "tokenize" not in loaded.signatures

    def run(name, inputs):
        outputs = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    served = run("generate", {"token_ids": token_ids, "padding_mask": padding_mask})
    kept = keras_hub_generate["padding_mask"]
    np.testing.assert_array_equal(served["padding_mask"], kept)
    np.testing.assert_array_equal(served["token_ids"][kept], keras_hub_generate["token_ids"][kept])
    tokens, _, _ = stream_tokens(run, token_ids, padding_mask, MAX_LENGTH - 1)
    np.testing.assert_array_equal(tokens[kept], keras_hub_generate["token_ids"][kept])
