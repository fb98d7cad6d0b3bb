"""The fresh-process half of `check_servable`, run as a script.

    python serving_process.py SAVED_MODEL_DIR REPORT_JSON [--ops OP ...]
        [--feed INPUTS.npz --fetch OUTPUTS.npz ... [--signature NAME]]

It must behave like TF Serving, so it imports only TensorFlow, then
tensorflow-text, and never keras_attention (the import is blocked):

1. classifies each op name given after `--ops` as registered by TensorFlow
   core (before tensorflow-text is imported), by tensorflow-text (registered
   only after), or by neither;
2. loads the SavedModel with the v1 session loader
   (`tf.compat.v1.saved_model.loader.load`, tag `serve`), the loader TF
   Serving uses;
3. replays every request in `assets.extra/tf_serving_warmup_requests`
   through its signature;
4. for a causal LM (`export_causal_lm`: signatures `generate`, `prefill`
   and `decode_step`), streams each warmup `generate` request as a client
   would, `prefill` then `decode_step` once per token, and compares the
   streamed tokens with `generate`'s (`streaming` in the report);
5. with `--feed`, runs `--signature` (default `serving_default`) on the
   arrays of an `.npz` file and saves the outputs to `--fetch`; with several
   `--feed`/`--fetch` pairs, runs each and reports each one's error in
   `feed_errors` (None where it ran).

The report is JSON. Only the standard library, numpy and TensorFlow are used.
"""

import json
import os
import sys
import traceback

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def _read_varint(data, position):
    result, shift = 0, 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def parse_fields(data):
    """Decodes a protobuf message into `[(field_number, value)]`.

    Length-delimited values are bytes; varints are ints; fixed-width values
    are raw bytes.
    """
    fields, position = [], 0
    while position < len(data):
        key, position = _read_varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _read_varint(data, position)
        elif wire_type == 2:
            length, position = _read_varint(data, position)
            value = data[position : position + length]
            position += length
        elif wire_type == 1:
            value, position = data[position : position + 8], position + 8
        elif wire_type == 5:
            value, position = data[position : position + 4], position + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        fields.append((number, value))
    return fields


def parse_predict_log(record):
    """`PredictionLog` bytes -> `(signature_name, {input name: TensorProto bytes})`."""
    for number, predict_log in parse_fields(record):
        if number != 6:
            continue
        for number, request in parse_fields(predict_log):
            if number != 1:
                continue
            signature, inputs = "serving_default", {}
            for number, value in parse_fields(request):
                if number == 1:
                    for spec_number, spec_value in parse_fields(value):
                        if spec_number == 3:
                            signature = spec_value.decode("utf-8")
                elif number == 2:
                    entry = dict(parse_fields(value))
                    inputs[entry[1].decode("utf-8")] = entry.get(2, b"")
            return signature, inputs
    raise ValueError("the record is not a PredictionLog with a predict_log")


def _classify_ops(op_names):
    import tensorflow as tf  # noqa: F401  (registers the core ops)
    from tensorflow.python.framework import op_def_registry

    core = {name for name in op_names if op_def_registry.get(name) is not None}
    text_error, text_version, text_missing = None, None, False
    try:
        import tensorflow_text  # (registers its kernels)

        text_version = getattr(tensorflow_text, "__version__", None)
    except Exception as error:  # report it; the load below will fail too
        text_error = f"{type(error).__name__}: {error}"
        # Not installed in this environment (as opposed to installed but
        # broken, e.g. built for another TensorFlow).
        text_missing = (
            isinstance(error, ModuleNotFoundError)
            and (error.name or "").split(".")[0] == "tensorflow_text"
        )
    sources = {}
    for name in op_names:
        if name in core:
            sources[name] = "tensorflow"
        elif op_def_registry.get(name) is not None:
            sources[name] = "tensorflow-text"
        else:
            sources[name] = "unregistered"
    return sources, text_error, text_version, text_missing


