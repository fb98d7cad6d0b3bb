"""Step-by-step decoding of a causal language model: `CausalDecodingSession`.

The translators' `DecodingSession` has a causal twin here. It decodes a prompt
one token at a time from a KerasHub causal LM with our attention swapped in
(`replace_keras_hub_attention`), exactly as its `generate` does (the same
prefill, the same cached steps, the same sampler), or from any Keras model of
our layers that maps token ids `(B, T)` to logits `(B, T, V)`. Each step
returns the new token's attention row of every attention layer and head over
the context, the top candidates and, for a KerasHub model, which position
each slot of every layer's cache holds (`CacheView`): a full cache, or a
sliding window's ring with its sink slots pinned.

Only the new token's row is ever computed for the picture: a KerasHub step
is one cached query, so a long context never builds `L x L` weights. A plain
Keras model has no cache; it is run again on the context at each step (meant
for the small models a notebook trains).
"""

import contextlib
import dataclasses

import numpy as np

from keras_attention import analysis
from keras_attention import validation
from keras_attention.models.decoding import DecodingStep


@dataclasses.dataclass
class CacheView:
    """What one attention layer's cache holds after a step.

    Attributes:
        positions: `(slots,)` int: the context position each slot holds,
            -1 for a slot not written yet.
        written_slot: the slot this step wrote (the query token's keys).
        sink_tokens: how many leading slots are pinned to the first positions.
        window: the layer's sliding window (None: the cache keeps every
            position, one slot each).
    """

    positions: np.ndarray
    written_slot: int
    sink_tokens: int
    window: object


@dataclasses.dataclass
class CausalDecodingStep(DecodingStep):
    """One step of a `CausalDecodingSession`.

    Besides `DecodingStep`'s fields (`attention` is `(layers, heads,
    context)`, the query token's row over positions `0 .. context - 1`):

    Attributes:
        context_tokens: the tokens at those positions, the query token last.
        caches: one `CacheView` per attention layer (KerasHub models), or
            None (a model without a cache).
        rollout: `(context,)`: attention rollout over every layer (Abnar &
            Zuidema; `analysis.attention_rollout`) of the query token's row,
            or None when the session does not compute it.
        sampled: whether the token was drawn by a sampler rather than taken
            as the most likely one or forced.
        forced: whether the token was given (`force_token`) and differs
            from the one the model would have picked.
    """

    context_tokens: list = dataclasses.field(default_factory=list)
    caches: object = None
    rollout: object = None
    sampled: bool = False
    forced: bool = False


class Sampling:
    """Seeded sampling for a model without a KerasHub sampler.

    Probabilities are `softmax(logits / temperature)`, cut to the `top_k`
    most likely tokens and then to the smallest set whose mass reaches
    `top_p`, renormalised, and drawn with NumPy's generator seeded by `seed`.

    Args:
        temperature: positive float.
        top_k: keep this many tokens (None: all).
        top_p: keep the most likely tokens up to this mass (None: all).
        seed: int seed (None: a fresh one).
    """

    def __init__(self, temperature=1.0, top_k=None, top_p=None, seed=None):
        owner = "Sampling"
        self.temperature = validation.validate_real(
            owner, "temperature", temperature, low=0.0, include_low=False
        )
        self.top_k = validation.validate_positive_int(owner, "top_k", top_k, allow_none=True)
        self.top_p = (
            None
            if top_p is None
            else validation.validate_real(
                owner, "top_p", top_p, low=0.0, high=1.0, include_low=False
            )
        )
        self.seed = validation.validate_seed(owner, seed)
        self._rng = np.random.default_rng(self.seed)
        self._start = self.get_state()

    def compute_probabilities(self, logits):
        logits = np.asarray(logits, "float64") / self.temperature
        logits = logits - logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits)
        return weights / weights.sum(axis=-1, keepdims=True)

    def get_next_token(self, probabilities):
        tokens = []
        for row in np.asarray(probabilities, "float64").reshape(-1, probabilities.shape[-1]):
            order = np.argsort(-row, kind="stable")[: self.top_k]
            kept = row[order]
            if self.top_p is not None:
                mass = np.cumsum(kept)
                kept = kept[: int(np.searchsorted(mass, self.top_p * mass[-1])) + 1]
            tokens.append(int(order[self._rng.choice(len(kept), p=kept / kept.sum())]))
        return np.asarray(tokens)

    def get_state(self):
        return self._rng.bit_generator.state

    def set_state(self, state):
        self._rng.bit_generator.state = state


