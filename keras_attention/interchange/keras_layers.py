"""Keras' own attention layers as ours, with their weights.

`multi_head_from_keras` is `MultiHeadAttention.from_keras` (Keras'
`MultiHeadAttention` and `GroupQueryAttention`, any rank and attention axes);
`from_keras_layer` is the single-head layers' `from_keras` (`Attention`,
`AdditiveAttention`).
"""

import keras

# Captured before any code substitutes ours for Keras' class.
_KerasMultiHeadAttention = keras.layers.MultiHeadAttention
_KerasGroupQueryAttention = keras.layers.GroupQueryAttention


def multi_head_from_keras(cls, layer, kwargs):
    """`cls` (our `MultiHeadAttention` or a subclass) from a built Keras
    multi-head layer: its config, `kwargs` overriding, and its weights."""
    grouped = isinstance(layer, _KerasGroupQueryAttention)
    if not (grouped or isinstance(layer, _KerasMultiHeadAttention)):
        raise TypeError(
            "MultiHeadAttention.from_keras expects a "
            "keras.layers.MultiHeadAttention or "
            "keras.layers.GroupQueryAttention. Received: "
            f"{type(layer).__name__}"
        )
    if not layer.built:
        raise ValueError(
            "MultiHeadAttention.from_keras needs a built layer (call it "
            f"once). Received: unbuilt layer '{layer.name}'"
        )
    config = layer.get_config()
    if grouped:
        config["num_heads"] = config.pop("num_query_heads")
        config["key_dim"] = config.pop("head_dim")
        config["value_dim"] = config["key_dim"]
        config.pop("flash_attention", None)
    dense = (layer._query_dense, layer._value_dense, layer._key_dense)
    # The rank each projection was built for: its equation's input operand.
    rank = len(layer._query_dense.equation.split(",")[0])
    if not grouped and config.get("attention_axes") is not None:
        # Keras stores the axes resolved for the projected rank.
        config["attention_axes"] = tuple(
            a if a >= 0 else a + rank for a in config["attention_axes"]
        )
    config.update(kwargs)
    new = cls.from_config(config)
    new.build(*[(None,) * (rank - 1) + (tuple(d.kernel.shape)[0],) for d in dense])
    new.set_weights(layer.get_weights())
    return new


def from_keras_layer(cls, layer, overrides):
    """`cls` with a built Keras attention layer's config and weights (the
    `from_keras` of our single-head layers)."""
    if not layer.built:
        raise ValueError(
            f"{cls.__name__}.from_keras needs a built layer (call it once). "
            f"Received: unbuilt layer '{layer.name}'"
        )
    config = layer.get_config()
    config.update(overrides)
    new = cls.from_config(config)
    shapes = (layer._build_shapes_dict or {}).get("input_shape")
    if not shapes:
        raise ValueError(
            f"{cls.__name__}.from_keras needs the shapes the layer was built "
            f"for. Received: layer '{layer.name}' built without them"
        )
    new.build([tuple(s) for s in shapes])
    new.set_weights(layer.get_weights())
    return new
