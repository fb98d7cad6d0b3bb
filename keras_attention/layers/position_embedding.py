import numbers

import keras
from keras import ops

from keras_attention import validation
from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.layers.sinusoidal_position_encoding import check_sequence_rank
from keras_attention.layers.sinusoidal_position_encoding import check_start_index


@keras_attention_export("layers")
class PositionEmbedding(keras.layers.Layer):
    """A learned embedding per position, as in BERT and GPT.

    One trainable vector per position `0 .. sequence_length - 1`. Like
    `SinusoidalPositionEncoding`, the layer returns the embedding of the
    positions covered by the input; add it to the token embeddings with
    `keras.layers.Add()`, which keeps the Keras mask (the `+` operator drops
    it).

    Args:
        sequence_length: the longest sequence the layer accepts.
        initializer: initializer of the `(sequence_length, d)` table.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(..., T, d)`; only its shape is used.
        start_index: position of the first step, an integer or an integer
            scalar tensor (the loop index while decoding one token at a time).
            `start_index + T` must not exceed `sequence_length`; a Python
            integer is checked, a tensor cannot be.

    Returns:
        Rows `start_index .. start_index + T - 1` of the table, broadcast to
        the shape of `inputs`.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 16, mask_zero=True)(tokens)
    >>> positions = keras_attention.PositionEmbedding(sequence_length=32)(x)
    >>> x = keras.layers.Add()([x, positions])
    >>> model = keras.Model(tokens, x)
    >>> tuple(model(np.array([[3, 1, 4]])).shape)
    (1, 3, 16)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = validate_positive_int(
            "PositionEmbedding", "sequence_length", sequence_length
        )
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def _check_inputs(self, shape, start_index):
        check_sequence_rank(self, shape)
        check_start_index(self, start_index)
        length = shape[-2]
        offset = start_index if isinstance(start_index, numbers.Integral) else 0
        if length is not None and offset + length > self.sequence_length:
            raise ValueError(
                f"{validation.owner_name(self)}: the input covers "
                f"positions up to {offset + length - 1} but the layer was "
                f"built with sequence_length={self.sequence_length}. Received: "
                f"inputs with shape {tuple(shape)}, start_index={start_index!r}"
            )

    def build(self, inputs_shape):
        check_sequence_rank(self, inputs_shape)
        features = inputs_shape[-1]
        if features is None:
            raise ValueError(
                f"{validation.owner_name(self)}: the feature "
                f"dimension of `inputs` must be known. Received: inputs with "
                f"shape {tuple(inputs_shape)}"
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, features),
            initializer=self.initializer,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        self._check_inputs(tuple(inputs.shape), start_index)
        shape = ops.shape(inputs)
        length, features = shape[-2], shape[-1]
        rows = ops.slice(
            ops.convert_to_tensor(self.embeddings),
            (start_index, 0),
            (length, features),
        )  # (T, d)
        return ops.broadcast_to(ops.cast(rows, self.compute_dtype), shape)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, start_index=0):
        self._check_inputs(tuple(inputs.shape), start_index)
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
