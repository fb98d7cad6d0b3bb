"""`Sampling`, the causal stepper's sampler without KerasHub: temperature,
top-k and top-p together, against the distribution they define (float64)."""

import numpy as np
import pytest

from keras_attention.models import Sampling

LOGITS = np.log([0.05, 0.4, 0.1, 0.3, 0.15])


def expected(temperature, top_k, top_p):
    """The renormalised distribution: softmax(logits / t), its top_k most
    likely tokens, then the fewest of those whose mass reaches top_p."""
    weights = np.exp(LOGITS / temperature)
    weights /= weights.sum()
    order = np.argsort(-weights)[: top_k or len(weights)]
    kept = weights[order]
    if top_p is not None:
        cut = np.searchsorted(np.cumsum(kept), top_p * kept.sum()) + 1
        order, kept = order[:cut], kept[:cut]
    result = np.zeros_like(weights)
    result[order] = kept / kept.sum()
    return result


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, None, None), (0.7, 3, None), (1.5, 4, 0.6), (1.0, None, 0.75)],
)
def test_draws_follow_temperature_top_k_and_top_p_together(temperature, top_k, top_p):
    sampler = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
    probabilities = sampler.compute_probabilities(LOGITS[None])
    np.testing.assert_allclose(
        probabilities[0], np.exp(LOGITS / temperature) / np.exp(LOGITS / temperature).sum()
    )
    draws = np.concatenate([sampler.get_next_token(probabilities) for _ in range(4000)])
    frequencies = np.bincount(draws, minlength=len(LOGITS)) / len(draws)
    want = expected(temperature, top_k, top_p)
    assert set(np.flatnonzero(frequencies)) == set(np.flatnonzero(want))
    np.testing.assert_allclose(frequencies, want, atol=0.03)


def test_a_seed_draws_the_same_tokens_again_from_a_saved_state():
    sampler = Sampling(top_p=0.9, seed=3)
    probabilities = sampler.compute_probabilities(LOGITS[None])
    state = sampler.get_state()
    first = [int(sampler.get_next_token(probabilities)[0]) for _ in range(20)]
    sampler.set_state(state)
    assert [int(sampler.get_next_token(probabilities)[0]) for _ in range(20)] == first
