"""In-graph text processing for the translators, built on tensorflow-text.

Everything here runs as TensorFlow ops (tensorflow core plus tensorflow-text
kernels), so a translator exported as a SavedModel takes raw strings and TF
Serving needs no Python to tokenize them.

Rules, shared by source and target text:

- Text is case-folded with `tf_text.case_fold_utf8` when `lowercase=True`.
- `split="character"` cuts text into Unicode characters
  (`tf_text.UnicodeCharTokenizer`, spaces included); `split="whitespace"`
  cuts it into words (`tf_text.WhitespaceTokenizer`); `split="wordpiece"`
  cuts words into subwords (`tf_text.FastWordpieceTokenizer`, which TF
  Serving links): a word is its longest vocabulary prefix, then `##`-marked
  continuations (`"chats"` -> `"chat", "##s"`). Its vocabulary is learned
  from the training texts by `wordpiece_vocabulary`.
- Ids 0-3 are reserved: `<pad>`, `<unk>` (any token not in the vocabulary),
  `<start>`, `<end>`. Real tokens follow, most frequent first.
- Truncation: a text longer than `max_length` tokens keeps its first
  `max_length` tokens; the rest is dropped before the model sees it.
"""

import collections

import numpy as np
import tensorflow as tf

from keras_attention import _extras

PAD, UNK, START, END = "<pad>", "<unk>", "<start>", "<end>"
RESERVED_TOKENS = (PAD, UNK, START, END)
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3
SPLITS = ("character", "whitespace", "wordpiece")
SUFFIX = "##"


def _check_split(split, owner="TextEncoder", argument="split"):
    if split not in SPLITS:
        raise ValueError(
            f"{owner}: `{argument}` must be one of {SPLITS}. Received: {argument}={split!r}"
        )


# Called inside the translators' `tf.function`s: AutoGraph would try to
# convert `importlib.import_module` and print "could not transform
# <function _gcd_import>" as the demo's first line (#35). Nothing here is
# graph code, so it runs as plain Python.
@tf.autograph.experimental.do_not_convert
def _tf_text(feature="keras_attention.models.text_processing"):
    # Imported when text is first processed, so registering the translators
    # (`import keras_attention`) does not load tensorflow-text's kernels.
    # Without the `text` extra: an ImportError naming it and the pip command.
    return _extras.require_tensorflow_text(feature)


def split_text(texts, split, lowercase, wordpiece=None):
    """Tokenizes a `(B,)` string tensor into a ragged `(B, None)` string tensor.

    `split="wordpiece"` needs the `wordpiece` tokenizer (`TextEncoder` owns it).
    """
    tf_text = _tf_text()
    texts = tf.convert_to_tensor(texts, tf.string)
    if lowercase:
        texts = tf_text.case_fold_utf8(texts)
    if split in ("whitespace", "wordpiece"):
        # tf_text's WhitespaceTokenizer cuts a multi-byte whitespace character
        # (U+0085, U+2028, U+00A0 without case folding, ...) mid-character,
        # leaving its lead bytes on the word before: invalid UTF-8 tokens.
        # Every Unicode space becomes " " first (`\p{Z}`: Zs, Zl, Zp; and
        # NEL, the one control character ICU counts as white space).
        texts = tf.strings.regex_replace(texts, r"[\p{Z}\x{85}]", " ")
        words = tf_text.WhitespaceTokenizer().tokenize(texts)
        if split == "whitespace":
            return words
        return wordpiece.tokenize(words).merge_dims(1, 2)  # (B, pieces)
    codepoints = tf_text.UnicodeCharTokenizer().tokenize(texts)  # (B, None) int32
    # One string per character: encode each codepoint back to UTF-8.
    characters = tf.strings.unicode_encode(tf.expand_dims(codepoints.flat_values, -1), "UTF-8")
    return codepoints.with_flat_values(characters)


