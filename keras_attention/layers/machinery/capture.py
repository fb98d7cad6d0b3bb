"""Collect the attention weights of every attention layer in a model."""

import keras
import numpy as np

from keras_attention.api_export import keras_attention_export
from keras_attention.layers import base_attention
from keras_attention.layers.machinery import utils


def attention_layers(model_or_layer):
    """Every layer under `model_or_layer` (itself included) that records attention."""
    return [
        layer
        for layer in utils.sublayers(model_or_layer)
        if isinstance(layer, base_attention.BaseAttention)
    ]


@keras_attention_export("layers", serializable=False)
class capture_attention:
    """Context manager that records attention weights during eager calls.

    Every keras_attention layer reports the weights it computed through
    `_record_attention`; inside this context those reports are kept. Call the
    model eagerly (`model(inputs)`, not `model.predict`) while capturing.
    Layers with a memory-efficient kernel fall back to exact attention while
    capturing so that there are weights to record.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> model = keras.Sequential([keras.Input((4, 8)),
    ...                           keras_attention.LuongAttention(name="att")])
    >>> with keras_attention.layers.capture_attention(model) as captured:
    ...     _ = model(np.ones((2, 4, 8), "float32"))
    >>> captured.scores["sequential/att"][0].shape
    (2, 4, 4)
    >>> captured["att"][0].shape  # a unique layer name works too
    (2, 4, 4)

    `scores` maps each layer's `path` (unique even when blocks reuse sublayer
    names such as `self_attention`) to the list of weights of each call.
    """

    def __init__(self, model_or_layer):
        if not isinstance(model_or_layer, keras.layers.Layer):
            raise TypeError(
                "capture_attention: `model_or_layer` must be a Keras model or layer. "
                f"Received: model_or_layer={model_or_layer!r}"
            )
        self.layers = attention_layers(model_or_layer)
        if not self.layers:
            raise ValueError(
                "capture_attention: `model_or_layer` has no keras_attention attention "
                f"layers. Received: {type(model_or_layer).__name__} "
                f"'{getattr(model_or_layer, 'name', model_or_layer)}'"
            )
        self.scores = {}

    def __enter__(self):
        for layer in self.layers:
            base_attention.start_recording(layer)
        return self

    def __exit__(self, *exc_info):
        for layer in self.layers:
            weights = base_attention.stop_recording(layer)
            self.scores[layer.path or layer.name] = [
                np.asarray(w, dtype="float32") for w in weights
            ]
        return False

    def __getitem__(self, name_or_path):
        """The weights of the layer with this path, or this unique name."""
        if name_or_path in self.scores:
            return self.scores[name_or_path]
        matches = [path for path in self.scores if path.rsplit("/", 1)[-1] == name_or_path]
        if len(matches) != 1:
            raise KeyError(
                f"capture_attention: {len(matches)} attention layers are named "
                f"{name_or_path!r}; use one of the paths {sorted(self.scores)}"
            )
        return self.scores[matches[0]]
