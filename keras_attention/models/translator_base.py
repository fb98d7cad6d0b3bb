"""What every translator shares: text processing, training data, decoding.

A subclass builds its layers, implements `call` for teacher forcing and two
decoding hooks, and gets `translate` (greedy and beam search compiled as
`tf.while_loop`s), `decoding_session`, `make_dataset` and export for free:

- `_start_decoding(source_ids, max_length) -> (context, states)`: `context`
  is a tuple of batch-major tensors that stay fixed while decoding (encoder
  outputs, masks, precomputed cross-attention keys/values); `states` is a
  list of batch-major tensors that each step updates (RNN states,
  self-attention caches). Beam search repeats and reorders both along the
  batch axis.
- `_decode_step(token_ids (N,), states, context, step, with_scores=False)
  -> (logits (N, V) float32, states, attention (N, ..., T_in) float32,
  pre-softmax scores like attention or None)`.
- `_alignment_layout(alignment (T_out, ..., T_in))`: the `Translation`
  layout of one text's alignment.
"""

import inspect

import keras
import tensorflow as tf

from keras_attention import _extras
from keras_attention import validation
from keras_attention.models import text_processing
from keras_attention.models.decoding import DecodingSession
from keras_attention.models.decoding import Translation
from keras_attention.models.text_processing import END_ID
from keras_attention.models.text_processing import PAD_ID
from keras_attention.models.text_processing import START_ID
from keras_attention.models.text_processing import TextEncoder
from keras_attention.progress import progress_bar

# Finite stand-in for log(0): keeps beam arithmetic free of inf - inf = NaN.
_NEG_INF = -1e9
# Decoding counts steps and indexes beam candidates in int32.
INT32_MAX = 2**31 - 1


def positive_int(argument, value, allow_none=False, owner="Translator"):
    return validation.validate_positive_int(owner, argument, value, allow_none)


def next_token_log_probs(logits):
    """Log-softmax over the tokens a decoder may emit.

    `<pad>` and `<start>` are never emitted: their logits are dropped and the
    distribution renormalized over the other tokens (`<end>`, `<unk>` and the
    vocabulary).
    """
    logits = tf.cast(logits, tf.float32)
    allowed = tf.logical_and(
        tf.not_equal(tf.range(tf.shape(logits)[-1]), PAD_ID),
        tf.not_equal(tf.range(tf.shape(logits)[-1]), START_ID),
    )
    return tf.nn.log_softmax(tf.where(allowed, logits, _NEG_INF))


def _batch_major(stacked):
    """`(steps, B, ...)` from a TensorArray -> `(B, steps, ...)`."""
    rank = stacked.shape.rank
    return tf.transpose(stacked, [1, 0] + list(range(2, rank)))


def _keep_decoding(max_length):
    """The `tf.while_loop` condition of both searches: below `max_length`
    steps while a hypothesis is unfinished, and at least one step, so that
    an empty batch still stacks its arrays."""

    def cond(step, previous, states, finished, *_):
        return tf.logical_and(
            step < max_length, tf.logical_or(step == 0, tf.logical_not(tf.reduce_all(finished)))
        )

    return cond


def _expand_like(mask, tensor):
    """Appends axes to `mask` until it has `tensor`'s rank."""
    for _ in range(tensor.shape.rank - mask.shape.rank):
        mask = mask[..., None]
    return mask