def _sampler_state(sampler):
    """What restores `sampler` to where it was (None: nothing to restore)."""
    if isinstance(sampler, Sampling):
        return sampler.get_state()
    generator = getattr(sampler, "seed_generator", None)
    return None if generator is None else np.asarray(generator.state)


def _restore_sampler(sampler, state):
    if state is None:
        return
    if isinstance(sampler, Sampling):
        sampler.set_state(state)
    else:
        sampler.seed_generator.state.assign(state)


def _is_greedy(sampler):
    return sampler is None or type(sampler).__name__ == "GreedySampler"


class _KerasHubModel:
    """A KerasHub causal LM with our attention: tokenizes, prefills and steps
    as its `generate` does (window caches included)."""

    def __init__(self, causal_lm, owner):
        from keras_attention.interchange import keras_hub_models as conversion

        self.model = causal_lm
        if causal_lm.preprocessor is None:
            raise ValueError(
                f"{owner}: the causal LM has no `preprocessor`, so a text prompt "
                "cannot be tokenized. Received: preprocessor=None"
            )
        self.layers = conversion._swapped_layers(causal_lm.backbone)
        if not self.layers:
            raise TypeError(
                f"{owner}: the causal LM must run our attention (call "
                "`keras_attention.layers.replace_keras_hub_attention(causal_lm)` "
                "first): KerasHub's own attention layers do not report weights. "
                f"Received: {type(causal_lm).__name__}"
            )
        self.tokenizer = causal_lm.preprocessor.tokenizer
        self.conversion = conversion
        self.vocabulary_size = int(self.tokenizer.vocabulary_size())
        self.stop_token_ids = {int(self.tokenizer.end_token_id)}
        if hasattr(self.tokenizer, "end_token2_id"):
            self.stop_token_ids.add(int(self.tokenizer.end_token2_id))
        self.attention_layers = [layer.attention for layer in self.layers]

    def token(self, token_id):
        return str(self.tokenizer.id_to_token(int(token_id)))

    def start(self, prompt, max_length):
        inputs = self.model.preprocessor.generate_preprocess([prompt], sequence_length=max_length)
        token_ids = np.asarray(inputs["token_ids"]).astype("int32")
        self.padding_mask = np.asarray(inputs["padding_mask"]).astype(bool)
        length = int(self.padding_mask[0].sum())
        _, self.cache = self.conversion.generation_cache(self.model, token_ids, self.padding_mask)
        return token_ids[0], length

    def step(self, token_ids, index):
        """Logits for position `index` from the token at `index - 1`, and
        each attention layer's weights `(heads, slots)` over its cache."""
        query = np.asarray(token_ids[None, index - 1 : index], "int32")
        extra = {}
        if self.layers[0].family == "CachedGemma3Attention":
            extra["cache_update_mask"] = ~self.padding_mask[:, index - 1 : index]
        with _recording(self.attention_layers) as recorded:
            logits, _, self.cache = self.model.call_with_cache(
                query, self.cache, index - 1, **extra
            )
        weights = [calls[-1][0, :, 0] for calls in recorded]
        return np.asarray(logits, "float64")[0, -1], weights

    def context_weights(self, token_ids, index):
        """Every attention layer's `(1, heads, index, index)` weights over the
        context, from one uncached causal call (for the rollout). The call
        reads all `max_length` positions, so its shape never changes (JAX
        compiles each op once); the causal rule keeps the later positions
        out of the first `index` rows."""
        inputs = {
            "token_ids": np.asarray(token_ids[None], "int32"),
            "padding_mask": np.ones((1, len(token_ids)), bool),
        }
        with _recording(self.attention_layers) as recorded:
            self.model.backbone(inputs)
        return [calls[-1][..., :index, :index] for calls in recorded]

    def cache_views(self, index):
        """`CacheView`s once positions `0 .. index - 1` are written."""
        views = []
        for layer, cache in zip(self.layers, self._per_layer_caches(), strict=True):
            slots = self.conversion.ring_cache.cache_slots(cache)
            window = layer.attention.sliding_window
            sinks = int(layer.attention.sink_tokens or 0) if window is not None else 0
            if window is not None and slots < self.padding_mask.shape[1]:
                positions = np.asarray(
                    self.conversion.ring_cache.ring_positions(slots, index, sinks)
                )
                written = int(
                    np.asarray(
                        self.conversion.ring_cache.ring_slots(np.asarray([index - 1]), slots, sinks)
                    )[0]
                )
            else:
                positions, written, window, sinks = np.arange(slots), index - 1, None, 0
            views.append(
                CacheView(np.where(positions < index, positions, -1), written, sinks, window)
            )
        return views

    def _per_layer_caches(self):
        if isinstance(self.cache, (tuple, list)):
            return list(self.cache)
        return [self.cache[:, i] for i in range(len(self.layers))]

    def cache_contents(self):
        """Each attention layer's cache as NumPy `(2, slots, heads, dim)`
        (keys, values) of the one sequence: what the views describe."""
        contents = []
        for cache in self._per_layer_caches():
            if self.conversion.ring_cache.is_pair(cache):
                contents.append(np.stack([np.asarray(part)[0] for part in cache]))
            else:
                contents.append(np.asarray(cache)[0])
        return contents

    def text(self, token_ids, length):
        mask = np.zeros((1, len(token_ids)), bool)
        mask[0, :length] = True
        text = self.model.preprocessor.generate_postprocess(
            {"token_ids": np.asarray(token_ids)[None], "padding_mask": mask}
        )
        text = np.asarray(text).reshape(-1)[0]
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)


