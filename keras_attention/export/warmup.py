"""TF Serving warmup records, written without tensorflow-serving-api.

TF Serving replays `assets.extra/tf_serving_warmup_requests` when it loads a
model: a TFRecord file of `tensorflow.serving.PredictionLog` protos. Those
protos live in the tensorflow-serving-api package, which pins its own
TensorFlow version; the few fields a warmup record needs are encoded here
directly in the protobuf wire format, around `TensorProto`s made by
TensorFlow itself:

    PredictionLog { predict_log = 6: PredictLog {
      request = 1: PredictRequest {
        model_spec = 1: ModelSpec { name = 1, signature_name = 3 }
        inputs = 2: map<string, TensorProto> } } }
"""

import os

import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number, payload):
    """A length-delimited field (wire type 2)."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def predict_request_log(inputs, model_name="model", signature_name="serving_default"):
    """Serialized `PredictionLog` holding a `PredictRequest` for `inputs`.

    Args:
        inputs: dict from signature input name to a value `tf.make_tensor_proto`
            accepts (e.g. a list of strings).
    """
    model_spec = _field(1, model_name) + _field(3, signature_name)
    request = _field(1, model_spec)
    for name in sorted(inputs):
        tensor = tf.make_tensor_proto(inputs[name]).SerializeToString()
        request += _field(2, _field(1, name) + _field(2, tensor))
    return _field(6, _field(1, request))


def write_warmup_requests(
    saved_model_dir, requests, model_name="model", signature_name="serving_default"
):
    """Writes `assets.extra/tf_serving_warmup_requests`, one record per request.

    Each request is a dict of inputs for `signature_name`, or a
    `(signature name, inputs)` pair.
    """
    owner = "write_warmup_requests"
    if isinstance(saved_model_dir, bytes) or not isinstance(saved_model_dir, (str, os.PathLike)):
        raise TypeError(
            f"{owner}: `saved_model_dir` must be a string or os.PathLike naming a "
            f"SavedModel directory. Received: saved_model_dir={saved_model_dir!r}"
        )
    if not os.path.isdir(saved_model_dir):
        raise ValueError(
            f"{owner}: `saved_model_dir` must be an existing directory (the "
            f"SavedModel's). Received: saved_model_dir={os.fspath(saved_model_dir)!r}"
        )
    if isinstance(requests, (str, bytes, dict)) or not hasattr(requests, "__iter__"):
        raise TypeError(
            f"{owner}: `requests` must be a list of input dicts or (signature name, "
            f"inputs) pairs. Received: requests={requests!r}"
        )
    requests = list(requests)
    for index, request in enumerate(requests):
        pair = isinstance(request, tuple) and len(request) == 2 and isinstance(request[0], str)
        if not (isinstance(request, dict) or (pair and isinstance(request[1], dict))):
            raise TypeError(
                f"{owner}: each of `requests` must be a dict of inputs or a (signature "
                f"name, inputs) pair. Received: requests[{index}]={request!r}"
            )
    for name, value in (("model_name", model_name), ("signature_name", signature_name)):
        if not isinstance(value, str) or not value:
            raise ValueError(
                f"{owner}: `{name}` must be a non-empty string. Received: {name}={value!r}"
            )
    path = os.path.join(saved_model_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for request in requests:
            signature, inputs = request if isinstance(request, tuple) else (signature_name, request)
            writer.write(predict_request_log(inputs, model_name, signature))
    return path
