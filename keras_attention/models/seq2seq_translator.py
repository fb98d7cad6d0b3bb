"""A recurrent encoder-decoder translator with attention (TensorFlow backend)."""

import keras
import numpy as np
import tensorflow as tf

from keras_attention.layers.additive_attention import AdditiveAttention
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.layers.low_rank_attention import LowRankAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.models import text_processing
from keras_attention.models.decoding import DecodingSession
from keras_attention.models.decoding import Translation
from keras_attention.models.text_processing import END_ID
from keras_attention.models.text_processing import PAD_ID
from keras_attention.models.text_processing import START_ID
from keras_attention.models.text_processing import TextEncoder

ATTENTION_NAMES = ("additive", "luong", "general", "concat", "low_rank")
RNN_NAMES = ("gru", "lstm")
# Finite stand-in for log(0): keeps beam arithmetic free of inf - inf = NaN.
_NEG_INF = -1e9


def make_attention(attention, units, name="attention"):
    """Returns the attention layer named by `attention` (or `attention` itself).

    - `"additive"`: `AdditiveAttention(units)` (Bahdanau).
    - `"luong"`: `LuongAttention(score="dot")`, the seed's plain dot product.
    - `"general"`: `LuongAttention(score="general")`, `s^T W h`.
    - `"concat"`: `LuongAttention(score="concat", units)`.
    - `"low_rank"`: `LowRankAttention(rank=max(1, units // 4))`.
    """
    if isinstance(attention, BaseAttention):
        return attention
    if isinstance(attention, dict):
        layer = keras.saving.deserialize_keras_object(attention)
        if isinstance(layer, BaseAttention):
            return layer
    if attention == "additive":
        return AdditiveAttention(units=units, name=name)
    if attention == "luong":
        return LuongAttention(score="dot", name=name)
    if attention == "general":
        return LuongAttention(score="general", name=name)
    if attention == "concat":
        return LuongAttention(score="concat", units=units, name=name)
    if attention == "low_rank":
        return LowRankAttention(rank=max(1, units // 4), name=name)
    raise ValueError(
        f"Seq2SeqTranslator: `attention` must be one of {ATTENTION_NAMES} or a "
        "keras_attention single-head attention layer (e.g. "
        f"AdditiveAttention()). Received: attention={attention!r}"
    )


def _positive_int(argument, value, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ValueError(
            f"Seq2SeqTranslator: `{argument}` must be a positive integer"
            f"{' or None' if allow_none else ''}. Received: {argument}={value!r}"
        )
    return int(value)


@keras.saving.register_keras_serializable(package="keras_attention")
class Seq2SeqTranslator(keras.Model):
    """Bidirectional RNN encoder, RNN decoder with attention, text in and out.

    The model of Luong et al. 2015 (https://arxiv.org/abs/1508.04025) and of
    the seed lecture's "attention in equations": at output step `t` the decoder
    state `s_t` attends over the encoder states `h_1..h_N`; the attention
    output `a_t` is concatenated with `s_t` and fed through
    `tanh(W [a_t; s_t])` to the output projection. The attention does not
    feed back into the recurrence, so teacher-forced training runs the decoder
    RNN over the whole target at once, and each decoding step costs `O(T_in)`.

    Text processing (tensorflow-text, in the graph) is part of the model:
    `translate` and the exported SavedModel take raw strings. See
    `keras_attention.models.text_processing` for the tokenization, reserved
    ids and the truncation rule (a source longer than `max_source_length`
    tokens keeps its first `max_source_length` tokens; unknown tokens map to
    `<unk>`).

    Only the TensorFlow backend is supported (tensorflow-text and the
    compiled decoding loop are TensorFlow).

    Args:
        source_vocabulary, target_vocabulary: token lists starting with
            `("<pad>", "<unk>", "<start>", "<end>")`; build them with
            `Seq2SeqTranslator.from_texts` or `text_processing.build_vocabulary`.
        source_split, target_split: `"character"` or `"whitespace"`.
        lowercase: case-fold source and target text.
        max_source_length: source tokens kept per text (the rest is dropped).
        max_target_length: output tokens per text, `<end>` included; the
            default maximum decoding length.
        embedding_dim: size of the token embeddings.
        units: decoder state size (even); each encoder direction has
            `units // 2`, so encoder states also have `units` features.
        rnn: `"gru"` or `"lstm"`.
        attention: `"additive"`, `"luong"` (dot), `"general"`, `"concat"`,
            `"low_rank"`, or a keras_attention single-head attention layer.
        dropout: dropout on the attentional hidden state during training.
        seed: seed for dropout.

    Example:

    >>> from keras_attention.models import Seq2SeqTranslator
    >>> translator = Seq2SeqTranslator.from_texts(
    ...     ["one two", "two one"], ["1 2", "2 1"], units=8, embedding_dim=4)
    >>> translator.compile()
    >>> dataset = translator.make_dataset(["one two"], ["1 2"], batch_size=1)
    >>> _ = translator.fit(dataset, epochs=1, verbose=0)
    >>> result = translator.translate(["one two"], beam_width=2)[0]
    >>> result.alignment.shape[1] == len(result.source_tokens) == 7
    True
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
        embedding_dim=32,
        units=64,
        rnn="gru",
        attention="additive",
        dropout=0.0,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                "Seq2SeqTranslator needs the TensorFlow backend (its text "
                "processing is tensorflow-text). Received: KERAS_BACKEND="
                f"{keras.backend.backend()!r}"
            )
        units = _positive_int("units", units)
        if units % 2:
            raise ValueError(
                "Seq2SeqTranslator: `units` must be even (each encoder "
                f"direction gets units // 2). Received: units={units}"
            )
        if rnn not in RNN_NAMES:
            raise ValueError(
                f"Seq2SeqTranslator: `rnn` must be one of {RNN_NAMES}. "
                f"Received: rnn={rnn!r}"
            )
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(
                "Seq2SeqTranslator: `dropout` must be a float in [0, 1). "
                f"Received: dropout={dropout!r}"
            )
        self.max_source_length = _positive_int("max_source_length", max_source_length)
        self.max_target_length = _positive_int("max_target_length", max_target_length)
        self.embedding_dim = _positive_int("embedding_dim", embedding_dim)
        self.units = units
        self.rnn = rnn
        self.dropout = float(dropout)
        self.seed = seed
        self.lowercase = bool(lowercase)
        self.source_text = TextEncoder(
            source_vocabulary, source_split, lowercase, self.max_source_length,
            name="source_text",
        )
        self.target_text = TextEncoder(
            target_vocabulary, target_split, lowercase, self.max_target_length,
            name="target_text",
        )
        self.attention_name = attention if isinstance(attention, str) else None

        rnn_class = keras.layers.GRU if rnn == "gru" else keras.layers.LSTM
        self.source_embedding = keras.layers.Embedding(
            self.source_text.size, embedding_dim, mask_zero=True,
            name="source_embedding",
        )
        self.encoder = keras.layers.Bidirectional(
            rnn_class(units // 2, return_sequences=True, return_state=True),
            name="encoder",
        )
        self.state_bridges = [
            keras.layers.Dense(units, activation="tanh", name=f"bridge_{i}")
            for i in range(1 if rnn == "gru" else 2)
        ]
        self.target_embedding = keras.layers.Embedding(
            self.target_text.size, embedding_dim, name="target_embedding"
        )
        self.decoder = rnn_class(
            units, return_sequences=True, return_state=True, name="decoder"
        )
        self.attention = make_attention(attention, units)
        self.attention_projection = keras.layers.Dense(
            units, activation="tanh", name="attention_projection"
        )
        self.hidden_dropout = keras.layers.Dropout(self.dropout, seed=seed)
        self.output_projection = keras.layers.Dense(
            self.target_text.size, name="output_projection"
        )
        # Build every weight now, so translate() and sessions work before fit.
        self(
            (
                tf.zeros((1, self.max_source_length), tf.int32),
                tf.zeros((1, self.max_target_length), tf.int32),
            )
        )
        self._decode_functions = {}

    # ----------------------------------------------------------- construction
    @classmethod
    def from_texts(cls, source_texts, target_texts, source_split="character",
                   target_split="character", lowercase=True, max_tokens=None,
                   min_count=1, **kwargs):
        """Builds the vocabularies from training texts, then the translator."""
        source_texts = [_as_str(t) for t in source_texts]
        target_texts = [_as_str(t) for t in target_texts]
        if len(source_texts) != len(target_texts) or not source_texts:
            raise ValueError(
                "Seq2SeqTranslator.from_texts: needs as many target texts as "
                f"source texts, at least one. Received: {len(source_texts)} "
                f"source and {len(target_texts)} target texts"
            )
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

    def get_config(self):
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "source_vocabulary": list(self.source_vocabulary),
            "target_vocabulary": list(self.target_vocabulary),
            "source_split": self.source_text.split,
            "target_split": self.target_text.split,
            "lowercase": self.lowercase,
            "max_source_length": self.max_source_length,
            "max_target_length": self.max_target_length,
            "embedding_dim": self.embedding_dim,
            "units": self.units,
            "rnn": self.rnn,
            "attention": self.attention_name
            or keras.saving.serialize_keras_object(self.attention),
            "dropout": self.dropout,
            "seed": self.seed,
        }
        return config

    # --------------------------------------------------------------- training
    def make_dataset(self, source_texts, target_texts, batch_size=64,
                     shuffle=True, seed=None):
        """A `tf.data.Dataset` of `((source_ids, decoder_inputs), targets)`.

        Targets are the target ids followed by `<end>` (truncated to
        `max_target_length`); decoder inputs are the same shifted right behind
        `<start>` (teacher forcing). Padding is id 0, which the default loss
        ignores.
        """
        source_texts = text_processing.as_string_array(source_texts, "source_texts")
        target_texts = text_processing.as_string_array(target_texts, "target_texts")
        if len(source_texts) != len(target_texts):
            raise ValueError(
                "Seq2SeqTranslator.make_dataset: needs as many target texts as "
                f"source texts. Received: {len(source_texts)} and "
                f"{len(target_texts)}"
            )
        dataset = tf.data.Dataset.from_tensor_slices((source_texts, target_texts))
        if shuffle:
            dataset = dataset.shuffle(len(source_texts), seed=seed)
        return dataset.batch(batch_size).map(
            self._training_example, num_parallel_calls=tf.data.AUTOTUNE
        ).prefetch(tf.data.AUTOTUNE)

    def _training_example(self, sources, targets):
        source_ids, _ = self.source_text.encode(sources)
        target_ids, _ = self.target_text.encode(targets, add_end=True)
        start = tf.fill([tf.shape(target_ids)[0], 1], START_ID)
        decoder_inputs = tf.concat([start, target_ids[:, :-1]], axis=1)
        return (source_ids, decoder_inputs), target_ids

    def compile(self, optimizer="adam", loss=None, **kwargs):
        """`keras.Model.compile`; the default loss ignores padding targets."""
        if loss is None:
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=PAD_ID
            )
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    # ------------------------------------------------------------------ model
    def encode(self, source_ids, training=None):
        """`(B, T_in)` ids -> encoder states, source mask, decoder states."""
        source_mask = tf.not_equal(source_ids, PAD_ID)
        embedded = self.source_embedding(source_ids)
        outputs = self.encoder(embedded, mask=source_mask, training=training)
        encoder_outputs, final_states = outputs[0], outputs[1:]
        half = len(final_states) // 2
        forward, backward = final_states[:half], final_states[half:]
        decoder_states = [
            bridge(tf.concat([f, b], axis=-1))
            for bridge, f, b in zip(self.state_bridges, forward, backward)
        ]
        return encoder_outputs, source_mask, decoder_states

    def _attend(self, decoder_outputs, encoder_outputs, source_mask, training=None):
        context, weights = self.attention(
            decoder_outputs,
            encoder_outputs,
            value_mask=source_mask,
            return_attention_scores=True,
            training=training,
        )
        hidden = self.attention_projection(
            tf.concat([context, decoder_outputs], axis=-1)
        )
        hidden = self.hidden_dropout(hidden, training=training)
        return self.output_projection(hidden), weights

    def call(self, inputs, training=None, return_attention_scores=False):
        """Teacher forcing: `(source_ids, decoder_inputs)` -> logits `(B, T_out, V)`."""
        source_ids, decoder_inputs = inputs
        encoder_outputs, source_mask, states = self.encode(source_ids, training)
        embedded = self.target_embedding(decoder_inputs)
        decoder_outputs = self.decoder(
            embedded, initial_state=states, training=training
        )[0]
        logits, weights = self._attend(
            decoder_outputs, encoder_outputs, source_mask, training
        )
        if return_attention_scores:
            return logits, weights
        return logits

    def decode_step(self, token_ids, states, encoder_outputs, source_mask):
        """One decoder step for `(N,)` previous tokens.

        Returns `(logits (N, V) float32, new_states, weights (N, T_in),
        decoder_output (N, units))`. Costs `O(T_in)`.
        """
        embedded = self.target_embedding(token_ids)
        output, new_states = self.decoder.cell(embedded, states, training=False)
        if not isinstance(new_states, (list, tuple)):
            new_states = [new_states]
        logits, weights = self._attend(
            output[:, None, :], encoder_outputs, source_mask, training=False
        )
        return (
            tf.cast(logits[:, 0, :], tf.float32),
            list(new_states),
            tf.cast(weights[:, 0, :], tf.float32),
            output,
        )

    # --------------------------------------------------------------- decoding
    def _greedy_search(self, source_ids, max_length):
        """Greedy decoding as one `tf.while_loop`; see `_search_outputs`."""
        encoder_outputs, source_mask, states = self.encode(source_ids, False)
        batch = tf.shape(source_ids)[0]

        def body(step, previous, states, finished, lengths, log_prob, tokens_ta,
                 weights_ta):
            logits, states, weights, _ = self.decode_step(
                previous, states, encoder_outputs, source_mask
            )
            log_probs = tf.nn.log_softmax(logits)
            token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
            token = tf.where(finished, PAD_ID, token)
            token_log_prob = tf.gather(log_probs, token, batch_dims=1)
            log_prob += tf.where(finished, 0.0, token_log_prob)
            lengths += tf.cast(tf.logical_not(finished), tf.int32)
            finished = tf.logical_or(finished, tf.equal(token, END_ID))
            return (step + 1, token, states, finished, lengths, log_prob,
                    tokens_ta.write(step, token), weights_ta.write(step, weights))

        def cond(step, previous, states, finished, *_):
            return tf.logical_and(step < max_length,
                                  tf.logical_not(tf.reduce_all(finished)))

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
            cond, body, loop_vars
        )
        tokens = tf.transpose(tokens_ta.stack(), [1, 0])  # (B, steps)
        weights = tf.transpose(weights_ta.stack(), [1, 0, 2])  # (B, steps, T_in)
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
        encoder_outputs, source_mask, states = self.encode(source_ids, False)
        batch = tf.shape(source_ids)[0]
        vocabulary_size = self.target_text.size
        # Every hypothesis is a row of a (B * K) batch.
        encoder_outputs = tf.repeat(encoder_outputs, beam_width, axis=0)
        source_mask = tf.repeat(source_mask, beam_width, axis=0)
        states = [tf.repeat(s, beam_width, axis=0) for s in states]
        only_padding = tf.where(
            tf.equal(tf.range(vocabulary_size), PAD_ID), 0.0, _NEG_INF
        )
        batch_offsets = tf.range(batch)[:, None] * beam_width  # (B, 1)

        def body(step, previous, states, finished, lengths, log_prob, tokens_ta,
                 parents_ta, weights_ta):
            logits, states, weights, _ = self.decode_step(
                previous, states, encoder_outputs, source_mask
            )
            log_probs = tf.reshape(
                tf.nn.log_softmax(logits), [batch, beam_width, vocabulary_size]
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
                tf.reshape(weights, [batch, beam_width, -1]), parent, batch_dims=1
            )
            return (step + 1, tf.reshape(token, [-1]), states, finished, lengths,
                    log_prob, tokens_ta.write(step, token),
                    parents_ta.write(step, parent), weights_ta.write(step, weights))

        def cond(step, previous, states, finished, *_):
            return tf.logical_and(step < max_length,
                                  tf.logical_not(tf.reduce_all(finished)))

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
        (steps, _, _, _, lengths, log_prob, tokens_ta, parents_ta,
         weights_ta) = tf.while_loop(cond, body, loop_vars)
        return steps, lengths, log_prob, tokens_ta, parents_ta, weights_ta

    def _backtrack(self, steps, chosen, tokens_ta, parents_ta, weights_ta):
        """Follows parent pointers from beam `chosen (B,)` at the last step."""

        def body(step, beam, tokens_out, weights_out):
            token = tf.gather(tokens_ta.read(step), beam, batch_dims=1)
            weights = tf.gather(weights_ta.read(step), beam, batch_dims=1)
            beam = tf.gather(parents_ta.read(step), beam, batch_dims=1)
            return (step - 1, beam, tokens_out.write(step, token),
                    weights_out.write(step, weights))

        _, _, tokens_out, weights_out = tf.while_loop(
            lambda step, *_: step >= 0,
            body,
            (steps - 1, chosen,
             tf.TensorArray(tf.int32, size=steps),
             tf.TensorArray(tf.float32, size=steps)),
        )
        return (tf.transpose(tokens_out.stack(), [1, 0]),
                tf.transpose(weights_out.stack(), [1, 0, 2]))

    def _search_outputs(self, texts, beam_width, max_length, length_penalty,
                        method="auto"):
        """Graph body shared by `translate` and the exported signature.

        Returns a dict of padded tensors: `translation (B,)` strings,
        `target_tokens (B, max_length)` strings, `token_ids`, `alignment
        (B, max_length, max_source_length)`, `source_tokens (B,
        max_source_length)` strings, `source_length (B,)`, `output_length
        (B,)` (tokens without `<end>`), `score (B,)`.
        """
        source_ids, source_tokens = self.source_text.encode(texts)
        source_length = tf.cast(source_tokens.row_lengths(), tf.int32)
        if method == "greedy" or (method == "auto" and beam_width == 1):
            token_ids, weights, log_prob, lengths = self._greedy_search(
                source_ids, max_length
            )
        else:
            steps, lengths, log_prob, tokens_ta, parents_ta, weights_ta = (
                self._beam_search(source_ids, max_length, beam_width)
            )
            normalized = log_prob / tf.pow(
                tf.cast(tf.maximum(lengths, 1), tf.float32), length_penalty
            )
            chosen = tf.argmax(normalized, axis=-1, output_type=tf.int32)
            log_prob = tf.gather(log_prob, chosen, batch_dims=1)
            lengths = tf.gather(lengths, chosen, batch_dims=1)
            token_ids, weights = self._backtrack(
                steps, chosen, tokens_ta, parents_ta, weights_ta
            )
        score = log_prob / tf.pow(
            tf.cast(tf.maximum(lengths, 1), tf.float32), length_penalty
        )
        # Tokens before <end>; an empty source translates to an empty text.
        has_source = source_length > 0
        is_end = tf.equal(token_ids, END_ID)
        before_end = tf.equal(tf.cumsum(tf.cast(is_end, tf.int32), axis=1), 0)
        keep = tf.logical_and(before_end, has_source[:, None])
        output_length = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
        score = tf.where(has_source, score, 0.0)
        token_ids = tf.where(keep, token_ids, PAD_ID)
        weights = tf.where(keep[:, :, None], weights, 0.0)
        # Pad to fixed widths: (B, max_length) and (B, max_length, T_in).
        pad_steps = max_length - tf.shape(token_ids)[1]
        token_ids = tf.pad(token_ids, [[0, 0], [0, pad_steps]])
        weights = tf.pad(weights, [[0, 0], [0, pad_steps], [0, 0]])
        token_ids = tf.ensure_shape(token_ids, [None, max_length])
        weights = tf.ensure_shape(weights, [None, max_length, self.max_source_length])
        output_tokens = tf.RaggedTensor.from_tensor(token_ids, lengths=output_length)
        output_strings = self.target_text.ids_to_tokens(output_tokens)
        return {
            "translation": self.target_text.join(output_strings),
            "target_tokens": output_strings.to_tensor(
                default_value="", shape=[None, max_length]
            ),
            "token_ids": token_ids,
            "alignment": weights,
            "source_tokens": source_tokens.to_tensor(
                default_value="", shape=[None, self.max_source_length]
            ),
            "source_length": source_length,
            "output_length": output_length,
            "score": score,
        }

    def _decode_function(self, beam_width, max_length, method):
        key = (beam_width, max_length, method)
        if key not in self._decode_functions:
            def decode(texts, length_penalty):
                return self._search_outputs(
                    texts, beam_width, max_length, length_penalty, method
                )

            self._decode_functions[key] = tf.function(
                decode,
                input_signature=[
                    tf.TensorSpec([None], tf.string),
                    tf.TensorSpec([], tf.float32),
                ],
            )
        return self._decode_functions[key]

    def _check_decoding_arguments(self, beam_width, max_length, length_penalty):
        if isinstance(beam_width, bool) or not isinstance(
            beam_width, (int, np.integer)
        ) or beam_width < 1:
            raise ValueError(
                "Seq2SeqTranslator.translate: `beam_width` must be a positive "
                f"integer. Received: beam_width={beam_width!r}"
            )
        if max_length is None:
            max_length = self.max_target_length
        if isinstance(max_length, bool) or not isinstance(
            max_length, (int, np.integer)
        ) or max_length < 1:
            raise ValueError(
                "Seq2SeqTranslator.translate: `max_length` must be a positive "
                f"integer or None. Received: max_length={max_length!r}"
            )
        if not isinstance(length_penalty, (int, float)) or not np.isfinite(
            length_penalty
        ):
            raise ValueError(
                "Seq2SeqTranslator.translate: `length_penalty` must be a finite "
                f"number. Received: length_penalty={length_penalty!r}"
            )
        return int(beam_width), int(max_length), float(length_penalty)

    def translate(self, texts, beam_width=1, max_length=None, length_penalty=0.0,
                  _method="auto"):
        """Translates strings; returns one `Translation` per input.

        Args:
            texts: a string or a list of strings. An empty string (no
                tokens) translates to `""` with score 0 and an empty alignment.
            beam_width: 1 for greedy decoding, more for beam search.
            max_length: maximum output tokens (`<end>` included); defaults to
                `max_target_length`. Output stopped by the limit has no `<end>`.
            length_penalty: hypotheses are ranked by
                `log_prob / num_tokens ** length_penalty` (0: plain log-prob).

        Greedy and beam search each run as one compiled TensorFlow loop over
        the whole batch; the alignment rows are the decoder's attention
        weights when it emitted each token.
        """
        beam_width, max_length, length_penalty = self._check_decoding_arguments(
            beam_width, max_length, length_penalty
        )
        texts = text_processing.as_string_array(texts)
        if len(texts) == 0:
            return []
        function = self._decode_function(beam_width, max_length, _method)
        outputs = function(
            tf.constant(texts, tf.string), tf.constant(length_penalty, tf.float32)
        )
        outputs = {k: v.numpy() for k, v in outputs.items()}
        results = []
        for row in range(len(texts)):
            source_length = int(outputs["source_length"][row])
            output_length = int(outputs["output_length"][row])
            results.append(
                Translation(
                    text=outputs["translation"][row].decode("utf-8"),
                    tokens=[
                        t.decode("utf-8")
                        for t in outputs["target_tokens"][row, :output_length]
                    ],
                    source_tokens=[
                        t.decode("utf-8")
                        for t in outputs["source_tokens"][row, :source_length]
                    ],
                    score=float(outputs["score"][row]),
                    alignment=outputs["alignment"][
                        row, :output_length, :source_length
                    ].astype("float32"),
                )
            )
        return results

    # ---------------------------------------------------------------- session
    def decoding_session(self, text, top_k=5):
        """A `DecodingSession` that decodes `text` one token per `step()`."""
        return DecodingSession(self, text, top_k=top_k)

    def _session_start(self, text):
        source_ids, tokens = self.source_text.encode(tf.constant([text]))
        encoder_outputs, source_mask, states = self.encode(source_ids, False)
        source_tokens = [t.decode("utf-8") for t in tokens.to_list()[0]]
        state = {
            "encoder_outputs": encoder_outputs,
            "source_mask": source_mask,
            "states": states,
            "length": len(source_tokens),
        }
        return source_tokens, state

    def _session_step(self, state, previous_token_id):
        logits, states, weights, output = self.decode_step(
            tf.constant([previous_token_id], tf.int32),
            state["states"],
            state["encoder_outputs"],
            state["source_mask"],
        )
        length = state["length"]
        scores = None
        if hasattr(self.attention, "score"):
            scores = self.attention.score(
                output[:, None, :], state["encoder_outputs"]
            )[0, 0, :length].numpy()
        log_probs = tf.nn.log_softmax(logits)[0].numpy()
        return (log_probs, weights[0, :length].numpy(), scores,
                {**state, "states": states})


def _as_str(text):
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)
