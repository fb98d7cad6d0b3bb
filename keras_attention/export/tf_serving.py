"""What a standard TF Serving build links, read from its sources.

TF Serving's model server links TensorFlow core and one tensorflow-text
target, `@org_tensorflow_text//tensorflow_text:ops_lib`
(`tensorflow_serving/model_servers/BUILD`, `SUPPORTED_TENSORFLOW_OPS`), at the
tensorflow-text release its workspace pins (`tensorflow_serving/workspace.bzl`,
`org_tensorflow_text`, `text-2.20.0`; read at tensorflow/serving commit
0185d7f41d1a). The op names below are those that `ops_lib`'s targets
register in tensorflow/text at that tag (`tensorflow_text/BUILD`: each
`<name>_cc` target's `cc_op_defs`, by `REGISTER_OP` or the `kOpName` of the
op-kernel shims). tensorflow-text ops outside `ops_lib` (none in the Python
package of that release, but new releases add ops) are missing from the
server even though `import tensorflow_text` registers them.
"""

# The tensorflow-text release TF Serving's standard build pins.
TENSORFLOW_TEXT_VERSION = "2.20.0"

TENSORFLOW_TEXT_OPS = frozenset(
    {
        # :boise_offset_converter_cc
        "TFText>BoiseTagsToOffsets",
        "TFText>OffsetsToBoiseTags",
        # :byte_splitter_cc
        "TFText>ByteSplitByOffsets",
        "TFText>ByteSplitWithOffsets",
        # :constrained_sequence_op_cc
        "ConstrainedSequence",
        # :fast_bert_normalizer_cc
        "FastBertNormalize",
        # :fast_sentencepiece_tokenizer_cc
        "TFText>FastSentencepieceDetokenize",
        "TFText>FastSentencepieceTokenize",
        # :fast_wordpiece_tokenizer_cc
        "FastWordpieceTokenizeWithOffsets",
        "TFText>FastWordpieceDetokenize",
        # :mst_ops_cc
        "MaxSpanningTree",
        # :ngrams_op_cc
        "TFText>NgramsStringJoin",
        # :normalize_ops_cc
        "CaseFoldUTF8",
        "FindSourceOffsets",
        "NormalizeUTF8",
        "NormalizeUTF8WithOffsetsMap",
        # :phrase_tokenizer_cc
        "PhraseTokenize",
        "TFText>PhraseDetokenize",
        # :regex_split_ops_cc
        "RegexSplitWithOffsets",
        # :sentence_breaking_ops_cc
        "SentenceFragments",
        # :sentencepiece_tokenizer_cc
        "SentencepieceDetokenizeOp",
        "SentencepieceIdToStringOp",
        "SentencepieceOp",
        "SentencepieceStringToIdOp",
        "SentencepieceTokenizeOp",
        "SentencepieceTokenizeWithOffsetsOp",
        "SentencepieceVocabSizeOp",
        # :split_merge_from_logits_tokenizer_cc
        "TokenizerFromLogits",
        # :split_merge_tokenizer_cc
        "SplitMergeTokenizeWithOffsets",
        # :state_based_sentence_breaker_op_cc
        "SentenceFragmentsV2",
        # :text_similarity_metric_ops_cc
        "RougeL",
        # :trimmer_ops_cc
        "TFText>RoundRobinGenerateMasks",
        "TFText>RoundRobinTrim",
        # :unicode_script_tokenizer_cc
        "UnicodeScriptTokenizeWithOffsets",
        # :utf8_binarize_op_cc
        "TFText>Utf8Binarize",
        # :whitespace_tokenizer_cc
        "WhitespaceTokenizeWithOffsets",
        # :whitespace_tokenizer_v2_cc
        "TFText>WhitespaceTokenizeWithOffsetsV2",
        # :wordpiece_tokenizer_cc
        "WordpieceTokenizeWithOffsets",
    }
)
