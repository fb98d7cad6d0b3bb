"""`ScoreModifier`'s own pieces: ALiBi's slopes and its argument checks.
The modifiers on every kernel are the kernel contract's
(tests/ops/kernel_contract_test.py)."""

import numpy as np
import pytest

from keras_attention.ops import score_modifier


def test_alibi_slopes_are_the_papers():
    # Powers of two: 2^(-8 i / n); otherwise the closest power's slopes, then
    # every other slope of twice as many heads (Press et al.'s code).
    np.testing.assert_allclose(score_modifier.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_allclose(
        score_modifier.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    )
    # KerasHub's `alibi_bias_max` (BLOOM's swap reads it): 2^(-max_bias i / n).
    np.testing.assert_allclose(
        score_modifier.alibi_slopes(4, max_bias=16), 2.0 ** (-4.0 * np.arange(1, 5))
    )
    np.testing.assert_allclose(score_modifier.alibi_slopes(3, max_bias=4), [2**-2, 2**-4, 2**-1])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(soft_cap=0.0), ValueError, "soft_cap=0.0"),
        (dict(soft_cap="50"), TypeError, "soft_cap='50'"),
        (dict(soft_cap=True), TypeError, "soft_cap=True"),
        (dict(score_mod="tanh"), TypeError, "score_mod='tanh'"),
    ],
)
def test_bad_modifiers_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=f"^ScoreModifier: .*{message}"):
        score_modifier.ScoreModifier(**kwargs)
