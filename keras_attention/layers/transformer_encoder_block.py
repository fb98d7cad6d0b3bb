import keras

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.machinery import utils
from keras_attention.layers.transformer_block import TransformerBlockBase
from keras_attention.layers.transformer_block import check_mask
from keras_attention.layers.transformer_block import check_sequence_shape
from keras_attention.layers.transformer_block import keras_mask_of


@keras_attention_export("layers")
class TransformerEncoderBlock(TransformerBlockBase):
    """One Transformer encoder layer that can return its attention scores.

    From [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762): multi-head
    self-attention, then a position-wise feed-forward network
    `Dense(intermediate_dim, activation) -> Dense(d)`, each wrapped in a
    residual connection and layer normalization: `LN(x + f(x))` (post-norm,
    the paper's) or, with `norm_first=True`, `x + f(LN(x))` (pre-norm, easier
    to train deep; add a final `LayerNormalization` after the last block).
    The self-attention is any keras_attention multi-head layer, and the block
    returns its scores `(B, H, T, T)` on request, for every head.

    Args:
        num_heads: number of attention heads `H`.
        key_dim: size of each query/key head.
        intermediate_dim: width of the feed-forward hidden layer.
        dropout: dropout rate of the attention weights (for the default
            attention) and of both residual branches.
        norm_first: pre-norm (`True`) or post-norm (`False`, the default).
        attention: the self-attention, `None` for `MultiHeadAttention`, or a
            `MultiHeadAttention`-family instance (e.g. a `SparseAttention`)
            used as a prototype: the block creates its own layer from the
            instance's class and config (its weights are not shared). The
            prototype's `num_heads` and `key_dim` must equal the block's; its
            own `dropout` applies to its weights. A serialized layer dict is
            accepted too.
        activation: activation of the feed-forward hidden layer.
        layer_norm_epsilon: epsilon of the layer normalizations.
        kernel_initializer, bias_initializer: for the dense layers (and the
            default attention's projections).
        seed: seed of the dropout layers.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, d)`.
        padding_mask: `(B, T)` boolean, `True` for real tokens. Defaults to
            the Keras mask of `inputs` (e.g. from `Embedding(mask_zero=True)`).
            Padded keys get no attention; padded positions' attention output
            is zero.
        attention_mask: `(B, T, T)` boolean, `True` where query `i` may
            attend to key `j`; combined with `padding_mask`.
        return_attention_scores: also return the attention weights.
        training: whether dropout is active.
        segment_ids: `(B, T)` integers, documents packed into one sequence
            (a token attends to its own document only); for an attention
            that takes them (`MultiHeadAttention`). Score modifiers and other
            rules come with the `attention` prototype, e.g.
            `attention=MultiHeadAttention(..., logit_soft_cap=50.0)`.

    Returns:
        `(B, T, d)`, and with `return_attention_scores=True` also the
        weights `(B, H, T, T)`. The Keras mask of `inputs` is kept.

    Example:

    >>> import numpy as np, keras, keras_attention
    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 16, mask_zero=True)(tokens)
    >>> x = keras.layers.Add()([x, keras_attention.SinusoidalPositionEncoding()(x)])
    >>> block = keras_attention.TransformerEncoderBlock(
    ...     num_heads=2, key_dim=8, intermediate_dim=32)
    >>> x, scores = block(x, return_attention_scores=True)
    >>> model = keras.Model(tokens, [x, scores])
    >>> outputs, scores = model(np.array([[5, 7, 9, 0]]))
    >>> tuple(outputs.shape), tuple(scores.shape)
    ((1, 4, 16), (1, 2, 4, 4))
    """

    def build(self, inputs_shape):
        check_sequence_shape(self, "inputs", inputs_shape)
        inputs_shape = tuple(inputs_shape)
        self._build_attention_sublayer(
            "self_attention", self._attention_prototype, inputs_shape, inputs_shape
        )
        self._build_feedforward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        *,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        segment_ids=None,
    ):
        self._check_call(inputs, padding_mask, attention_mask)
        # Packed documents (#36): passed only when given, so that an
        # attention prototype without the argument keeps working.
        rules = {} if segment_ids is None else {"segment_ids": segment_ids}
        if padding_mask is None:
            padding_mask = keras_mask_of(inputs)
        inputs = utils.cast_to_compute_dtype(self, inputs)  # after its mask

        outputs, scores = self._self_attention_residual(
            inputs,
            query_mask=padding_mask,
            value_mask=padding_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            **rules,
        )
        outputs = self._feedforward(outputs, training)
        if return_attention_scores:
            return outputs, scores
        return outputs

    def _check_call(self, inputs, padding_mask, attention_mask):
        """Checks a call's inputs and masks; returns `(batch, length)`."""
        check_sequence_shape(self, "inputs", inputs.shape)
        batch, length = inputs.shape[0], inputs.shape[1]
        check_mask(self, "padding_mask", padding_mask, (batch, length))
        check_mask(self, "attention_mask", attention_mask, (batch, length, length))
        return batch, length

    def compute_output_spec(self, *args, **kwargs):
        call = utils.call_arguments(self, args, kwargs)
        inputs, return_attention_scores = call.inputs, call.return_attention_scores
        batch, length = self._check_call(inputs, call.padding_mask, call.attention_mask)
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return outputs
        scores = keras.KerasTensor(
            (batch, self.num_heads, length, length), dtype=self.compute_dtype
        )
        return outputs, scores