def wordpiece_vocabulary(word_counts, max_tokens=None, min_count=1, max_suffix_length=4):
    """Learns WordPiece pieces from `{word: count}` (our own, deterministic).

    Pieces, most useful first: every character, as a word start and as a
    `##` continuation (so any word of known characters tokenizes); then the
    words seen `min_count` times and the word endings of 2 to
    `max_suffix_length` characters shared by at least two words, ranked by
    how often they occur (ties in first-seen order). Returns the pieces
    without the reserved tokens.
    """
    characters = collections.Counter()
    pieces = collections.Counter()
    suffix_words = collections.Counter()
    for word, count in word_counts.items():
        for character in word:
            characters[character] += count
        if count >= min_count:
            pieces[word] += count
        for length in range(2, min(max_suffix_length, len(word) - 1) + 1):
            pieces[SUFFIX + word[-length:]] += count
            suffix_words[SUFFIX + word[-length:]] += 1
    tokens = []
    for character, _ in characters.most_common():
        tokens += [character, SUFFIX + character]
    tokens += [
        piece
        for piece, _ in pieces.most_common()
        if not piece.startswith(SUFFIX) or suffix_words[piece] >= 2
    ]
    tokens = list(dict.fromkeys(t for t in tokens if t not in RESERVED_TOKENS))
    if max_tokens is not None:
        tokens = tokens[: max(0, max_tokens - len(RESERVED_TOKENS))]
    return tokens


def build_vocabulary(texts, split="character", lowercase=True, max_tokens=None, min_count=1):
    """Counts the tokens of `texts` (Python strings) and returns the vocabulary.

    The result starts with the reserved tokens, then the tokens seen at least
    `min_count` times, most frequent first (ties in first-seen order), cut to
    `max_tokens` entries in all when given.
    """
    _check_split(split)
    counts = collections.Counter()
    words = "whitespace" if split == "wordpiece" else split
    for start in range(0, len(texts), 4096):
        batch = split_text(list(texts[start : start + 4096]), words, lowercase)
        for row in batch.to_list():
            counts.update(token.decode("utf-8") for token in row)
    if split == "wordpiece":
        return list(RESERVED_TOKENS) + wordpiece_vocabulary(counts, max_tokens, min_count)
    tokens = [t for t, c in counts.most_common() if c >= min_count and t not in RESERVED_TOKENS]
    vocabulary = list(RESERVED_TOKENS) + tokens
    if max_tokens is not None:
        vocabulary = vocabulary[:max_tokens]
    return vocabulary


class TextEncoder(tf.Module):
    """Strings to padded id tensors and back, as TensorFlow ops.

    Args:
        vocabulary: list of tokens, starting with the reserved tokens
            `("<pad>", "<unk>", "<start>", "<end>")` (see `build_vocabulary`).
        split: `"character"`, `"whitespace"` or `"wordpiece"`.
        lowercase: case-fold text before splitting.
        max_length: number of tokens kept per text (longer texts keep their
            first `max_length` tokens); padded tensors have this width.
    """

    def __init__(
        self,
        vocabulary,
        split="character",
        lowercase=True,
        max_length=64,
        name=None,
        owner=None,
        role=None,
    ):
        # `owner`/`role` ("TransformerTranslator", "source"): errors name the
        # class the user built and its argument (`source_split`).
        super().__init__(name=name)
        prefix = f"{role}_" if role else ""
        owner = owner or "TextEncoder"
        _check_split(split, owner, f"{prefix}split")
        if isinstance(vocabulary, (str, bytes)) or not hasattr(vocabulary, "__iter__"):
            raise TypeError(
                f"{owner}: `{prefix}vocabulary` must be a list of tokens. "
                f"Received: {prefix}vocabulary={vocabulary!r}"
            )
        vocabulary = list(vocabulary)
        if tuple(vocabulary[:4]) != RESERVED_TOKENS:
            raise ValueError(
                f"{owner}: `{prefix}vocabulary` must start with the reserved "
                f"tokens {RESERVED_TOKENS}. Received: {prefix}vocabulary "
                f"starting with {vocabulary[:4]!r}"
            )
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError(
                f"{owner}: `{prefix}vocabulary` has duplicate tokens. Received: "
                f"{len(vocabulary)} tokens, {len(set(vocabulary))} distinct"
            )
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(
                f"{owner}: `max_length` must be a positive integer. "
                f"Received: max_length={max_length!r}"
            )
        self.vocabulary = vocabulary
        self.split = split
        self.lowercase = bool(lowercase)
        self.max_length = max_length
        self.separator = "" if split == "character" else " "
        self._wordpiece = None
        if split == "wordpiece":
            self._wordpiece = _tf_text(owner).FastWordpieceTokenizer(
                vocab=vocabulary,
                suffix_indicator=SUFFIX,
                unknown_token=UNK,
                token_out_type=tf.string,
                no_pretokenization=True,
            )
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(vocabulary, tf.string),
                tf.range(len(vocabulary), dtype=tf.int64),
            ),
            default_value=UNK_ID,
        )
        self._tokens = tf.constant(vocabulary, tf.string)

    @property
    def size(self):
        return len(self.vocabulary)

    def tokenize(self, texts):
        """`(B,)` strings -> ragged `(B, None)` token strings, truncated."""
        return split_text(texts, self.split, self.lowercase, self._wordpiece)[:, : self.max_length]

    def encode(self, texts, max_length=None, add_end=False):
        """`(B,)` strings -> `(ids (B, max_length) int32, tokens ragged)`.

        `max_length` defaults to the encoder's. With `add_end=True` one slot
        is kept for the `<end>` id appended after the text's tokens.
        """
        max_length = max_length or self.max_length
        tokens = split_text(texts, self.split, self.lowercase, self._wordpiece)
        keep = max_length - 1 if add_end else max_length
        tokens = tokens[:, :keep]
        ids = tf.ragged.map_flat_values(self.table.lookup, tokens)
        if add_end:
            end = tf.fill([tokens.nrows(), 1], tf.constant(END_ID, tf.int64))
            ids = tf.concat([ids, end], axis=1)
        padded = ids.to_tensor(default_value=PAD_ID, shape=[None, max_length])
        return tf.cast(padded, tf.int32), tokens

    def ids_to_tokens(self, ids):
        """Any int tensor of ids -> the same-shaped tensor of token strings."""
        return tf.gather(self._tokens, tf.cast(ids, tf.int32))

    def join(self, tokens):
        """Ragged `(B, None)` token strings -> `(B,)` strings."""
        joined = tf.strings.reduce_join(tokens, axis=-1, separator=self.separator)
        if self.split == "wordpiece":  # "chat ##s" -> "chats"
            joined = tf.strings.regex_replace(joined, " " + SUFFIX, "")
        return joined

    def get_config(self):
        return {
            "vocabulary": list(self.vocabulary),
            "split": self.split,
            "lowercase": self.lowercase,
            "max_length": self.max_length,
        }


