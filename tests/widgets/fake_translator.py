"""Test double: a translator that follows the API.md decoding-session protocol.

Not a model. Every step's scores, attention and candidates are a pure function
of the source text and the tokens decoded so far (seeded from them), so
replaying the same tokens gives the same steps and forcing a token changes
what follows, which is all the widgets rely on.
"""

import dataclasses
import zlib

import numpy as np

VOCAB = ["<end>", "he", "hit", "me", "with", "a", "pie", "<img src=x onerror=alert(1)>"]


@dataclasses.dataclass
class FakeStep:
    index: int
    token: str
    token_id: int
    probability: float
    candidates: list
    attention: np.ndarray
    scores: np.ndarray
    done: bool


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class FakeSession:
    def __init__(self, text, top_k, max_length, heads, with_scores=True):
        self.source_tokens = text.split()
        self.top_k = top_k
        self.max_length = max_length
        self.heads = heads  # None: Seq2Seq-style (T_in,), else (layers, heads)
        self.with_scores = with_scores
        # Seq2Seq-style sessions expose the source vectors attention sums.
        rng = np.random.default_rng(zlib.crc32(text.encode()))
        self.values = rng.normal(size=(len(self.source_tokens), 3)) if heads is None else None
        self.reset()

    def reset(self):
        self.history = []
        self.done = False

    @property
    def output_tokens(self):
        return [step.token for step in self.history]

    def _rng(self):
        key = " ".join(self.source_tokens) + "|" + ",".join(str(s.token_id) for s in self.history)
        return np.random.default_rng(zlib.crc32(key.encode()))

    def step(self, force_token=None):
        if self.done:
            raise RuntimeError("FakeSession.step: decoding is finished")
        rng = self._rng()
        num_source = len(self.source_tokens)
        shape = (num_source,) if self.heads is None else (*self.heads, num_source)
        scores = rng.normal(size=shape) * 2.0
        attention = _softmax(scores)
        logits = rng.normal(size=len(VOCAB)) * 2.0
        logits[0] += 1.5 * len(self.history) - 4.0  # ends eventually
        probabilities = _softmax(logits)
        order = np.argsort(-probabilities)
        candidates = [(VOCAB[i], float(probabilities[i])) for i in order[: self.top_k]]
        if force_token is None:
            token_id = int(order[0])
        elif isinstance(force_token, str):
            if force_token not in VOCAB:
                raise ValueError(
                    f"FakeSession.step: unknown token. Received: force_token={force_token!r}"
                )
            token_id = VOCAB.index(force_token)
        else:
            token_id = int(force_token)
        done = token_id == 0 or len(self.history) + 1 >= self.max_length
        step = FakeStep(
            index=len(self.history),
            token=VOCAB[token_id],
            token_id=token_id,
            probability=float(probabilities[token_id]),
            candidates=candidates,
            attention=attention,
            scores=scores if self.with_scores else None,
            done=done,
        )
        self.history.append(step)
        self.done = done
        return step


class FakeTranslator:
    """Seq2Seq-like (`heads=None`) or Transformer-like (`heads=(layers, heads)`)."""

    supports_decoding_session = True

    def __init__(self, max_length=12, heads=None, with_scores=True):
        self.max_length = max_length
        self.heads = heads
        self.with_scores = with_scores

    def decoding_session(self, text, top_k=5):
        return FakeSession(text, top_k, self.max_length, self.heads, self.with_scores)
