"""A recurrent encoder-decoder translator with attention (TensorFlow backend)."""

import keras
import tensorflow as tf

from keras_attention import validation
from keras_attention.layers.additive_attention import AdditiveAttention
from keras_attention.layers.low_rank_attention import LowRankAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.models.text_processing import PAD_ID
from keras_attention.models.translator_base import Translator
from keras_attention.models.translator_base import positive_int

ATTENTION_NAMES = ("additive", "luong", "general", "concat", "low_rank")
RNN_NAMES = ("gru", "lstm")
_ATTENTION_DESCRIPTION = (
    f"one of {ATTENTION_NAMES} or a keras_attention single-head attention "
    "layer (e.g. AdditiveAttention())"
)


def make_attention(attention, units, name="attention"):
    """Returns the attention layer named by `attention` (or `attention` itself).

    - `"additive"`: `AdditiveAttention(units)` (Bahdanau).
    - `"luong"`: `LuongAttention(score="dot")`, the seed's plain dot product.
    - `"general"`: `LuongAttention(score="general")`, `s^T W h`.
    - `"concat"`: `LuongAttention(score="concat", units)`.
    - `"low_rank"`: `LowRankAttention(rank=max(1, units // 4))`.
    """
    if isinstance(attention, ScoreAttention):
        return attention
    if isinstance(attention, dict):
        return validation.deserialize_layer(
            "Seq2SeqTranslator", "attention", attention, ScoreAttention, _ATTENTION_DESCRIPTION
        )
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


@keras.saving.register_keras_serializable(package="keras_attention")
class Seq2SeqTranslator(Translator):
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
        source_split, target_split: `"character"`, `"whitespace"` or
            `"wordpiece"` (subwords; see `text_processing`).
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

    _nested_layer_types = {"attention": (ScoreAttention, _ATTENTION_DESCRIPTION)}

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
        super().__init__(
            source_vocabulary,
            target_vocabulary,
            source_split=source_split,
            target_split=target_split,
            lowercase=lowercase,
            max_source_length=max_source_length,
            max_target_length=max_target_length,
            **kwargs,
        )
        units = positive_int("units", units, owner="Seq2SeqTranslator")
        if units % 2:
            raise ValueError(
                "Seq2SeqTranslator: `units` must be even (each encoder "
                f"direction gets units // 2). Received: units={units}"
            )
        if rnn not in RNN_NAMES:
            raise ValueError(
                f"Seq2SeqTranslator: `rnn` must be one of {RNN_NAMES}. Received: rnn={rnn!r}"
            )
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(
                "Seq2SeqTranslator: `dropout` must be a float in [0, 1). "
                f"Received: dropout={dropout!r}"
            )
        self.embedding_dim = positive_int("embedding_dim", embedding_dim, owner="Seq2SeqTranslator")
        self.units = units
        self.rnn = rnn
        self.dropout = float(dropout)
        self.seed = seed
        self.attention_name = attention if isinstance(attention, str) else None

        rnn_class = keras.layers.GRU if rnn == "gru" else keras.layers.LSTM
        self.source_embedding = keras.layers.Embedding(
            self.source_text.size,
            embedding_dim,
            mask_zero=True,
            name="source_embedding",
        )
        self.encoder = keras.layers.Bidirectional(
            rnn_class(units // 2, return_sequences=True, return_state=True),
            name="encoder",
        )
        # Encoder final states -> decoder initial state (and LSTM cell state).
        # Attributes, not a list: TensorFlow's SavedModel tracking must see them.
        self.hidden_bridge = keras.layers.Dense(units, activation="tanh", name="hidden_bridge")
        self.cell_bridge = (
            keras.layers.Dense(units, activation="tanh", name="cell_bridge")
            if rnn == "lstm"
            else None
        )
        self.target_embedding = keras.layers.Embedding(
            self.target_text.size, embedding_dim, name="target_embedding"
        )
        self.decoder = rnn_class(units, return_sequences=True, return_state=True, name="decoder")
        self.attention = make_attention(attention, units)
        self.attention_projection = keras.layers.Dense(
            units, activation="tanh", name="attention_projection"
        )
        self.hidden_dropout = keras.layers.Dropout(self.dropout, seed=seed)
        self.output_projection = keras.layers.Dense(self.target_text.size, name="output_projection")
        # Build every weight now, so translate() and sessions work before fit.
        self._build_weights()

    # ----------------------------------------------------------- config
    def get_config(self):
        config = self._text_config()
        config.update(
            {
                "embedding_dim": self.embedding_dim,
                "units": self.units,
                "rnn": self.rnn,
                "attention": self.attention_name
                or keras.saving.serialize_keras_object(self.attention),
                "dropout": self.dropout,
                "seed": self.seed,
            }
        )
        return config

    # ------------------------------------------------------------------ model
    def encode(self, source_ids, training=None):
        """`(B, T_in)` ids -> encoder states, source mask, decoder states."""
        source_mask = tf.not_equal(source_ids, PAD_ID)
        embedded = self.source_embedding(source_ids)
        outputs = self.encoder(embedded, mask=source_mask, training=training)
        encoder_outputs, final_states = outputs[0], outputs[1:]
        half = len(final_states) // 2
        forward, backward = final_states[:half], final_states[half:]
        # A GRU has one state per direction: zip stops before `cell_bridge` (None).
        decoder_states = [
            bridge(tf.concat([f, b], axis=-1))
            for bridge, f, b in zip(
                (self.hidden_bridge, self.cell_bridge), forward, backward, strict=False
            )
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
        hidden = self.attention_projection(tf.concat([context, decoder_outputs], axis=-1))
        hidden = self.hidden_dropout(hidden, training=training)
        return self.output_projection(hidden), weights

    def call(self, inputs, training=None, return_attention_scores=False):
        """Teacher forcing: `(source_ids, decoder_inputs)` -> logits `(B, T_out, V)`."""
        source_ids, decoder_inputs = inputs
        encoder_outputs, source_mask, states = self.encode(source_ids, training)
        embedded = self.target_embedding(decoder_inputs)
        decoder_outputs = self.decoder(embedded, initial_state=states, training=training)[0]
        logits, weights = self._attend(decoder_outputs, encoder_outputs, source_mask, training)
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

    # ------------------------------------------------------ decoding hooks
    def _start_decoding(self, source_ids, max_length):
        encoder_outputs, source_mask, states = self.encode(source_ids, False)
        return (encoder_outputs, source_mask), states

    def session_values(self, state):
        # The attention's values are the encoder outputs (one per source token).
        encoder_outputs, _ = state["context"]
        return encoder_outputs[0, : state["length"]].numpy()

    def _decode_step(self, token_ids, states, context, step, with_scores=False):
        encoder_outputs, source_mask = context
        logits, states, weights, output = self.decode_step(
            token_ids, states, encoder_outputs, source_mask
        )
        scores = None
        if with_scores and hasattr(self.attention, "score"):
            scores = tf.cast(
                self.attention.score(output[:, None, :], encoder_outputs)[:, 0],
                tf.float32,
            )
        return logits, states, weights, scores
