"""Exporting a translator as a SavedModel that TF Serving serves without Python."""

import os

import tensorflow as tf

from keras_attention import _extras
from keras_attention import validation
from keras_attention.export.warmup import write_warmup_requests
from keras_attention.models import text_processing

SERVING_OUTPUTS = (
    "translation",
    "alignment",
    "source_tokens",
    "target_tokens",
    "score",
    "source_length",
    "output_length",
)
# The signatures every exported translator has (`serving_default` as well).
SIGNATURES = ("greedy", "beam_search")
# The widest beam the exported beam-search signature serves when the caller
# names none: at least `beam_width`, and room for a client to ask for 4.
DEFAULT_MAX_BEAM_WIDTH = 4
# The default warmup request's text: this many source-vocabulary tokens, the
# first after the reserved ones (a text the tokenizer maps to known ids).
WARMUP_TEXT_TOKENS = 10


def export_translator(
    translator,
    path,
    beam_width=1,
    max_beam_width=None,
    max_length=None,
    length_penalty=0.0,
    warmup_texts=None,
    model_name=None,
):
    """Writes `translator` as a SavedModel that TF Serving serves as is.

    Signatures (`saved_model_cli show --dir PATH --all` lists them):

    - `serving_default(text)`: decodes with `beam_width` (greedy when 1);
    - `greedy(text)`: greedy decoding;
    - `beam_search(text, beam_width)`: beam search with a per-request width,
      a scalar int32 from 1 to `max_beam_width`; a request outside that
      range fails with `InvalidArgument` naming the limit.

    `text` is a `(B,)` `tf.string` tensor: any other dtype is refused by the
    signature, and any other rank (a rank-2 batch, as TF Serving's REST API
    builds from `{"instances": [["a", "b"]]}`, or a scalar) fails with
    `InvalidArgument` "`text` must be a 1-D batch of strings, shape (B,).
    Received: text with shape (1,2)", checked in the graph on every request.
    Each signature returns, padded to the longest output (`T_out` tokens,
    `<end>` excluded) and the longest source (`T_in` tokens, after truncation
    to `max_source_length`) of the batch:

    - `translation`: `(B,)` string,
    - `alignment`: float32 attention weights, zero-padded; the layout is the
      translator's `served_alignment_layout`: `(B, T_out, T_in)` for
      `Seq2SeqTranslator`, `(B, T_out, layers, heads, T_in)` for
      `TransformerTranslator` (its cross-attention per layer and head).
      Row `i` is output token `i`, column `j` source token `j`; cut the
      padding of text `b` with `alignment[b, :output_length[b], ...,
      :source_length[b]]`,
    - `source_tokens`: `(B, T_in)` string, padded with `""`,
    - `target_tokens`: `(B, T_out)` string, padded with `""`,
    - `score`: `(B,)` float32 log-probability (length-penalized),
    - `source_length`, `output_length`: `(B,)` int32 (the unpadded sizes).

    An empty batch returns empty outputs of these dtypes. The graph holds
    only TensorFlow core and tensorflow-text ops (no PyFunc, no XLA), so a
    standard TF Serving build serves it; a Python consumer loading it with
    `tf.saved_model.load` must `import tensorflow_text` first (it registers
    the tokenizer ops). One warmup request per signature is written to
    `assets.extra/tf_serving_warmup_requests` (`beam_search` at
    `max_beam_width`, the slowest case).

    Args:
        translator: a keras_attention translator.
        path: the SavedModel directory to create (a string or
            `os.PathLike`; not an existing file).
        beam_width: the width `serving_default` decodes with.
        max_beam_width: the largest width `beam_search` accepts; defaults
            to `max(DEFAULT_MAX_BEAM_WIDTH, beam_width)` (4); at most `translator.max_beam_width()`.
        max_length, length_penalty: as in `translate`, fixed at export.
        warmup_texts: strings for the warmup requests; defaults to a text made
            of the first source-vocabulary tokens, and an empty text.
        model_name: the model name in the warmup requests (defaults to the
            directory name; TF Serving ignores it for warmup).

    Returns:
        `path`.
    """
    owner = "export_translator"
    path, beam_width, max_beam_width, max_length, length_penalty = _checked_arguments(
        owner, translator, path, beam_width, max_beam_width, max_length, length_penalty
    )
    if model_name is not None and not isinstance(model_name, str):
        raise TypeError(
            validation.error(
                owner, f"`model_name` must be a string or None. Received: model_name={model_name!r}"
            )
        )
    warmup_texts = _warmup_texts(owner, translator, warmup_texts)
    signatures = _serving_functions(
        translator, beam_width, max_beam_width, max_length, length_penalty
    )
    module = tf.Module()
    module.translator = translator
    # The serving graph reads the tf.Variables inside the Keras variables; track
    # those too, so the v1 loader (TF Serving's) restores the ones it reads.
    module.tf_variables = [v.value for v in translator.variables]
    # The vocabulary tables are resources the signature captures; track them.
    module.tables = [translator.source_text.table, translator.target_text.table]
    module.serve, module.greedy, module.beam_search = signatures.values()
    tf.saved_model.save(module, path, signatures=signatures)
    requests = [
        ("serving_default", {"text": warmup_texts}),
        ("greedy", {"text": warmup_texts}),
        (
            "beam_search",
            {"text": warmup_texts, "beam_width": tf.constant(max_beam_width, tf.int32)},
        ),
    ]
    write_warmup_requests(
        path,
        requests,
        model_name=model_name or os.path.basename(os.path.normpath(path)),
    )
    return path