def to_utf8(text, argument="texts", owner="Translator"):
    """`text` (str or bytes) as UTF-8 bytes, or our ValueError.

    Text that is not valid Unicode cannot be tokenized faithfully: a `str`
    holding a lone surrogate (`"\ud800"`, which has no UTF-8 encoding) and
    bytes that are not UTF-8 are refused, naming `owner`, `argument` and the
    position of the first invalid code unit, on every translator.
    """
    try:
        if isinstance(text, bytes):
            text.decode("utf-8")
            return text
        return text.encode("utf-8")
    except UnicodeError as error:
        raise ValueError(
            f"{owner}: `{argument}` must be valid Unicode text (encodable as "
            f"UTF-8); {error.reason} at position {error.start}. Received: "
            f"{argument} containing {text!r}"
        ) from None


def as_string_array(texts, argument="texts", owner="Translator"):
    """Validates a string or list of strings and returns a 1-D numpy array.

    `owner` names the class and method in errors (`"TransformerTranslator.
    translate"`). The strings come back as UTF-8 bytes; text that is not
    valid Unicode is refused (`to_utf8`).
    """
    if isinstance(texts, tf.Tensor):
        if tf.is_symbolic_tensor(texts):
            raise TypeError(
                f"{owner}: `{argument}` must be a string, a list of strings or an "
                f"eager string tensor. Received: a symbolic tensor {texts!r}"
            )
        texts = texts.numpy()  # a scalar string tensor gives bytes, not an array
    if isinstance(texts, np.ndarray):
        texts = texts.tolist()
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    if not isinstance(texts, (list, tuple)):
        raise TypeError(
            f"{owner}: `{argument}` must be a string or a list of strings. "
            f"Received: {argument}={texts!r} of type {type(texts).__name__}"
        )
    for text in texts:
        if not isinstance(text, (str, bytes)):
            raise TypeError(
                f"{owner}: `{argument}` must be strings. Received: "
                f"{argument} containing {text!r} of type {type(text).__name__}"
            )
    return np.array([to_utf8(t, argument, owner) for t in texts], dtype=object)