class _KerasModel:
    """A Keras model of our layers from token ids to logits, with a
    vocabulary; run again on the whole context at each step."""

    def __init__(self, model, vocabulary, owner):
        from keras_attention.layers.machinery.capture import attention_layers

        if vocabulary is None:
            raise ValueError(
                f"{owner}: a Keras model that is not a KerasHub causal LM needs "
                "`vocabulary=` (its token strings, id = index). Received: vocabulary=None"
            )
        self.vocabulary = validation.validate_tokens(owner, "vocabulary", vocabulary)
        self.model = model
        self.attention_layers = attention_layers(model)
        if not self.attention_layers:
            raise ValueError(
                f"{owner}: `model` has no keras_attention attention layers, so "
                f"there is no attention to show. Received: {type(model).__name__} '{model.name}'"
            )
        self.vocabulary_size = len(self.vocabulary)
        self.stop_token_ids = set()
        self.owner = owner

    def token(self, token_id):
        return self.vocabulary[int(token_id)]

    def start(self, prompt, max_length):
        tokens = prompt.split() if isinstance(prompt, str) else list(prompt)
        unknown = [t for t in tokens if t not in self.vocabulary]
        if not tokens or unknown:
            raise ValueError(
                f"{self.owner}: `prompt` must be one or more tokens of the vocabulary"
                f"{f'; not in it: {unknown[:5]!r}' if unknown else ''}. Received: prompt={prompt!r}"
            )
        if len(tokens) >= max_length:
            raise ValueError(
                f"{self.owner}: `max_length` must exceed the prompt's {len(tokens)} "
                f"tokens. Received: max_length={max_length}"
            )
        token_ids = np.zeros(max_length, "int32")
        token_ids[: len(tokens)] = [self.vocabulary.index(t) for t in tokens]
        return token_ids, len(tokens)

    def step(self, token_ids, index):
        # Every step calls the model on all `max_length` positions (one shape,
        # so JAX compiles each op once); a causal model's row `index - 1`
        # does not read the later ones.
        with _recording(self.attention_layers) as recorded:
            logits = self.model(np.asarray(token_ids[None], "int32"))
        self._context = [calls[-1][..., :index, :index] for calls in recorded]
        weights = [calls[-1][0, :, index - 1, :index] for calls in recorded]
        return np.asarray(logits, "float64")[0, index - 1], weights

    def context_weights(self, token_ids, index):
        return self._context  # the step's own call saw the whole context

    def cache_views(self, index):
        return None

    def text(self, token_ids, length):
        return " ".join(self.token(i) for i in token_ids[:length])


@contextlib.contextmanager
def _recording(layers):
    """The weights each of `layers` computes inside: one list per layer (in
    order; layers may share a path, so `capture_attention`'s dict is not
    used), one NumPy array per call."""
    from keras_attention.layers import base_attention

    recorded = [[] for _ in layers]
    for layer in layers:
        base_attention.start_recording(layer)
    try:
        yield recorded
    finally:
        for calls, layer in zip(recorded, layers, strict=True):
            calls.extend(np.asarray(w, "float64") for w in base_attention.stop_recording(layer))


def _is_keras_hub_causal_lm(model):
    return callable(getattr(model, "call_with_cache", None)) and hasattr(model, "preprocessor")


# The longest `max_length` for which a session computes rollouts by default.
ROLLOUT_MAX_LENGTH = 256


