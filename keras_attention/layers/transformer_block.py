"""What the Transformer blocks share: attention prototypes, mask checks, the base.

`TransformerEncoderBlock` and `TransformerDecoderBlock` both build on
`TransformerBlockBase`.
"""

import keras
from keras.src.backend import get_keras_mask

from keras_attention import distribution
from keras_attention import validation
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.machinery.utils import clone_initializer
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.layers.multi_head_attention import MultiHeadAttention


def attention_prototype(block_name, argument, attention, num_heads, key_dim):
    """Returns `(class, config)` of the attention layer a block should create.

    `attention` is `None` (our `MultiHeadAttention`), a layer instance used as
    a prototype (only its class and config are used, never its weights), or
    its serialized form (`keras.saving.serialize_keras_object(layer)`, which
    is what the blocks' `get_config` stores).
    """
    if attention is None:
        return None
    if isinstance(attention, dict):
        attention = keras.saving.deserialize_keras_object(attention)
    if not isinstance(attention, BaseMultiHeadAttention):
        raise TypeError(
            f"{block_name}: `{argument}` must be None, a keras_attention "
            "multi-head layer (MultiHeadAttention, SparseAttention, "
            "PerformerAttention, LinformerAttention, ...), or its serialized "
            f"config. Received: {argument}={attention!r}"
        )
    for name, expected in (("num_heads", num_heads), ("key_dim", key_dim)):
        got = getattr(attention, name)
        if got != expected:
            raise ValueError(
                f"{block_name}: the `{argument}` prototype has {name}={got} "
                f"but the block has {name}={expected}. Received: "
                f"{argument}={attention!r}"
            )
    config = attention.get_config()
    for key in ("name", "dtype", "trainable"):
        config.pop(key, None)
    return type(attention), config


def serialize_prototype(prototype):
    if prototype is None:
        return None
    cls, config = prototype
    return keras.saving.serialize_keras_object(cls.from_config(config))


def keras_mask_of(tensor):
    """The Keras mask attached to `tensor` (by `Embedding(mask_zero=True)`...)."""
    return None if tensor is None else get_keras_mask(tensor)


def check_sequence_shape(block, name, shape):
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"{validation.owner_name(block)}: `{name}` must have "
            f"rank 3 (batch, time, features) with known features. Received: "
            f"{name} with shape {tuple(shape)}"
        )


def check_mask(block, name, mask, expected_shape):
    """Raises unless `mask` is a boolean/integer tensor of `expected_shape`."""
    if mask is None:
        return
    prefix = f"{validation.owner_name(block)}: "
    dtype = str(getattr(mask, "dtype", ""))
    if not hasattr(mask, "shape") or not ("bool" in dtype or "int" in dtype):
        raise TypeError(
            f"{prefix}`{name}` must be a boolean tensor, True for positions to "
            f"attend. Received: {name}=" + (f"tensor with dtype {dtype}" if dtype else repr(mask))
        )
    shape = tuple(mask.shape)
    if len(shape) != len(expected_shape) or any(
        got is not None and want is not None and got != want and not (axis == 0 and got == 1)
        for axis, (got, want) in enumerate(zip(shape, expected_shape, strict=True))
    ):
        raise ValueError(
            f"{prefix}`{name}` must have shape {tuple(expected_shape)} "
            f"(None = any, batch may be 1). Received: {name} with shape {shape}"
        )


# What each random sublayer adds to the block's `seed`, so that no two of them
# draw the same dropout mask; fixed, since a saved block's `seed` must give
# the same sublayer seeds when it is loaded.
SEED_OFFSETS = {
    "self_attention": 0,
    "self_attention_dropout": 1,
    "cross_attention": 2,
    "cross_attention_dropout": 3,
    "feedforward_dropout": 100,
}