def _checked_arguments(owner, translator, path, beam_width, max_beam_width, max_length, penalty):
    """The translator, the path and the decoding arguments, checked in the
    order a user reads them; `max_beam_width` resolved to its default."""
    if not callable(getattr(translator, "serving_outputs", None)):
        raise TypeError(
            validation.error(
                owner,
                "`translator` must be a keras_attention translator. "
                f"Received: translator of type {type(translator).__name__}",
            )
        )
    path = _check_path(owner, path)
    # The exported graph tokenizes with tensorflow-text's ops.
    _extras.require_tensorflow_text(owner)
    beam_width, max_length, penalty = translator.check_decoding_arguments(
        beam_width, max_length, penalty, owner=owner
    )
    if max_beam_width is None:
        max_beam_width = max(DEFAULT_MAX_BEAM_WIDTH, beam_width)
    max_beam_width, _, _ = translator.check_decoding_arguments(
        max_beam_width,
        max_length,
        penalty,
        owner=owner,
        beam_argument="max_beam_width",
    )
    if beam_width > max_beam_width:
        raise ValueError(
            validation.error(
                owner,
                "`beam_width` must be at most `max_beam_width`. "
                f"Received: beam_width={beam_width}, max_beam_width={max_beam_width}",
            )
        )
    return path, beam_width, max_beam_width, max_length, penalty


def _warmup_texts(owner, translator, warmup_texts):
    """The warmup requests' texts: valid UTF-8 strings, as `translate` reads
    them (a warmup request is a real request: TF Serving answers it on load);
    by default a text of the first source-vocabulary tokens and an empty one."""
    if warmup_texts is None:
        first = len(text_processing.RESERVED_TOKENS)
        tokens = translator.source_vocabulary[first : first + WARMUP_TEXT_TOKENS]
        warmup_texts = [translator.source_text.separator.join(tokens), ""]
    return [
        text.decode("utf-8")
        for text in text_processing.as_string_array(warmup_texts, "warmup_texts", owner=owner)
    ]


def _serving_functions(translator, beam_width, max_beam_width, max_length, length_penalty):
    """The three signatures' functions, by signature name: `serving_default`
    (`beam_width`), `greedy` and `beam_search` (a per-request width checked
    in the graph against `max_beam_width`)."""
    penalty = tf.constant(length_penalty, tf.float32)

    def outputs_of(text, width, method):
        text = _checked_text(text)
        outputs = translator.serving_outputs(text, width, max_length, penalty, method)
        return {name: outputs[name] for name in SERVING_OUTPUTS}

    text_spec = tf.TensorSpec([None], tf.string, name="text")

    # No AutoGraph: the search uses explicit tf.while_loops.
    @tf.function(input_signature=[text_spec], autograph=False)
    def serve(text):
        return outputs_of(text, beam_width, "auto")

    @tf.function(input_signature=[text_spec], autograph=False)
    def greedy(text):
        return outputs_of(text, 1, "greedy")

    @tf.function(
        input_signature=[text_spec, tf.TensorSpec([], tf.int32, name="beam_width")],
        autograph=False,
    )
    def beam_search(text, beam_width):
        checks = [
            tf.debugging.assert_greater_equal(
                beam_width, 1, message="beam_search: `beam_width` must be at least 1"
            ),
            tf.debugging.assert_less_equal(
                beam_width,
                max_beam_width,
                message=f"beam_search: `beam_width` must be at most "
                f"{max_beam_width}, the max_beam_width fixed at export",
            ),
        ]
        with tf.control_dependencies(checks):
            beam_width = tf.identity(beam_width)
        return outputs_of(text, beam_width, "beam")

    return {"serving_default": serve, "greedy": greedy, "beam_search": beam_search}


def _checked_text(text):
    """`text` once the graph has checked that it is a `(B,)` batch.

    The signature's `TensorSpec([None])` is not enforced when a SavedModel is
    served (TF Serving feeds any shape; a loaded signature does too), and a
    check on the static shape or on `tf.rank` is folded away at export or by
    Grappler, which trust the placeholder's declared rank. The run-time
    shape written as a string ("2", "1,2", "" for a scalar) is opaque to
    both, so the assertion runs on every request and names the shape.
    """
    shape = tf.strings.reduce_join(tf.strings.as_string(tf.shape(text)), separator=",")
    check = tf.debugging.Assert(
        tf.strings.regex_full_match(shape, "[0-9]+"),
        [
            "`text` must be a 1-D batch of strings, shape (B,). Received: text with shape",
            tf.strings.join(["(", shape, ")"]),
        ],
        name="check_text_rank",
    )
    with tf.control_dependencies([check]):
        return tf.identity(text)


def _check_path(owner, path):
    """`path` as a string: a directory to create (or overwrite), not a file."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            validation.error(
                owner,
                "`path` must be a string or os.PathLike naming the "
                f"SavedModel directory to write. Received: path={path!r}",
            )
        )
    path = os.fspath(path)
    if not path:
        raise ValueError(validation.error(owner, "`path` must name a directory. Received: path=''"))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            validation.error(
                owner,
                f"`path` is an existing file; a SavedModel is a directory. Received: path={path!r}",
            )
        )
    return path
