import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export

SCALINGS = (None, "linear", "dynamic", "yarn", "llama3")


@keras_attention_export("layers")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE, Su et al., 2021, arXiv:2104.09864).

    Rotates each pair of features `(x[i], x[i + d/2])` of a head by the angle
    `position * theta_i`, `theta_i = max_wavelength ** (-2i / d)` (the
    GPT-NeoX / Llama layout: the first half of the rotated features pairs
    with the second half), or with `interleaved=True` each pair
    `(x[2i], x[2i + 1])` (the paper's and GPT-J's layout, and the order in
    which KerasHub's Gemma caches its keys), so the dot product of a rotated
    query and a rotated key depends on their positions' difference only. It
    has no weights; the angles are computed in float32 and the result is
    cast to the input's dtype.

    `MultiHeadAttention(rotary=...)` applies it to the projected queries and
    keys at their absolute positions (a decoding cache holds rotated keys),
    before any kernel, so the blockwise and ring kernels see rotated inputs
    and nothing `L x L` is formed.

    Args:
        max_wavelength: the base `theta` of the frequencies (10000 in the
            paper; 500000 in Llama 3, 1000000 in Qwen 2 / Gemma 3's global
            layers).
        scaling: how positions past the trained length are handled:
            - `None`: none;
            - `"linear"`: positions divided by `scaling_factor` (position
              interpolation, Chen et al., 2023);
            - `"dynamic"`: NTK-aware: the base multiplied by
              `f ** (d / (d - 2))`, `f = scaling_factor`: Hugging Face's
              "dynamic NTK" base, `base * (f * L / L_trained - (f - 1)) **
              (d / (d - 2))` at length `L`, taken at `L = (2f - 1) / f`
              times the trained length (where it equals `f`), and fixed
              rather than grown with the length, so that a decoding cache
              stays consistent;
            - `"yarn"`: YaRN (Peng et al., 2023, arXiv:2309.00071): each
              frequency between interpolation and extrapolation by the ramp
              of `beta_fast` / `beta_slow` rotations over
              `original_max_length`, and the logits' temperature
              `0.1 ln(scaling_factor) + 1` applied to both rotations;
            - `"llama3"`: Llama 3.1's: wavelengths longer than
              `original_max_length / low_freq_factor` divided by
              `scaling_factor`, shorter than `original_max_length /
              high_freq_factor` kept, smoothed between.
        scaling_factor: the factor of the scaling (`>= 1` usually).
        rotary_fraction: the fraction of each head's features that is
            rotated (GPT-NeoX's partial rotary, e.g. 0.25); the rest passes
            through. The rotated count, `int(d * rotary_fraction)`, must be
            even and positive.
        original_max_length: the trained context length (`"yarn"`,
            `"llama3"`).
        beta_fast, beta_slow: YaRN's rotation counts bounding the ramp.
        yarn_truncate: round YaRN's ramp bounds to whole dimensions (as the
            reference implementation).
        low_freq_factor, high_freq_factor: Llama 3.1's bounds.
        interleaved: pair features `(2i, 2i + 1)` instead of `(i, i + d/2)`
            (of the `d` rotated ones): the same rotation of the features
            permuted, so a checkpoint trained in one layout runs in the
            other once its query and key projections are permuted alike.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, ..., d)`: the sequence on axis 1, features last
            (projected heads `(B, T, H, d)`, or `(B, T, d)`).
        start_index: the position of the first step (an int or an integer
            scalar tensor, e.g. a decoding cache's index).
        positions: `(T,)` or `(B, T)` integer positions, instead of
            `start_index + arange(T)` (packed sequences whose positions
            restart per document).

    Returns:
        `inputs` rotated, same shape and dtype.

    Example:

    >>> import numpy as np, keras_attention
    >>> rotary = keras_attention.RotaryEmbedding(max_wavelength=10000)
    >>> x = np.ones((1, 4, 2, 8), "float32")
    >>> tuple(rotary(x).shape)
    (1, 4, 2, 8)
    """

    def __init__(
        self,
        max_wavelength=10000,
        scaling=None,
        scaling_factor=1.0,
        rotary_fraction=1.0,
        original_max_length=None,
        beta_fast=32.0,
        beta_slow=1.0,
        yarn_truncate=True,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        interleaved=False,
        **kwargs,
    ):
        owner = "RotaryEmbedding"
        self.max_wavelength = validation.validate_real(
            owner, "max_wavelength", max_wavelength, low=1.0, include_low=False
        )
        self.scaling = validation.validate_choice(owner, "scaling", scaling, SCALINGS)
        self.scaling_factor = validation.validate_real(
            owner, "scaling_factor", scaling_factor, low=0.0, include_low=False
        )
        self.rotary_fraction = validation.validate_real(
            owner, "rotary_fraction", rotary_fraction, low=0.0, high=1.0, include_low=False
        )
        self.original_max_length = validation.validate_positive_int(
            owner, "original_max_length", original_max_length, allow_none=True
        )
        if self.scaling in ("yarn", "llama3") and self.original_max_length is None:
            raise ValueError(
                f"{owner}: scaling={self.scaling!r} needs `original_max_length` "
                "(the trained context length). Received: original_max_length=None"
            )
        self.beta_fast = validation.validate_real(
            owner, "beta_fast", beta_fast, low=0.0, include_low=False
        )
        self.beta_slow = validation.validate_real(
            owner, "beta_slow", beta_slow, low=0.0, include_low=False
        )
        self.yarn_truncate = validation.validate_bool(owner, "yarn_truncate", yarn_truncate)
        self.low_freq_factor = validation.validate_real(
            owner, "low_freq_factor", low_freq_factor, low=0.0, include_low=False
        )
        self.high_freq_factor = validation.validate_real(
            owner, "high_freq_factor", high_freq_factor, low=0.0, include_low=False
        )
        if self.scaling == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"{owner}: `high_freq_factor` must exceed `low_freq_factor`. "
                f"Received: low_freq_factor={low_freq_factor!r}, "
                f"high_freq_factor={high_freq_factor!r}"
            )
        self.interleaved = validation.validate_bool(owner, "interleaved", interleaved)
        super().__init__(**kwargs)
        self.built = True

    # ------------------------------------------------------------ frequencies
    def rotary_dim(self, head_dim):
        """How many of `head_dim` features are rotated, `int(head_dim *
        rotary_fraction)`: even and positive, else ValueError (the features
        turn in pairs; an odd count is refused, not rounded down)."""
        count = int(head_dim * self.rotary_fraction)
        if count <= 1:
            raise ValueError(
                f"RotaryEmbedding: rotary_fraction={self.rotary_fraction!r} of "
                f"{head_dim} features leaves no pair to rotate. Received: "
                f"inputs with {head_dim} features"
            )
        if count % 2:
            raise ValueError(
                "RotaryEmbedding: the rotated features turn in pairs: "
                f"int({head_dim} * rotary_fraction) = {count} is odd. Received: "
                f"rotary_fraction={self.rotary_fraction!r} on inputs with "
                f"{head_dim} features"
            )
        if self.scaling == "dynamic" and count <= 2:
            raise ValueError(
                "RotaryEmbedding: scaling='dynamic' scales the base by "
                "factor ** (d / (d - 2)): it needs more than 2 rotated features. "
                f"Received: inputs with {head_dim} features, {count} rotated"
            )
        return count

    def inverse_frequencies(self, head_dim):
        """`(rotary_dim / 2,)` float32 NumPy array of the angles per
        position, after the scaling."""
        dim = self.rotary_dim(head_dim)
        exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
        base = np.float32(self.max_wavelength)
        factor = np.float32(self.scaling_factor)
        if self.scaling == "dynamic":
            base = base * factor ** np.float32(dim / (dim - 2))
        inverse = np.float32(1.0) / base**exponents
        if self.scaling == "linear":
            inverse = inverse / factor
        elif self.scaling == "yarn":
            inverse = self._yarn(inverse, dim, base, factor)
        elif self.scaling == "llama3":
            inverse = self._llama3(inverse, factor)
        return inverse.astype(np.float32)

    def _yarn(self, inverse, dim, base, factor):
        def correction_dim(rotations):
            return (dim * math.log(self.original_max_length / (rotations * 2 * math.pi))) / (
                2 * math.log(base)
            )

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.yarn_truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0.0), min(high, dim - 1.0)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / max(high - low, 1e-3), 0, 1)
        extrapolate = 1.0 - ramp
        return (inverse / factor) * (1.0 - extrapolate) + inverse * extrapolate

    def _llama3(self, inverse, factor):
        low_wavelength = self.original_max_length / self.low_freq_factor
        high_wavelength = self.original_max_length / self.high_freq_factor
        wavelength = 2 * math.pi / inverse
        scaled = np.where(wavelength > low_wavelength, inverse / factor, inverse)
        smooth = (self.original_max_length / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * inverse / factor + smooth * inverse
        medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
        return np.where(medium, smoothed, scaled)

    @property
    def temperature(self):
        """The factor on both rotations' cosines and sines (YaRN's
        `0.1 ln(s) + 1`; 1 otherwise)."""
        if self.scaling == "yarn":
            return 0.1 * math.log(self.scaling_factor) + 1.0
        return 1.0

    # ------------------------------------------------------------------- call
    def rotate(self, inputs, positions):
        """`inputs` `(B, T, ..., d)` rotated at `positions`, `(T,)`, `(1, T)`
        or `(B, T)` (ints or floats)."""
        head_dim = inputs.shape[-1]
        dim = self.rotary_dim(head_dim)
        inverse = ops.convert_to_tensor(self.inverse_frequencies(head_dim))
        positions = ops.cast(positions, "float32")
        if len(positions.shape) == 1:
            positions = positions[None, :]
        angles = positions[:, :, None] * inverse  # (B, T, d/2)
        if self.interleaved:  # theta_i for features 2i and 2i + 1
            angles = ops.repeat(angles, 2, axis=-1)
        else:  # theta_i for features i and i + d/2
            angles = ops.concatenate([angles, angles], axis=-1)
        for _ in range(len(inputs.shape) - 3):  # over heads
            angles = ops.expand_dims(angles, 2)
        cos, sin = ops.cos(angles), ops.sin(angles)
        if self.temperature != 1.0:
            cos, sin = cos * self.temperature, sin * self.temperature
        x = ops.cast(inputs, "float32")
        rotated, rest = x[..., :dim], x[..., dim:]
        rotated = rotated * cos + self._turned(rotated) * sin
        if dim < head_dim:
            rotated = ops.concatenate([rotated, rest], axis=-1)
        return ops.cast(rotated, inputs.dtype)

    def _turned(self, rotated):
        """Each pair `(a, b)` of `rotated` as `(-b, a)`: a quarter turn."""
        dim = rotated.shape[-1]
        if not self.interleaved:
            first, second = rotated[..., : dim // 2], rotated[..., dim // 2 :]
            return ops.concatenate([-second, first], axis=-1)
        pairs = ops.reshape(rotated, (*ops.shape(rotated)[:-1], dim // 2, 2))  # (..., d/2, 2)
        turned = ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1)
        return ops.reshape(turned, ops.shape(rotated))

    def __call__(self, inputs, *args, **kwargs):
        # The rotated count, before Keras wraps `call`'s errors: the layer
        # has no build step (it is built at construction).
        features = tuple(getattr(inputs, "shape", ()))[-1:]
        if features and isinstance(features[0], int):
            self.rotary_dim(features[0])
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, start_index=0, positions=None):
        self._check_call(inputs, start_index, positions)
        if positions is None:
            length = ops.shape(inputs)[1]
            positions = ops.cast(ops.arange(length), "float32") + ops.cast(start_index, "float32")
        return self.rotate(inputs, positions)

    def _check_call(self, inputs, start_index, positions):
        owner = "RotaryEmbedding"
        shape = tuple(inputs.shape)
        if len(shape) < 3:
            raise ValueError(
                f"{owner}: `inputs` must be (batch, time, ..., features). "
                f"Received: inputs with shape {shape}"
            )
        if shape[-1] is None:
            raise ValueError(
                f"{owner}: the feature axis must be known. Received: inputs with shape {shape}"
            )
        self.rotary_dim(shape[-1])
        if isinstance(start_index, bool) or (
            isinstance(start_index, numbers.Integral) and start_index < 0
        ):
            raise ValueError(
                f"{owner}: `start_index` must be a non-negative integer. "
                f"Received: start_index={start_index!r}"
            )
        if positions is not None:
            given = tuple(getattr(positions, "shape", np.shape(positions)))
            if len(given) not in (1, 2) or (
                given[-1] is not None and shape[1] is not None and given[-1] != shape[1]
            ):
                raise ValueError(
                    f"{owner}: `positions` must be (time,) or (batch, time) with "
                    f"time = {shape[1]}. Received: positions with shape {given}"
                )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "scaling": self.scaling,
                "scaling_factor": self.scaling_factor,
                "rotary_fraction": self.rotary_fraction,
                "original_max_length": self.original_max_length,
                "beta_fast": self.beta_fast,
                "beta_slow": self.beta_slow,
                "yarn_truncate": self.yarn_truncate,
                "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "interleaved": self.interleaved,
            }
        )
        return config