class CausalDecodingSession:
    """Step-by-step decoding of a causal LM, for people and widgets.

    `step()` emits the next token (greedy, or drawn by `sampler`), or
    `force_token`; with the greedy sampler the steps reproduce
    `causal_lm.generate(prompt, max_length=max_length)` token for token, and
    with a seeded KerasHub sampler its seeded draws (each step calls the same
    sampler methods on the same logits). `reset()` starts again with the
    sampler's state as it was at the start.

    Args:
        model: a KerasHub causal LM after `replace_keras_hub_attention`, or a
            Keras model of our layers mapping token ids to logits.
        prompt: the text (KerasHub), or tokens of `vocabulary` (a list, or a
            string split on spaces).
        max_length: the length of prompt plus output, as `generate`'s.
        top_k: candidates kept per step.
        sampler: None or "greedy", a KerasHub sampler (e.g.
            `keras_hub.samplers.TopKSampler(k=5, seed=1)`), or `Sampling`.
        vocabulary: the token strings of a plain Keras model.
        rollout: compute each step's attention rollout (one uncached call of
            the context per step for a KerasHub model, `L x L` weights per
            layer: meant for short contexts). None: when `max_length` is at
            most `ROLLOUT_MAX_LENGTH`.
    """

    owner = "CausalDecodingSession"

    def __init__(
        self, model, prompt, *, max_length, top_k=5, sampler=None, vocabulary=None, rollout=None
    ):
        owner = self.owner
        self.max_length = validation.validate_positive_int(owner, "max_length", max_length)
        self.rollout = (
            self.max_length <= ROLLOUT_MAX_LENGTH
            if rollout is None
            else validation.validate_bool(owner, "rollout", rollout)
        )
        top_k = validation.validate_positive_int(owner, "top_k", top_k)
        if _is_keras_hub_causal_lm(model):
            if not isinstance(prompt, str):
                raise TypeError(
                    f"{owner}: `prompt` must be a string for a KerasHub causal LM. "
                    f"Received: prompt={prompt!r} of type {type(prompt).__name__}"
                )
            self._model = _KerasHubModel(model, owner)
        elif callable(model) and hasattr(model, "layers"):
            self._model = _KerasModel(model, vocabulary, owner)
        else:
            raise TypeError(
                f"{owner}: `model` must be a KerasHub causal LM or a Keras model "
                f"of keras_attention layers. Received: model={type(model).__name__}"
            )
        self.sampler = _checked_sampler(owner, sampler)
        self.model = model
        self.prompt = prompt
        self.top_k = min(top_k, self._model.vocabulary_size)
        self._initial_sampler_state = _sampler_state(self.sampler)
        self._prompt_ids, self.prompt_length = self._model.start(prompt, self.max_length)
        if self.prompt_length >= self.max_length:
            raise ValueError(
                f"{owner}: the prompt's {self.prompt_length} tokens leave no room "
                f"below `max_length`. Received: max_length={self.max_length}"
            )
        self.source_tokens = [self._model.token(i) for i in self._prompt_ids[: self.prompt_length]]
        self.values = None
        self.reset()

    @property
    def num_attention_layers(self):
        return len(self._model.attention_layers)

    def reset(self):
        """Forgets every step; the sampler's state is the start's again."""
        _restore_sampler(self.sampler, self._initial_sampler_state)
        if getattr(self, "history", None):  # a stepped cache: prefill again
            self._model.start(self.prompt, self.max_length)
        self._token_ids = self._prompt_ids.copy()
        self._length = self.prompt_length
        self.history = []
        self.done = False

    @property
    def token_ids(self):
        """Prompt and output ids so far."""
        return self._token_ids[: self._length].copy()

    @property
    def output_tokens(self):
        return [s.token for s in self.history if s.token_id not in self._model.stop_token_ids]

    @property
    def output_text(self):
        """What `generate` returns for the tokens so far (prompt included)."""
        return self._model.text(self._token_ids, self._length)

    def cache_contents(self):
        """Each attention layer's cache `(2, slots, heads, dim)` now (KerasHub)."""
        return self._model.cache_contents()

    def _token_id(self, force_token):
        owner = f"{self.owner}.step"
        if validation.is_int(force_token):
            token_id = int(validation.as_python_scalar(force_token))
            if 0 <= token_id < self._model.vocabulary_size:
                return token_id
            raise ValueError(
                f"{owner}: `force_token` id out of range [0, {self._model.vocabulary_size}). "
                f"Received: force_token={force_token!r}"
            )
        if isinstance(force_token, str):
            for token_id in range(self._model.vocabulary_size):
                if self._model.token(token_id) == force_token:
                    return token_id
            raise ValueError(
                f"{owner}: `force_token` is not in the vocabulary. Received: "
                f"force_token={force_token!r}"
            )
        raise TypeError(
            f"{owner}: `force_token` must be a token string, an int id or None. "
            f"Received: force_token={force_token!r}"
        )

    def step(self, force_token=None):
        """Emits one token and returns its `CausalDecodingStep`."""
        if self.done:
            raise RuntimeError(
                f"{self.owner}.step: decoding is done (a stop token or max_length). "
                "Call reset() to start again."
            )
        forced = None if force_token is None else self._token_id(force_token)
        index = self._length
        logits, weights = self._model.step(self._token_ids, index)
        caches = self._model.cache_views(index)
        attention = np.stack([_by_position(w, view, index) for w, view in _pairs(weights, caches)])
        rollout = None
        if self.rollout:
            weights_ = self._model.context_weights(self._token_ids, index)
            rollout = analysis.attention_rollout(weights_)[0, -1]
        probabilities, token_id = self._next(logits)
        order = np.argsort(-probabilities, kind="stable")[: self.top_k]
        if forced is not None:
            # A replayed token the model would have picked anyway is not forced.
            forced, token_id = (None if forced == token_id else forced), forced
        self._token_ids[index] = token_id
        self._length = index + 1
        done = token_id in self._model.stop_token_ids or self._length >= self.max_length
        step = CausalDecodingStep(
            index=len(self.history),
            token=self._model.token(token_id),
            token_id=token_id,
            probability=float(probabilities[token_id]),
            candidates=[(self._model.token(i), float(probabilities[i])) for i in order],
            attention=attention.astype("float32"),
            scores=None,
            done=done,
            context_tokens=[self._model.token(i) for i in self._token_ids[:index]],
            caches=caches,
            rollout=rollout,
            sampled=forced is None and not _is_greedy(self.sampler),
            forced=forced is not None,
        )
        self.history.append(step)
        self.done = done
        return step

    def _next(self, logits):
        """Probabilities and the token the sampler picks (greedy: the argmax);
        a seeded sampler draws even when the token is then forced, so its
        state moves as in the run that did not force."""
        if _is_greedy(self.sampler):
            probabilities = np.exp(logits - logits.max())
            probabilities /= probabilities.sum()
            return probabilities, int(np.argmax(logits))
        probabilities = self.sampler.compute_probabilities(np.asarray(logits, "float32")[None])
        token = self.sampler.get_next_token(probabilities)
        return np.asarray(probabilities, "float64")[0], int(np.asarray(token).reshape(-1)[0])

    def run(self):
        """Steps until done; returns the history."""
        while not self.done:
            self.step()
        return self.history