class Translator(keras.Model):
    """Base class of the translators (TensorFlow backend); see the module doc.

    Args:
        source_vocabulary, target_vocabulary: token lists starting with
            `("<pad>", "<unk>", "<start>", "<end>")`.
        source_split, target_split: `"character"`, `"whitespace"` or
            `"wordpiece"` (subwords; see `text_processing`).
        lowercase: case-fold source and target text.
        max_source_length: source tokens kept per text (the rest is dropped).
        max_target_length: output tokens per text, `<end>` included; the
            default maximum decoding length.
    """

    supports_decoding_session = True

    def __init__(
        self,
        source_vocabulary,
        target_vocabulary,
        source_split="character",
        target_split="character",
        lowercase=True,
        max_source_length=48,
        max_target_length=16,
        **kwargs,
    ):
        super().__init__(**kwargs)
        owner = type(self).__name__
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                f"{owner} needs the TensorFlow backend (its text processing is "
                f"tensorflow-text). Received: KERAS_BACKEND="
                f"{keras.backend.backend()!r}"
            )
        self.max_source_length = positive_int("max_source_length", max_source_length, owner=owner)
        self.max_target_length = positive_int("max_target_length", max_target_length, owner=owner)
        self.lowercase = bool(lowercase)
        self.source_text = TextEncoder(
            source_vocabulary,
            source_split,
            lowercase,
            self.max_source_length,
            name="source_text",
            owner=owner,
            role="source",
        )
        self.target_text = TextEncoder(
            target_vocabulary,
            target_split,
            lowercase,
            self.max_target_length,
            name="target_text",
            owner=owner,
            role="target",
        )
        # Every translator tokenizes with tensorflow-text (the `text` extra):
        # say so here, not from deep inside the first `fit` or `translate`.
        _extras.require_tensorflow_text(owner)
        self._decode_functions = _FunctionCache()

    # Nested layers a config may hold: `{config key: (classes, what)}`;
    # `from_config` checks the class of each before the translator uses it.
    _nested_layer_types = {}

    @classmethod
    def from_config(cls, config):
        """Rebuilds the translator, checking the class of every nested layer.

        A config (a `.keras` file's, possibly tampered with) naming a layer
        of another class raises our TypeError, with or without `safe_mode`.
        """
        config = dict(config)
        for key, (expected, description) in cls._nested_layer_types.items():
            if isinstance(config.get(key), dict):
                config[key] = validation.deserialize_layer(
                    cls.__name__, key, config[key], expected, description
                )
        return cls(**config)

    def _build_weights(self):
        """Calls the model once so every weight exists before `fit`."""
        self(
            (
                tf.zeros((1, self.max_source_length), tf.int32),
                tf.zeros((1, self.max_target_length), tf.int32),
            )
        )

    def _text_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "source_vocabulary": list(self.source_vocabulary),
            "target_vocabulary": list(self.target_vocabulary),
            "source_split": self.source_text.split,
            "target_split": self.target_text.split,
            "lowercase": self.lowercase,
            "max_source_length": self.max_source_length,
            "max_target_length": self.max_target_length,
        }

    def _alignment_layout(self, alignment):
        return alignment

    @classmethod
    def from_texts(
        cls,
        source_texts,
        target_texts,
        source_split=None,
        target_split=None,
        lowercase=True,
        max_tokens=None,
        min_count=1,
        **kwargs,
    ):
        """Builds the vocabularies from training texts, then the translator."""
        defaults = inspect.signature(cls.__init__).parameters
        source_split = source_split or defaults["source_split"].default
        target_split = target_split or defaults["target_split"].default
        owner = f"{cls.__name__}.from_texts"
        source_texts = [_as_str(t, "source_texts", owner) for t in source_texts]
        target_texts = [_as_str(t, "target_texts", owner) for t in target_texts]
        if len(source_texts) != len(target_texts) or not source_texts:
            raise ValueError(
                f"{cls.__name__}.from_texts: needs as many target texts as "
                f"source texts, at least one. Received: {len(source_texts)} "
                f"source and {len(target_texts)} target texts"
            )
        _extras.require_tensorflow_text(f"{cls.__name__}.from_texts")
        source_vocabulary = text_processing.build_vocabulary(
            source_texts, source_split, lowercase, max_tokens, min_count
        )
        target_vocabulary = text_processing.build_vocabulary(
            target_texts, target_split, lowercase, max_tokens, min_count
        )
        return cls(
            source_vocabulary,
            target_vocabulary,
            source_split=source_split,
            target_split=target_split,
            lowercase=lowercase,
            **kwargs,
        )

    @property
    def source_vocabulary(self):
        return self.source_text.vocabulary

    @property
    def target_vocabulary(self):
        return self.target_text.vocabulary

    @property
    def target_separator(self):
        return self.target_text.separator

    def join_target_tokens(self, tokens):
        """Target tokens (strings) -> the text `translate()` makes of them.

        The same graph join `translate()` and the SavedModel use, so
        WordPiece continuations are glued (`["chat", "##s"]` -> `"chats"`).
        """
        ragged = tf.ragged.constant([[str(t) for t in tokens]], dtype=tf.string, ragged_rank=1)
        return self.target_text.join(ragged)[0].numpy().decode("utf-8")

    # --------------------------------------------------------------- training
    def make_dataset(self, source_texts, target_texts, batch_size=64, shuffle=True, seed=None):
        """A `tf.data.Dataset` of `((source_ids, decoder_inputs), targets)`.

        Targets are the target ids followed by `<end>` (truncated to
        `max_target_length`); decoder inputs are the same shifted right behind
        `<start>` (teacher forcing). Padding is id 0, which the default loss
        ignores.
        """
        owner = f"{type(self).__name__}.make_dataset"
        source_texts = text_processing.as_string_array(source_texts, "source_texts", owner=owner)
        target_texts = text_processing.as_string_array(target_texts, "target_texts", owner=owner)
        if len(source_texts) != len(target_texts):
            raise ValueError(
                f"{type(self).__name__}.make_dataset: needs as many target texts as "
                f"source texts. Received: {len(source_texts)} and "
                f"{len(target_texts)}"
            )
        dataset = tf.data.Dataset.from_tensor_slices((source_texts, target_texts))
        if shuffle:
            dataset = dataset.shuffle(len(source_texts), seed=seed)
        return (
            dataset.batch(batch_size)
            .map(self._training_example, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE)
        )

    def _training_example(self, sources, targets):
        source_ids, _ = self.source_text.encode(sources)
        target_ids, _ = self.target_text.encode(targets, add_end=True)
        start = tf.fill([tf.shape(target_ids)[0], 1], START_ID)
        decoder_inputs = tf.concat([start, target_ids[:, :-1]], axis=1)
        return (source_ids, decoder_inputs), target_ids

    def fit(self, x=None, *args, **kwargs):
        """`keras.Model.fit`. A dataset from `make_dataset` shuffles itself."""
        if isinstance(x, tf.data.Dataset):
            kwargs.setdefault("shuffle", False)
        return super().fit(x, *args, **kwargs)

    def compile(self, optimizer="adam", loss=None, **kwargs):
        """`keras.Model.compile`; the default loss ignores padding targets."""
        if loss is None:
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD_ID)
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def compile_from_config(self, config):
        """Restores `compile` when loading from `.keras`.

        Keras skips (with a warning) models whose `compile` is overridden;
        ours only fills in defaults, so the saved arguments apply unchanged.
        """
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # --------------------------------------------------------------- decoding
    def _greedy_search(self, source_ids, max_length):
        """Greedy decoding as one `tf.while_loop`; see `_search_outputs`."""
        batch = tf.shape(source_ids)[0]
        context, states = self._start_decoding(source_ids, max_length)

        def body(step, previous, states, finished, lengths, log_prob, tokens_ta, weights_ta):
            logits, states, weights, _ = self._decode_step(previous, states, context, step)
            log_probs = next_token_log_probs(logits)
            token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
            token = tf.where(finished, PAD_ID, token)
            token_log_prob = tf.gather(log_probs, token, batch_dims=1)
            log_prob += tf.where(finished, 0.0, token_log_prob)
            lengths += tf.cast(tf.logical_not(finished), tf.int32)
            finished = tf.logical_or(finished, tf.equal(token, END_ID))
            return (
                step + 1,
                token,
                states,
                finished,
                lengths,
                log_prob,
                tokens_ta.write(step, token),
                weights_ta.write(step, weights),
            )

        loop_vars = (
            tf.constant(0),
            tf.fill([batch], START_ID),
            states,
            tf.zeros([batch], tf.bool),
            tf.zeros([batch], tf.int32),
            tf.zeros([batch], tf.float32),
            tf.TensorArray(tf.int32, size=0, dynamic_size=True),
            tf.TensorArray(tf.float32, size=0, dynamic_size=True),
        )
        _, _, _, _, lengths, log_prob, tokens_ta, weights_ta = tf.while_loop(
            _keep_decoding(max_length), body, loop_vars
        )
        tokens = tf.transpose(tokens_ta.stack(), [1, 0])  # (B, steps)
        weights = _batch_major(weights_ta.stack())  # (B, steps, ..., T_in)
        return tokens, weights, log_prob, lengths

    def _beam_search(self, source_ids, max_length, beam_width):
        """Beam search as one `tf.while_loop`, then a backtracking loop.

        Each step expands the `beam_width` hypotheses of every input, keeps
        the best `beam_width` by total log-probability, and records each
        survivor's token, parent beam and attention row; a finished
        hypothesis stays in the beam at no cost. The best hypothesis is then
        read back through the parent pointers. Per step the work is `O(T_in)`
        per hypothesis.
        """
        batch = tf.shape(source_ids)[0]
        vocabulary_size = self.target_text.size
        context, states = self._start_decoding(source_ids, max_length)
        # Every hypothesis is a row of a (B * K) batch.
        context = tuple(tf.repeat(c, beam_width, axis=0) for c in context)
        states = [tf.repeat(s, beam_width, axis=0) for s in states]
        only_padding = tf.where(tf.equal(tf.range(vocabulary_size), PAD_ID), 0.0, _NEG_INF)
        batch_offsets = tf.range(batch)[:, None] * beam_width  # (B, 1)

        def body(
            step, previous, states, finished, lengths, log_prob, tokens_ta, parents_ta, weights_ta
        ):
            logits, states, weights, _ = self._decode_step(previous, states, context, step)
            log_probs = tf.reshape(
                next_token_log_probs(logits), [batch, beam_width, vocabulary_size]
            )
            log_probs = tf.where(finished[:, :, None], only_padding, log_probs)
            total = tf.reshape(
                log_prob[:, :, None] + log_probs,
                [batch, beam_width * vocabulary_size],
            )
            log_prob, best = tf.math.top_k(total, k=beam_width)  # (B, K)
            parent = best // vocabulary_size
            token = best % vocabulary_size
            rows = tf.reshape(parent + batch_offsets, [-1])  # (B * K,)
            states = [tf.gather(s, rows) for s in states]
            parent_finished = tf.gather(finished, parent, batch_dims=1)
            lengths = tf.gather(lengths, parent, batch_dims=1) + tf.cast(
                tf.logical_not(parent_finished), tf.int32
            )
            finished = tf.logical_or(parent_finished, tf.equal(token, END_ID))
            weights = tf.gather(
                tf.reshape(
                    weights, tf.concat([[batch, beam_width], tf.shape(weights)[1:]], axis=0)
                ),
                parent,
                batch_dims=1,
            )
            return (
                step + 1,
                tf.reshape(token, [-1]),
                states,
                finished,
                lengths,
                log_prob,
                tokens_ta.write(step, token),
                parents_ta.write(step, parent),
                weights_ta.write(step, weights),
            )

        first_beam_only = tf.where(tf.range(beam_width) == 0, 0.0, _NEG_INF)
        loop_vars = (
            tf.constant(0),
            tf.fill([batch * beam_width], START_ID),
            states,
            tf.zeros([batch, beam_width], tf.bool),
            tf.zeros([batch, beam_width], tf.int32),
            tf.tile(first_beam_only[None, :], [batch, 1]),
            tf.TensorArray(tf.int32, size=0, dynamic_size=True),
            tf.TensorArray(tf.int32, size=0, dynamic_size=True),
            tf.TensorArray(tf.float32, size=0, dynamic_size=True),
        )
        (steps, _, _, _, lengths, log_prob, tokens_ta, parents_ta, weights_ta) = tf.while_loop(
            _keep_decoding(max_length), body, loop_vars
        )
        return steps, lengths, log_prob, tokens_ta, parents_ta, weights_ta

    def _backtrack(self, steps, chosen, tokens_ta, parents_ta, weights_ta):
        """Follows parent pointers from beam `chosen (B,)` at the last step."""

        def body(step, beam, tokens_out, weights_out):
            token = tf.gather(tokens_ta.read(step), beam, batch_dims=1)
            weights = tf.gather(weights_ta.read(step), beam, batch_dims=1)
            beam = tf.gather(parents_ta.read(step), beam, batch_dims=1)
            return (step - 1, beam, tokens_out.write(step, token), weights_out.write(step, weights))

        _, _, tokens_out, weights_out = tf.while_loop(
            lambda step, *_: step >= 0,
            body,
            (
                steps - 1,
                chosen,
                tf.TensorArray(tf.int32, size=steps),
                tf.TensorArray(tf.float32, size=steps),
            ),
        )
        return (tf.transpose(tokens_out.stack(), [1, 0]), _batch_major(weights_out.stack()))

    def serving_outputs(self, texts, beam_width, max_length, length_penalty, method="auto"):
        """The decoding graph behind `translate` and the exported signatures.

        Args:
            texts: `(B,)` string tensor.
            beam_width: Python int, or a scalar int32 tensor with
                `method="beam"` (the width is then chosen at run time).
            max_length: Python int, the most output tokens.
            length_penalty: scalar float32 tensor.
            method: `"greedy"`, `"beam"`, or `"auto"` (greedy for width 1).

        Returns the dict documented in `_search_outputs`.
        """
        return self._search_outputs(texts, beam_width, max_length, length_penalty, method)

    def _search_outputs(self, texts, beam_width, max_length, length_penalty, method="auto"):
        """Graph body shared by `translate` and the exported signature.

        Returns a dict of tensors padded to the batch's longest output
        (`T_out`, `<end>` excluded) and source (`T_in`): `translation (B,)`
        strings, `target_tokens (B, T_out)` strings (padding `""`),
        `token_ids (B, T_out)` (padding 0), `alignment (B, T_out, ..., T_in)`
        (padding 0.0), `source_tokens (B, T_in)` strings (padding `""`),
        `source_length (B,)`, `output_length (B,)`, `score (B,)`.
        """
        source_ids, source_tokens = self.source_text.encode(texts)
        source_length = tf.cast(source_tokens.row_lengths(), tf.int32)
        if method == "greedy" or (method == "auto" and beam_width == 1):
            token_ids, weights, log_prob, lengths = self._greedy_search(source_ids, max_length)
        else:
            steps, lengths, log_prob, tokens_ta, parents_ta, weights_ta = self._beam_search(
                source_ids, max_length, beam_width
            )
            normalized = log_prob / tf.pow(
                tf.cast(tf.maximum(lengths, 1), tf.float32), length_penalty
            )
            chosen = tf.argmax(normalized, axis=-1, output_type=tf.int32)
            log_prob = tf.gather(log_prob, chosen, batch_dims=1)
            lengths = tf.gather(lengths, chosen, batch_dims=1)
            token_ids, weights = self._backtrack(steps, chosen, tokens_ta, parents_ta, weights_ta)
        score = log_prob / tf.pow(tf.cast(tf.maximum(lengths, 1), tf.float32), length_penalty)
        # Tokens before <end>; an empty source translates to an empty text.
        has_source = source_length > 0
        is_end = tf.equal(token_ids, END_ID)
        before_end = tf.equal(tf.cumsum(tf.cast(is_end, tf.int32), axis=1), 0)
        keep = tf.logical_and(before_end, has_source[:, None])
        output_length = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
        score = tf.where(has_source, score, 0.0)
        token_ids = tf.where(keep, token_ids, PAD_ID)
        weights = tf.where(_expand_like(keep, weights), weights, 0.0)
        # Padded to the batch's longest output and source, not to the limits,
        # so a served response carries no columns that are zero for every row.
        output_width = tf.reduce_max(tf.concat([output_length, [0]], axis=0))
        source_width = tf.reduce_max(tf.concat([source_length, [0]], axis=0))
        token_ids = token_ids[:, :output_width]
        weights = weights[:, :output_width, ..., :source_width]
        output_tokens = tf.RaggedTensor.from_tensor(token_ids, lengths=output_length)
        output_strings = self.target_text.ids_to_tokens(output_tokens)
        return {
            "translation": self.target_text.join(output_strings),
            "target_tokens": output_strings.to_tensor(default_value=""),
            "token_ids": token_ids,
            "alignment": weights,
            "source_tokens": source_tokens.to_tensor(default_value=""),
            "source_length": source_length,
            "output_length": output_length,
            "score": score,
        }

    def _decode_function(self, beam_width, max_length, method):
        key = (beam_width, max_length, method)
        functions = self._decode_functions.functions
        if key not in functions:

            def decode(texts, length_penalty):
                return self._search_outputs(texts, beam_width, max_length, length_penalty, method)

            # No AutoGraph: the search is written with explicit
            # `tf.while_loop`s, and converting our code recursively is slow
            # and once mis-resolved a function in a long-running process.
            functions[key] = tf.function(
                decode,
                autograph=False,
                input_signature=[
                    tf.TensorSpec([None], tf.string),
                    tf.TensorSpec([], tf.float32),
                ],
            )
        return functions[key]

    def max_beam_width(self):
        """The widest beam search can go: `(2**31 - 1) // target vocabulary size`.

        Beam search ranks `beam_width * vocabulary size` candidates per text
        with int32 indices (`tf.math.top_k`), so a wider beam cannot be
        indexed.
        """
        return INT32_MAX // self.target_text.size

    def check_decoding_arguments(
        self, beam_width, max_length, length_penalty, owner=None, beam_argument="beam_width"
    ):
        """`(beam_width, max_length, length_penalty)` as Python numbers, or a
        ValueError/TypeError naming `owner` (`translate` and
        `export.export_translator` check their arguments with it).

        NumPy scalars and 0-d arrays count as the numbers they hold. Limits:
        `1 <= beam_width <= max_beam_width()`, `1 <= max_length <= 2**31 - 1`
        (decoding steps are counted in int32).
        """
        owner = owner or f"{type(self).__name__}.translate"
        beam_width = validation.validate_positive_int(owner, beam_argument, beam_width)
        if beam_width > self.max_beam_width():
            raise ValueError(
                validation.error(
                    owner,
                    f"`{beam_argument}` must be at most {self.max_beam_width()} "
                    f"((2**31 - 1) // {self.target_text.size} target tokens: beam "
                    f"search indexes beam_width x vocabulary candidates in int32). "
                    f"Received: {beam_argument}={beam_width}",
                )
            )
        if max_length is None:
            max_length = self.max_target_length
        max_length = validation.validate_positive_int(
            owner, "max_length", max_length, allow_none=True
        )
        if max_length > INT32_MAX:
            raise ValueError(
                validation.error(
                    owner,
                    f"`max_length` must be at most {INT32_MAX} (decoding steps "
                    f"are counted in int32). Received: max_length={max_length}",
                )
            )
        length_penalty = validation.validate_real(owner, "length_penalty", length_penalty)
        return beam_width, max_length, length_penalty

    def translate(
        self,
        texts,
        beam_width=1,
        max_length=None,
        length_penalty=0.0,
        batch_size=256,
        verbose="auto",
        _method="auto",
    ):
        """Translates strings; returns one `Translation` per input.

        Args:
            texts: a string or a list of strings (str or UTF-8 bytes). An
                empty string (no tokens) translates to `""` with score 0 and an
                empty alignment. Text that is not valid Unicode (a lone
                surrogate, bytes that are not UTF-8) is refused with a
                ValueError naming `texts` (`text_processing.to_utf8`).
            beam_width: 1 for greedy decoding, more for beam search, at most
                `max_beam_width()`.
            max_length: maximum output tokens (`<end>` included), at most
                2**31 - 1; defaults to `max_target_length`. Output stopped by
                the limit has no `<end>`.
            length_penalty: hypotheses are ranked by
                `log_prob / num_tokens ** length_penalty` (0: plain log-prob).
            batch_size: texts decoded per compiled call (outputs do not depend
                on it).
            verbose: `0` silent, `1` a `keras.utils.Progbar` over batches,
                `2` one line at the end (as in `model.predict`); `"auto"` is
                1 when the texts span more than one batch, else 0.

        Greedy and beam search each run as one compiled TensorFlow loop over
        the whole batch; the alignment rows are the decoder's attention
        weights when it emitted each token.
        """
        owner = f"{type(self).__name__}.translate"
        beam_width, max_length, length_penalty = self.check_decoding_arguments(
            beam_width, max_length, length_penalty, owner=owner
        )
        texts = text_processing.as_string_array(texts, owner=owner)
        batch_size = positive_int("batch_size", batch_size, owner=owner)
        starts = range(0, len(texts), batch_size)
        progress = progress_bar(
            len(starts), verbose, unit_name="batch", auto=len(starts) > 1, owner=owner
        )
        if len(texts) == 0:
            return []
        function = self._decode_function(beam_width, max_length, _method)
        results = []
        for done, start in enumerate(starts, 1):
            batch = texts[start : start + batch_size]
            outputs = function(
                tf.constant(batch, tf.string), tf.constant(length_penalty, tf.float32)
            )
            results.extend(self._translations(batch, outputs))
            if progress is not None:
                progress.update(done, finalize=done == len(starts))
        return results

    def _translations(self, texts, outputs):
        outputs = {k: v.numpy() for k, v in outputs.items()}
        results = []
        for row in range(len(texts)):
            source_length = int(outputs["source_length"][row])
            output_length = int(outputs["output_length"][row])
            results.append(
                Translation(
                    text=outputs["translation"][row].decode("utf-8"),
                    tokens=[
                        t.decode("utf-8") for t in outputs["target_tokens"][row, :output_length]
                    ],
                    source_tokens=[
                        t.decode("utf-8") for t in outputs["source_tokens"][row, :source_length]
                    ],
                    score=float(outputs["score"][row]),
                    alignment=self._alignment_layout(
                        outputs["alignment"][row, :output_length, ..., :source_length].astype(
                            "float32"
                        )
                    ),
                )
            )
        return results

    # ---------------------------------------------------------------- session
    def decoding_session(self, text, top_k=5):
        """A `DecodingSession` that decodes `text` one token per `step()`."""
        return DecodingSession(self, text, top_k=top_k)

    def session_start(self, text):
        """The decoding-session protocol's first call (`models.decoding`):
        `(source_tokens, state)` for `text`; `DecodingSession` calls it."""
        texts = text_processing.as_string_array(
            [text], "text", owner=f"{type(self).__name__}.decoding_session"
        )
        source_ids, tokens = self.source_text.encode(tf.constant(texts, tf.string))
        context, states = self._start_decoding(source_ids, self.max_target_length)
        source_tokens = [t.decode("utf-8") for t in tokens.to_list()[0]]
        state = {"context": context, "states": states, "step": 0, "length": len(source_tokens)}
        return source_tokens, state

    def session_step(self, state, previous_token_id):
        """One decoding step after `previous_token_id`: `(log_probs (V,),
        attention, scores or None, next_state)` (the protocol in
        `models.decoding`)."""
        logits, states, weights, scores = self._decode_step(
            tf.constant([previous_token_id], tf.int32),
            state["states"],
            state["context"],
            tf.constant(state["step"]),
            with_scores=True,
        )
        length = state["length"]
        if scores is not None:
            scores = scores[0, ..., :length].numpy()
        log_probs = next_token_log_probs(logits)[0].numpy()
        return (
            log_probs,
            weights[0, ..., :length].numpy(),
            scores,
            {**state, "states": states, "step": state["step"] + 1},
        )


class _FunctionCache:
    """Compiled decoding functions; a plain object so SavedModels skip it."""

    def __init__(self):
        self.functions = {}


def _as_str(text, argument, owner):
    if isinstance(text, (str, bytes)):
        return text_processing.to_utf8(text, argument, owner).decode("utf-8")
    return str(text)