def _run_signature(session, signature, arrays):
    import numpy as np
    import tensorflow as tf

    feed = {}
    for name, value in arrays.items():
        if name not in signature.inputs:
            raise KeyError(
                f"input {name!r} is not in the signature; it has {sorted(signature.inputs)}"
            )
        # TF Serving refuses a tensor of the wrong dtype before running the
        # graph ("Expects arg[0] to be string but int32 is provided").
        expected = tf.as_dtype(signature.inputs[name].dtype)
        value = np.asarray(value)
        is_text = value.dtype.kind in "OSU"
        if (expected == tf.string) != is_text or (
            not is_text and tf.as_dtype(value.dtype) != expected
        ):
            raise TypeError(
                f"input {name!r} expects {expected.name} but "
                f"{'string' if is_text else value.dtype.name} is provided"
            )
        feed[signature.inputs[name].name] = value
    names = sorted(signature.outputs)
    # TF Serving's C++ `Session::Run` feeds whatever shape the request holds;
    # `session.run` (and `make_callable`) would refuse a shape unlike the
    # placeholder's in Python first. Run through the C API as the server
    # does, so only the graph's own checks stand between a request and the
    # model.
    graph = session.graph
    session._extend_graph()
    outputs = session._call_tf_sessionrun(
        None,
        {graph.get_tensor_by_name(key)._as_tf_output(): value for key, value in feed.items()},
        [graph.get_tensor_by_name(signature.outputs[name].name)._as_tf_output() for name in names],
        [],
        None,
    )
    return dict(zip(names, outputs, strict=True))


# The signatures `check_servable` streams through (`export_causal_lm`).
STREAMING_SIGNATURES = ("generate", "prefill", "decode_step")


def stream_tokens(run, token_ids, padding_mask, last):
    """The streaming client: `prefill`, then `decode_step` once per token.

    `run(signature, inputs)` answers a request (a dict of arrays). The
    prompt is `(B, P)`, right-padded; rows whose prompt is longer than the
    decoding index feed their own prompt token instead of `next_token`.
    Returns the `(B, last + 1)` tokens (prompt included), the
    `(B, last + 1, V)` logits each position was chosen from (zero before
    the first streamed position) and the number of `decode_step` calls.
    """
    import numpy as np

    rows, width = token_ids.shape
    tokens = np.zeros((rows, last + 1), token_ids.dtype)
    tokens[:, : min(width, last + 1)] = token_ids[:, : last + 1]
    answer = run("prefill", {"token_ids": token_ids, "padding_mask": padding_mask})
    logits = np.zeros((rows, last + 1, answer["logits"].shape[-1]), "float32")
    index, steps = int(answer["index"]), 0
    while index <= last:
        in_prompt = padding_mask[:, index] if index < width else np.zeros(rows, bool)
        prompt = token_ids[:, index] if index < width else answer["next_token"]
        token = np.where(in_prompt, prompt, answer["next_token"]).astype("int32")
        tokens[:, index], logits[:, index] = token, answer["logits"]
        if index == last:
            break
        cache = {k: v for k, v in answer.items() if k.startswith("cache")}
        answer = run("decode_step", {"token": token, "index": np.int32(index), **cache})
        if int(answer["index"]) != index + 1:  # a loop that would never end
            raise ValueError(
                f"decode_step at index {index} returned index {int(answer['index'])}, "
                f"not {index + 1}"
            )
        index, steps = int(answer["index"]), steps + 1
    return tokens, logits, steps


def _check_streaming(session, signatures, index, arrays):
    """Streams warmup request `index` (for `generate`) and compares; an
    error is reported, not raised."""
    try:
        return _streamed(session, signatures, index, arrays)
    except Exception as error:
        return {"index": index, "error": f"{type(error).__name__}: {error}"}


def _streamed(session, signatures, index, arrays):
    import numpy as np

    def run(name, inputs):
        return _run_signature(session, signatures[name], inputs)

    prompt = run("tokenize", arrays) if "text" in arrays else arrays
    token_ids = np.asarray(prompt["token_ids"], "int32")
    padding_mask = np.asarray(prompt["padding_mask"], bool)
    generated = run("generate", arrays)
    kept = np.asarray(generated["padding_mask"], bool)
    want = np.asarray(generated["token_ids"])
    # The last position `generate` kept in any row (its prompts at least).
    last = int(np.nonzero(kept.any(axis=0))[0].max()) if kept.any() else 0
    tokens, _, steps = stream_tokens(run, token_ids, padding_mask, last)
    wrong = np.argwhere(kept[:, : last + 1] & (tokens != want[:, : last + 1]))
    mismatches = [
        f"row {row} position {position}: streamed {tokens[row, position]}, "
        f"generate {want[row, position]}"
        for row, position in wrong[:5]
    ]
    return {
        "index": index,
        "rows": len(want),
        "decode_steps": steps,
        "tokens_compared": int(kept[:, : last + 1].sum()),
        "mismatches": mismatches,
        # What `generate` answered, for a caller to compare with its model.
        "generate": {
            name: np.asarray(value).tolist()
            if name != "text"
            else [t.decode("utf-8", "replace") for t in np.asarray(value)]
            for name, value in generated.items()
        },
    }


