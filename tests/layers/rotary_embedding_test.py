"""RotaryEmbedding on its own (MultiHeadAttention's rotary is tested against
float64 NumPy in combinations_test.py)."""

import keras
import numpy as np
import pytest

from keras_attention.layers import RotaryEmbedding
from tests import attention_reference


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


@pytest.mark.parametrize(
    "spec",
    [
        {"max_wavelength": 100.0},
        {"max_wavelength": 100.0, "rotary_fraction": 0.5},
        {
            "max_wavelength": 100.0,
            "scaling": "yarn",
            "scaling_factor": 4.0,
            "original_max_length": 8,
        },
    ],
    ids=["whole", "partial", "yarn"],
)
def test_interleaved_pairs_match_a_float64_reference(spec):
    """#51: `interleaved=True` turns pairs (2i, 2i + 1), the rest of a
    partial rotation passing through; per-example positions and a start
    index both; and it differs from the half-split layout on these inputs."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 8)).astype("float32")
    rotary = RotaryEmbedding(**spec, interleaved=True)
    positions = rng.integers(0, 30, size=(2, 5))
    reference = {**spec, "interleaved": True}
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(rotary(x, positions=positions)),
        attention_reference.rotate(x.astype("float64"), positions, reference),
        atol=1e-5,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(rotary(x, start_index=7)),
        attention_reference.rotate(x.astype("float64"), np.arange(7, 12), reference),
        atol=1e-5,
    )
    half_split = RotaryEmbedding(**spec)(x, start_index=7)
    assert not np.allclose(keras.ops.convert_to_numpy(half_split), rotary(x, start_index=7))


def test_interleaved_is_in_the_config_and_must_be_a_bool():
    rotary = RotaryEmbedding(max_wavelength=50.0, interleaved=True)
    assert RotaryEmbedding.from_config(rotary.get_config()).interleaved is True
    assert RotaryEmbedding().interleaved is False
    with pytest.raises(TypeError, match=r"^RotaryEmbedding: `interleaved` must be True or False"):
        RotaryEmbedding(interleaved=1)
