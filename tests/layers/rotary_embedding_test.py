"""RotaryEmbedding on its own (MultiHeadAttention's rotary is tested against
float64 NumPy in combinations_test.py)."""

import numpy as np
import pytest

from keras_attention.layers import RotaryEmbedding


def test_an_odd_rotated_count_is_refused_before_rotating():
    """#49: the features turn in pairs; 3 of 8 was rounded down to 2."""
    rotary = RotaryEmbedding(rotary_fraction=0.375)
    with pytest.raises(ValueError, match=r"^RotaryEmbedding: .*= 3 is odd.*rotary_fraction=0.375"):
        rotary(np.ones((1, 2, 8), "float32"))
