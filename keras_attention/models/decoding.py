"""What decoding returns: `Translation`, `DecodingStep` and `DecodingSession`.

This module imports neither TensorFlow text nor any backend code, so widgets
can use the types without pulling in tensorflow-text.

A translator that supports sessions provides:

- `supports_decoding_session` (True),
- `session_start(text) -> (source_tokens, state)`,
- `session_step(state, previous_token_id) -> (log_probs (V,), attention,
  scores or None, next_state)`,
- `target_vocabulary` (list of tokens; ids 0-3 are `<pad> <unk> <start> <end>`)
  and `max_target_length`;
- optionally `session_values(state) -> (T_in, dim)` (or `(layers, heads,
  T_in, head_dim)`, like attention): the vectors the attention weights sum
  (the widgets draw the weighted sum from them).
"""

import dataclasses

import numpy as np

from keras_attention import validation

PAD_ID, START_ID, END_ID = 0, 2, 3


@dataclasses.dataclass
class Translation:
    """One decoded text.

    Attributes:
        text: the output text (tokens joined; no `<end>`).
        tokens: the output tokens, without `<end>`.
        source_tokens: the source tokens the model read (after case folding
            and truncation).
        score: sum of the log-probabilities of the output tokens (and of
            `<end>` when it was produced), divided by
            `num_tokens ** length_penalty`.
        alignment: attention weights, one row per output token:
            `(T_out, T_in)` for `Seq2SeqTranslator`,
            `(layers, heads, T_out, T_in)` for `TransformerTranslator`.
    """

    text: str
    tokens: list
    source_tokens: list
    score: float
    alignment: np.ndarray


@dataclasses.dataclass
class DecodingStep:
    """One step of a `DecodingSession`.

    Attributes:
        index: position of the token in the output (0 for the first).
        token, token_id: the token emitted at this step.
        probability: the model's probability of that token.
        candidates: the `top_k` most likely tokens with their probabilities,
            best first (computed before any forcing).
        attention: attention over the source at this step, `(T_in,)` for
            Seq2Seq and `(layers, heads, T_in)` for the Transformer.
        scores: pre-softmax scores, same shape as `attention`, or None.
        done: whether decoding ended at this step (`<end>` or max length).
    """

    index: int
    token: str
    token_id: int
    probability: float
    candidates: list
    attention: np.ndarray
    scores: object
    done: bool


class DecodingSession:
    """Step-by-step greedy decoding of one text, for people and widgets.

    Use `translator.decoding_session(text, top_k=5)` rather than this class.
    Each `step()` emits the most likely token, or `force_token` when given,
    and the next step continues from the emitted token; that is how one
    explores an alternative translation. Without forcing, the steps reproduce
    `translator.translate([text])` exactly (tokens and alignment rows) for
    every text `translate` accepts: a text with no source tokens (`""`)
    translates to `""`, so its session starts done, with no steps.
    """

    def __init__(self, translator, text, top_k=5):
        owner = f"{type(translator).__name__}.decoding_session"
        top_k = validation.validate_positive_int(owner, "top_k", top_k)
        if not isinstance(text, str):
            raise TypeError(
                f"{owner}: `text` must be a string. Received: "
                f"text={text!r} of type {type(text).__name__}"
            )
        self.translator = translator
        self.text = text
        self.top_k = min(top_k, len(translator.target_vocabulary))
        self.source_tokens, self._initial_state = translator.session_start(text)
        values = getattr(translator, "session_values", None)
        values = None if values is None else values(self._initial_state)
        # The source vectors each step's attention weights sum into its
        # context vector: `(T_in, dim)`, or `(layers, heads, T_in, head_dim)`
        # for a Transformer's cross-attention; None where the translator
        # does not expose them.
        self.values = None if values is None else np.asarray(values, "float32")
        self.reset()

    def reset(self):
        """Forgets every step and starts again from the first token."""
        self.history = []
        self._state = self._initial_state
        self._previous = START_ID
        # Nothing to translate: `translate` returns "" without decoding.
        self.done = not self.source_tokens

    @property
    def output_tokens(self):
        """Tokens emitted so far, without `<end>`."""
        return [s.token for s in self.history if s.token_id != END_ID]

    @property
    def output_text(self):
        """The text `translate()` would give for the tokens so far."""
        join = getattr(self.translator, "join_target_tokens", None)
        if join is not None:
            return join(self.output_tokens)
        return getattr(self.translator, "target_separator", "").join(self.output_tokens)

    def _token_id(self, force_token):
        vocabulary = self.translator.target_vocabulary
        if validation.is_int(force_token):
            force_token = int(validation.as_python_scalar(force_token))
            if not 0 <= force_token < len(vocabulary):
                raise ValueError(
                    "DecodingSession.step: `force_token` id out of range "
                    f"[0, {len(vocabulary)}). Received: force_token={force_token!r}"
                )
            token_id = force_token
        elif isinstance(force_token, str):
            if force_token not in vocabulary:
                raise ValueError(
                    "DecodingSession.step: `force_token` is not in the target "
                    f"vocabulary. Received: force_token={force_token!r}"
                )
            token_id = vocabulary.index(force_token)
        else:
            raise TypeError(
                "DecodingSession.step: `force_token` must be a token string, an "
                f"int id or None. Received: force_token={force_token!r}"
            )
        if token_id in (PAD_ID, START_ID):
            raise ValueError(
                "DecodingSession.step: `force_token` must be a token the "
                f"decoder can emit; {vocabulary[token_id]!r} (id {token_id}) "
                "never is (its probability is 0). Received: "
                f"force_token={force_token!r}"
            )
        return token_id

    def step(self, force_token=None):
        """Emits one token and returns its `DecodingStep`."""
        if self.done and not self.source_tokens:
            raise RuntimeError(
                "DecodingSession.step: the source text has no tokens, so "
                "there is nothing to decode (translate() returns '' for it). "
                f"Received: text={self.text!r}"
            )
        if self.done:
            raise RuntimeError(
                "DecodingSession.step: decoding is done (the last step emitted "
                "<end> or reached max length). Call reset() to start again."
            )
        forced = None if force_token is None else self._token_id(force_token)
        log_probs, attention, scores, next_state = self.translator.session_step(
            self._state, self._previous
        )
        probabilities = np.exp(log_probs.astype("float64"))
        order = np.argsort(-log_probs, kind="stable")[: self.top_k]
        vocabulary = self.translator.target_vocabulary
        token_id = int(order[0]) if forced is None else forced
        index = len(self.history)
        done = token_id == END_ID or index + 1 >= self.translator.max_target_length
        decoding_step = DecodingStep(
            index=index,
            token=vocabulary[token_id],
            token_id=token_id,
            probability=float(probabilities[token_id]),
            candidates=[(vocabulary[i], float(probabilities[i])) for i in order],
            attention=np.asarray(attention, dtype="float32"),
            scores=None if scores is None else np.asarray(scores, "float32"),
            done=done,
        )
        self.history.append(decoding_step)
        self._state = next_state
        self._previous = token_id
        self.done = done
        return decoding_step

    def run(self):
        """Steps greedily until done; returns the history."""
        while not self.done:
            self.step()
        return self.history