def main(argv):
    saved_model_dir, report_path = argv[0], argv[1]
    options = argv[2:]
    op_names = []
    if "--ops" in options:
        start = options.index("--ops") + 1
        end = next(
            (i for i in range(start, len(options)) if options[i].startswith("--")), len(options)
        )
        op_names = options[start:end]
    # `--feed A --fetch B` may repeat: each pair is one request.
    feed_paths = [options[i + 1] for i, o in enumerate(options) if o == "--feed"]
    fetch_paths = [options[i + 1] for i, o in enumerate(options) if o == "--fetch"]
    # `--signature NAME` once for every request, or once per request.
    signature_names = [options[i + 1] for i, o in enumerate(options) if o == "--signature"]
    signature_name = signature_names[0] if signature_names else "serving_default"
    if len(signature_names) != len(feed_paths):
        signature_names = [signature_name] * len(feed_paths)

    report = {"keras_attention_importable": True}
    try:
        import keras_attention  # noqa: F401
    except ImportError:
        report["keras_attention_importable"] = False

    (
        report["op_sources"],
        report["tensorflow_text_error"],
        report["tensorflow_text_version"],
        report["tensorflow_text_missing"],
    ) = _classify_ops(op_names)

    import numpy as np
    import tensorflow as tf

    report["loaded"], report["warmup"], report["streaming"] = False, [], []
    try:
        graph = tf.Graph()
        with tf.compat.v1.Session(graph=graph) as session:
            meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], saved_model_dir)
            report["loaded"] = True
            signatures = meta_graph.signature_def
            warmup_path = os.path.join(saved_model_dir, WARMUP_FILE)
            if os.path.exists(warmup_path):
                for index, record in enumerate(tf.compat.v1.io.tf_record_iterator(warmup_path)):
                    entry = {"index": index}
                    try:
                        name, inputs = parse_predict_log(record)
                        entry["signature"] = name
                        arrays = {}
                        for key, proto_bytes in inputs.items():
                            proto = tf.make_tensor_proto(0)
                            proto.ParseFromString(proto_bytes)
                            arrays[key] = tf.make_ndarray(proto)
                        outputs = _run_signature(session, signatures[name], arrays)
                        entry["outputs"] = {
                            key: {
                                "shape": list(np.shape(value)),
                                "dtype": str(np.asarray(value).dtype),
                            }
                            for key, value in outputs.items()
                        }
                    except Exception as error:
                        entry["error"] = f"{type(error).__name__}: {error}"
                    report["warmup"].append(entry)
                    streams = set(STREAMING_SIGNATURES) <= set(signatures)
                    if streams and "error" not in entry and entry["signature"] == "generate":
                        report["streaming"].append(
                            _check_streaming(session, signatures, index, arrays)
                        )
            if len(feed_paths) == 1:
                arrays = dict(np.load(feed_paths[0], allow_pickle=True))
                outputs = _run_signature(session, signatures[signature_name], arrays)
                np.savez(fetch_paths[0], **outputs)
            elif feed_paths:
                # Several requests: each one's error is reported on its own.
                report["feed_errors"] = []
                for feed_path, fetch_path, name in zip(
                    feed_paths, fetch_paths, signature_names, strict=False
                ):
                    arrays = dict(np.load(feed_path, allow_pickle=True))
                    try:
                        outputs = _run_signature(session, signatures[name], arrays)
                    except Exception as error:
                        report["feed_errors"].append(f"{type(error).__name__}: {error}")
                        continue
                    report["feed_errors"].append(None)
                    np.savez(fetch_path, **outputs)
    except Exception as error:
        report["load_error"] = f"{type(error).__name__}: {error}"
        report["load_traceback"] = traceback.format_exc()[-3000:]
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    # Behave like a server that has never heard of keras_attention.
    sys.modules["keras_attention"] = None
    sys.exit(main(sys.argv[1:]))
