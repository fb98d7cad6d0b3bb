"""Plain NumPy forward passes of the Transformer blocks, for the block tests.

Written from the paper's equations; they read the block's weights by
sublayer name, so a block that wires its sublayers wrongly disagrees.
"""

import numpy as np

from tests.testing import to_numpy


def layer_norm(x, layer, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = x.var(-1, keepdims=True)
    normed = (x - mean) / np.sqrt(variance + epsilon)
    return normed * to_numpy(layer.gamma) + to_numpy(layer.beta)


def multi_head_attention(layer, query, value, mask=None, query_mask=None, logits_out=None):
    """Returns `(output (B, Tq, d), weights (B, H, Tq, Tv))`.

    `logits_out`, a list, receives the scores before softmax `(B, H, Tq, Tv)`
    (unmasked).

    `mask` is `(B, Tq, Tv)` boolean; fully masked rows get zero weights, and
    rows with `query_mask` False a zero attention result, so the output
    projection's bias (our multi-head layers' contract).
    """

    def project(dense, x):
        return np.einsum("btd,dhk->bthk", x, to_numpy(dense.kernel)) + to_numpy(dense.bias)

    q = project(layer.query_dense, query)
    k = project(layer.key_dense, value)
    v = project(layer.value_dense, value)
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    logits = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(q.shape[-1])
    if logits_out is not None:
        logits_out.append(logits)
    if mask is not None:
        logits = np.where(mask[:, None], logits, -np.inf)
    peak = np.max(logits, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    exp = np.exp(logits - peak)
    total = exp.sum(-1, keepdims=True)
    weights = np.where(total > 0, exp / np.where(total > 0, total, 1.0), 0.0)
    heads = np.einsum("bhqt,bthv->bqhv", weights, v)
    if query_mask is not None:
        heads = heads * query_mask[..., None, None]
    output = np.einsum("bqhv,hvd->bqd", heads, to_numpy(layer.output_dense.kernel))
    output = output + to_numpy(layer.output_dense.bias)
    return output, weights


def feedforward(block, x, activation=lambda h: np.maximum(h, 0.0)):
    inner = block.feedforward_intermediate_dense
    outer = block.feedforward_output_dense
    hidden = activation(x @ to_numpy(inner.kernel) + to_numpy(inner.bias))
    return hidden @ to_numpy(outer.kernel) + to_numpy(outer.bias)


def residual(block, layer_norm_layer, sublayer, x):
    epsilon = block.layer_norm_epsilon
    if block.norm_first:
        out, extra = sublayer(layer_norm(x, layer_norm_layer, epsilon))
        return x + out, extra
    out, extra = sublayer(x)
    return layer_norm(x + out, layer_norm_layer, epsilon), extra


def padding_attention_mask(query_padding, key_padding, length_q, length_k, batch):
    mask = np.ones((batch, length_q, length_k), bool)
    if query_padding is not None:
        mask &= query_padding[:, :, None]
    if key_padding is not None:
        mask &= key_padding[:, None, :]
    return mask


def encoder_block(block, x, padding_mask=None):
    """`(outputs, scores)` of a `TransformerEncoderBlock` in inference mode."""
    x = np.asarray(x, "float64")
    batch, length, _ = x.shape
    mask = padding_attention_mask(padding_mask, padding_mask, length, length, batch)
    x, scores = residual(
        block,
        block.self_attention_layer_norm,
        lambda h: multi_head_attention(block.self_attention, h, h, mask, padding_mask),
        x,
    )
    x, _ = residual(block, block.feedforward_layer_norm, lambda h: (feedforward(block, h), None), x)
    return x, scores


def decoder_block(
    block,
    x,
    encoder_outputs=None,
    decoder_padding_mask=None,
    encoder_padding_mask=None,
    causal=True,
    cross_logits_out=None,
):
    """`(outputs, self_scores, cross_scores)` of a `TransformerDecoderBlock`
    (`cross_logits_out`, a list, receives the cross-attention scores before softmax)."""
    x = np.asarray(x, "float64")
    batch, length, _ = x.shape
    self_mask = padding_attention_mask(
        decoder_padding_mask, decoder_padding_mask, length, length, batch
    )
    if causal:
        self_mask &= np.tril(np.ones((length, length), bool))[None]
    x, self_scores = residual(
        block,
        block.self_attention_layer_norm,
        lambda h: multi_head_attention(block.self_attention, h, h, self_mask, decoder_padding_mask),
        x,
    )
    cross_scores = None
    if encoder_outputs is not None:
        encoder_outputs = np.asarray(encoder_outputs, "float64")
        cross_mask = padding_attention_mask(
            decoder_padding_mask,
            encoder_padding_mask,
            length,
            encoder_outputs.shape[1],
            batch,
        )
        x, cross_scores = residual(
            block,
            block.cross_attention_layer_norm,
            lambda h: multi_head_attention(
                block.cross_attention,
                h,
                encoder_outputs,
                cross_mask,
                decoder_padding_mask,
                logits_out=cross_logits_out,
            ),
            x,
        )
    x, _ = residual(block, block.feedforward_layer_norm, lambda h: (feedforward(block, h), None), x)
    return x, self_scores, cross_scores