class TransformerBlockBase(keras.layers.Layer):
    """What the encoder and decoder blocks share: arguments and sublayers."""

    def __init__(
        self,
        num_heads,
        key_dim,
        intermediate_dim,
        dropout=0.0,
        norm_first=False,
        attention=None,
        activation="relu",
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        name = type(self).__name__
        self.num_heads = validate_positive_int(name, "num_heads", num_heads)
        self.key_dim = validate_positive_int(name, "key_dim", key_dim)
        self.intermediate_dim = validate_positive_int(name, "intermediate_dim", intermediate_dim)
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not (0.0 <= dropout < 1.0)
        ):
            raise ValueError(
                f"{name}: `dropout` must be a float in [0, 1). Received: dropout={dropout!r}"
            )
        if not isinstance(norm_first, bool):
            raise TypeError(
                f"{name}: `norm_first` must be True or False. Received: norm_first={norm_first!r}"
            )
        if not isinstance(layer_norm_epsilon, (int, float)) or not (layer_norm_epsilon > 0):
            raise ValueError(
                f"{name}: `layer_norm_epsilon` must be a positive number. "
                f"Received: layer_norm_epsilon={layer_norm_epsilon!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"{name}: `seed` must be an integer or None. Received: seed={seed!r}")
        self.dropout = float(dropout)
        self.norm_first = norm_first
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self._attention_prototype = attention_prototype(
            name, "attention", attention, num_heads, key_dim
        )
        self.supports_masking = True

    # ------------------------------------------------------------- sublayers
    def _seed(self, name):
        return None if self.seed is None else self.seed + SEED_OFFSETS[name]

    def _make_attention(self, prototype, name):
        if prototype is None:
            return MultiHeadAttention(
                num_heads=self.num_heads,
                key_dim=self.key_dim,
                dropout=self.dropout,
                seed=self._seed(name),
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                dtype=self.dtype_policy,
                name=name,
            )
        cls, config = prototype
        return cls.from_config({**config, "name": name, "dtype": self.dtype_policy})

    def _check_attention_output(self, attention, inputs_shape, other_shape):
        output_shape = attention.compute_output_shape(inputs_shape, other_shape)
        if tuple(output_shape[-1:]) != tuple(inputs_shape[-1:]) or len(output_shape) != 3:
            raise ValueError(
                f"{validation.owner_name(self)}: the attention "
                f"output {tuple(output_shape)} cannot be added to the residual "
                f"{tuple(inputs_shape)}; leave the attention's `output_shape` "
                f"unset. Received: {attention.name}={attention!r}"
            )

    def _build_attention_sublayer(self, name, prototype, inputs_shape, other_shape):
        """Builds the attention `name` over `(inputs, other)` and its residual
        branch's `{name}_layer_norm` and `{name}_dropout`, stored under those
        names (the saved weights' paths and the seeds use them)."""
        attention = self._make_attention(prototype, name)
        self._check_attention_output(attention, inputs_shape, other_shape)
        attention.build(inputs_shape, other_shape)
        setattr(self, name, attention)
        layer_norm = self._layer_norm(f"{name}_layer_norm")
        layer_norm.build(inputs_shape)
        setattr(self, f"{name}_layer_norm", layer_norm)
        setattr(self, f"{name}_dropout", self._dropout(f"{name}_dropout"))

    def _dense(self, units, name, activation=None):
        return keras.layers.Dense(
            units,
            activation=activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _layer_norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _dropout(self, name):
        return keras.layers.Dropout(
            self.dropout,
            seed=self._seed(name),
            dtype=self.dtype_policy,
            name=name,
        )

    def _build_feedforward(self, inputs_shape):
        hidden = inputs_shape[-1]
        ff = ("features", "intermediate_dim")
        distribution.check_layout(
            self,
            {
                "feedforward_intermediate_dense/kernel": ((hidden, self.intermediate_dim), ff),
                "feedforward_intermediate_dense/bias": ((self.intermediate_dim,), ff[1:]),
                "feedforward_output_dense/kernel": ((self.intermediate_dim, hidden), ff[::-1]),
            },
        )
        self.feedforward_layer_norm = self._layer_norm("feedforward_layer_norm")
        self.feedforward_layer_norm.build(inputs_shape)
        self.feedforward_intermediate_dense = self._dense(
            self.intermediate_dim,
            "feedforward_intermediate_dense",
            activation=self.activation,
        )
        self.feedforward_intermediate_dense.build(inputs_shape)
        self.feedforward_output_dense = self._dense(hidden, "feedforward_output_dense")
        self.feedforward_output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.feedforward_dropout = self._dropout("feedforward_dropout")

    def _attention_branch(self, layer, *source, return_attention_scores, caches=None, **arguments):
        """The residual branch `x -> (outputs, weights or None)` calling
        `layer(x, *source, **arguments)`. A cached call returns its cache
        last: it goes to the list `caches` when given, else it is dropped (a
        read-only cache comes back unchanged)."""

        def branch(x):
            result = layer(x, *source, return_attention_scores=return_attention_scores, **arguments)
            if "cache" in arguments:
                *result, cache = result
                if caches is not None:
                    caches.append(cache)
                result = result[0] if len(result) == 1 else tuple(result)
            return result if return_attention_scores else (result, None)

        return branch

    def _self_attention_residual(self, inputs, **arguments):
        """The self-attention sublayer on `inputs` in its residual branch,
        `(outputs, weights or None)`; `arguments` (`training` among them) go
        to `_attention_branch`."""
        branch = self._attention_branch(self.self_attention, **arguments)
        return self._residual(
            self.self_attention_layer_norm,
            self.self_attention_dropout,
            branch,
            inputs,
            arguments["training"],
        )

    def _residual(self, layer_norm, dropout, sublayer, inputs, training):
        """`LN(x + f(x))` (post-norm) or `x + f(LN(x))` (pre-norm): the branch
        `sublayer` (`f`) with its own `layer_norm` and `dropout`."""
        normed = layer_norm(inputs) if self.norm_first else inputs
        outputs, extras = sublayer(normed)
        outputs = inputs + dropout(outputs, training=training)
        if not self.norm_first:
            outputs = layer_norm(outputs)
        return outputs, extras

    def _feedforward(self, inputs, training):
        def feedforward(x):
            hidden = self.feedforward_intermediate_dense(x)
            return self.feedforward_output_dense(hidden), None

        outputs, _ = self._residual(
            self.feedforward_layer_norm, self.feedforward_dropout, feedforward, inputs, training
        )
        return outputs

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "attention": serialize_prototype(self._attention_prototype),
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
            }
        )
        return config
