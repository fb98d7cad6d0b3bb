"""Exporting a translator as a SavedModel that TF Serving serves without Python."""

import os

import tensorflow as tf

from keras_attention.export.warmup import write_warmup_requests

SERVING_OUTPUTS = (
    "translation", "alignment", "source_tokens", "target_tokens", "score",
    "source_length", "output_length",
)


def export_translator(translator, path, beam_width=1, max_length=None,
                      length_penalty=0.0, warmup_texts=None, model_name=None):
    """Writes `translator` as a SavedModel with a `serving_default` signature.

    The signature takes `text: tf.string (B,)` and returns, padded to the
    longest output (`T_out` tokens, `<end>` excluded) and the longest source
    (`T_in` tokens, after truncation to `max_source_length`) of the batch:

    - `translation`: `(B,)` strings,
    - `alignment`: `(B, T_out, T_in)` float32 attention weights, zero-padded
      (row `i` is output token `i`, column `j` source token `j`),
    - `source_tokens`: `(B, T_in)` strings, padded with `""`,
    - `target_tokens`: `(B, T_out)` strings, padded with `""`,
    - `score`: `(B,)` float32 log-probability, `source_length`,
      `output_length`: `(B,)` int32 (the unpadded sizes).

    The graph holds only TensorFlow core and tensorflow-text ops (no PyFunc,
    no XLA), so a standard TF Serving build serves it. Decoding (greedy, or
    beam search when `beam_width > 1`) is fixed at export time. A warmup
    request with `warmup_texts` is written to
    `assets.extra/tf_serving_warmup_requests`.

    Args:
        translator: a `Seq2SeqTranslator` (or any translator with the same
            decoding interface).
        path: the SavedModel directory to create.
        beam_width, max_length, length_penalty: as in `translate`.
        warmup_texts: strings for the warmup request; defaults to a text made
            of the first source-vocabulary tokens.
        model_name: the model name in the warmup request (defaults to the
            directory name; TF Serving ignores it for warmup).

    Returns:
        `path`.
    """
    if not hasattr(translator, "_search_outputs"):
        raise TypeError(
            "export_translator: `translator` must be a keras_attention "
            f"translator. Received: {type(translator).__name__}"
        )
    beam_width, max_length, length_penalty = translator._check_decoding_arguments(
        beam_width, max_length, length_penalty
    )
    if warmup_texts is None:
        tokens = translator.source_vocabulary[4:14]
        warmup_texts = [translator.source_text.separator.join(tokens), ""]
    warmup_texts = [str(t) for t in warmup_texts]

    module = tf.Module()
    module.translator = translator
    # The serving graph reads the tf.Variables inside the Keras variables; track
    # those too, so the v1 loader (TF Serving's) restores the ones it reads.
    module.tf_variables = [v.value for v in translator.variables]
    # The vocabulary tables are resources the signature captures; track them.
    module.tables = [translator.source_text.table, translator.target_text.table]

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.string, name="text")],
        autograph=False,  # the search uses explicit tf.while_loops
    )
    def serve(text):
        outputs = translator._search_outputs(
            text, beam_width, max_length, tf.constant(length_penalty, tf.float32)
        )
        return {name: outputs[name] for name in SERVING_OUTPUTS}

    module.serve = serve
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    write_warmup_requests(
        path,
        [{"text": warmup_texts}],
        model_name=model_name or os.path.basename(os.path.normpath(path)),
    )
    return path
