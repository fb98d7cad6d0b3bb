"""RotaryEmbedding on its own (MultiHeadAttention's rotary is tested against
float64 NumPy in combinations_test.py)."""

import numpy as np
import pytest

from keras_attention.layers import RotaryEmbedding


def hugging_face_dynamic_ntk(base, dim, factor, length, trained):
    """Inverse frequencies of Hugging Face's dynamic NTK, written from
    `transformers.modeling_rope_utils._compute_dynamic_ntk_parameters`: the
    base grows with the length `length` past the trained one."""
    length = max(length, trained)
    base = base * (factor * length / trained - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_dynamic_scaling_is_hugging_faces_dynamic_ntk_at_the_documented_length(factor):
    """#49: the docstring placed the equality at `factor` times the trained
    length; it holds at `(2f - 1) / f` times it (where HF's base factor is
    `f`), and the docstring says so."""
    base, dim, trained = 10000.0, 16, 64
    ours = RotaryEmbedding(base, scaling="dynamic", scaling_factor=factor).inverse_frequencies(dim)
    documented = (2 * factor - 1) / factor * trained
    np.testing.assert_allclose(
        ours, hugging_face_dynamic_ntk(base, dim, factor, documented, trained), rtol=1e-5
    )
    assert not np.allclose(
        ours, hugging_face_dynamic_ntk(base, dim, factor, factor * trained, trained), rtol=1e-3
    )
    assert "`L = (2f - 1) / f`" in RotaryEmbedding.__doc__


def test_an_odd_rotated_count_is_refused_before_rotating():
    """#49: the features turn in pairs; 3 of 8 was rounded down to 2."""
    rotary = RotaryEmbedding(rotary_fraction=0.375)
    with pytest.raises(ValueError, match=r"^RotaryEmbedding: .*= 3 is odd.*rotary_fraction=0.375"):
        rotary(np.ones((1, 2, 8), "float32"))