def _pairs(weights, caches):
    return zip(weights, caches if caches is not None else [None] * len(weights), strict=True)


def _by_position(weights, view, index):
    """`(heads, index)`: a layer's weights over cache slots put at the
    context positions the slots hold (a ring's wrapped slots unrolled)."""
    weights = np.asarray(weights, "float64")
    if view is None:
        return weights[:, :index]
    rows = np.zeros((weights.shape[0], index))
    held = view.positions >= 0
    rows[:, view.positions[held]] = weights[:, held]
    return rows


def _checked_sampler(owner, sampler):
    if sampler is None or (isinstance(sampler, str) and sampler == "greedy"):
        return None
    if isinstance(sampler, str):
        try:
            import keras_hub
        except ImportError:
            keras_hub = None
        if keras_hub is not None:
            try:
                found = keras_hub.samplers.get(sampler)
            except Exception:  # noqa: BLE001 (KerasHub's own error names its lookup, not ours)
                found = None
            if callable(getattr(found, "get_next_token", None)):
                return found
        raise ValueError(
            f"{owner}: `sampler` must be 'greedy', a KerasHub sampler's name or "
            f"object, or `Sampling(...)`. Received: sampler={sampler!r}"
        )
    if callable(getattr(sampler, "compute_probabilities", None)) and callable(
        getattr(sampler, "get_next_token", None)
    ):
        return sampler
    raise TypeError(
        f"{owner}: `sampler` must be 'greedy', a KerasHub sampler or `Sampling(...)`. "
        f"Received: sampler={sampler!r} of type {type(sampler).__name__}"
    )
