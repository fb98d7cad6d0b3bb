"""Show the TF Serving REST request and response for an exported translator.

    python examples/serving_request.py build/demo/saved_model "mardi 5 mars 2019" "5/3/19"

Prints the body of `POST /v1/models/NAME:predict` in TF Serving's row format
(`{"instances": [...]}`) and the response body TF Serving sends back
(`{"predictions": [{output: value, ...}, ...]}`), computed by running the
SavedModel's `serving_default` signature on the instances, as the server
does. Only TensorFlow and tensorflow-text are imported.
"""

import json
import os
import sys

# A quiet start: `import keras_attention` before keras or tensorflow hides
# TensorFlow's start-up log block (see keras_attention/_quiet.py).
os.environ.setdefault("KERAS_ATTENTION_QUIET_STARTUP", "1")


def _json_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "tolist"):
        return _json_value(value.tolist())
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    import keras_attention  # noqa: F401  (first: a quiet TensorFlow start)

    # isort: split
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the ops the model uses)

    path, texts = argv[0], argv[1:]
    request = {"instances": texts}
    serve = tf.saved_model.load(path).signatures["serving_default"]
    outputs = {k: v.numpy() for k, v in serve(text=tf.constant(texts)).items()}
    predictions = [
        {name: _json_value(outputs[name][row]) for name in sorted(outputs)}
        for row in range(len(texts))
    ]
    print("request:")
    print(json.dumps(request, ensure_ascii=False))
    print("response:")
    print(json.dumps({"predictions": predictions}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
