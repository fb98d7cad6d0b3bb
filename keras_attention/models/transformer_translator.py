"""A Transformer encoder-decoder translator (TensorFlow backend)."""

import keras
import numpy as np
import tensorflow as tf

from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.machinery.utils import validate_rate
from keras_attention.layers.machinery.utils import validate_seed
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attention.layers.transformer_block import attention_prototype
from keras_attention.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attention.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attention.models.text_processing import PAD_ID
from keras_attention.models.translator_base import Translator
from keras_attention.models.translator_base import positive_int


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerTranslator(Translator):
    """Transformer encoder and decoder blocks, text in and out.

    Vaswani et al. 2017 (https://arxiv.org/abs/1706.03762): token embeddings
    plus sinusoidal positions, `num_layers` `TransformerEncoderBlock`s over
    the source, `num_layers` `TransformerDecoderBlock`s (causal
    self-attention, cross-attention over the encoder outputs) and an output
    projection. Decoding uses each block's self-attention cache and
    precomputed cross-attention keys/values, so a step costs `O(T_in)` plus
    the cache read, and alignments are the cross-attention weights of every
    layer and head: `Translation.alignment` is `(layers, heads, T_out, T_in)`
    and `DecodingStep.attention` is `(layers, heads, T_in)`.

    Text processing, `translate`, `decoding_session`, `make_dataset` and
    `export_translator` work as for `Seq2SeqTranslator`.

    Args:
        source_vocabulary, target_vocabulary, source_split, target_split,
        lowercase, max_source_length, max_target_length: see `Translator`.
        num_layers: encoder and decoder blocks (each).
        num_heads: attention heads per block.
        hidden_dim: model width; a multiple of `num_heads`.
        intermediate_dim: feed-forward width.
        dropout: dropout in the blocks during training.
        attention: `None` for `MultiHeadAttention`, or a multi-head
            attention layer (or its config) used as the blocks' prototype.
        norm_first: pre-norm blocks (`x + f(LN(x))`).
        seed: seed for dropout.

    Example:

    >>> from keras_attention.models import TransformerTranslator
    >>> translator = TransformerTranslator.from_texts(
    ...     ["le chat noir"], ["the black cat"], source_split="whitespace",
    ...     target_split="whitespace", num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16)
    >>> result = translator.translate("le chat noir", max_length=4)[0]
    >>> result.alignment.shape[:2], result.alignment.shape[-1]
    ((1, 2), 3)
    """

    _nested_layer_types = {
        "attention": (
            BaseMultiHeadAttention,
            "None or a keras_attention multi-head layer (MultiHeadAttention, "
            "SparseAttention, PerformerAttention, LinformerAttention, ...)",
        )
    }

    def __init__(
        self,
        source_vocabulary,
        target_vocabulary,
        source_split="whitespace",
        target_split="whitespace",
        lowercase=True,
        max_source_length=32,
        max_target_length=32,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=128,
        dropout=0.0,
        attention=None,
        norm_first=True,
        seed=None,
        **kwargs,
    ):
        super().__init__(
            source_vocabulary,
            target_vocabulary,
            source_split=source_split,
            target_split=target_split,
            lowercase=lowercase,
            max_source_length=max_source_length,
            max_target_length=max_target_length,
            **kwargs,
        )
        owner = "TransformerTranslator"
        self.num_layers = positive_int("num_layers", num_layers, owner=owner)
        self.num_heads = positive_int("num_heads", num_heads, owner=owner)
        self.hidden_dim = positive_int("hidden_dim", hidden_dim, owner=owner)
        self.intermediate_dim = positive_int("intermediate_dim", intermediate_dim, owner=owner)
        if hidden_dim % num_heads:
            raise ValueError(
                "TransformerTranslator: `hidden_dim` must be a multiple of "
                f"`num_heads`. Received: hidden_dim={hidden_dim}, "
                f"num_heads={num_heads}"
            )
        self.dropout = validate_rate(owner, "dropout", dropout)
        validate_seed(owner, seed)
        # The blocks would reject a bad prototype in their own name.
        attention_prototype(owner, "attention", attention, num_heads, hidden_dim // num_heads)
        self.attention_config = (
            keras.saving.serialize_keras_object(attention)
            if isinstance(attention, keras.layers.Layer)
            else attention
        )
        self.norm_first = bool(norm_first)
        self.seed = seed
        block_args = dict(
            num_heads=num_heads,
            key_dim=hidden_dim // num_heads,
            intermediate_dim=intermediate_dim,
            dropout=dropout,
            norm_first=norm_first,
            attention=self.attention_config,
            seed=seed,
        )
        self.source_embedding = keras.layers.Embedding(
            self.source_text.size,
            hidden_dim,
            mask_zero=True,
            name="source_embedding",
        )
        self.target_embedding = keras.layers.Embedding(
            self.target_text.size, hidden_dim, name="target_embedding"
        )
        self.position_encoding = SinusoidalPositionEncoding(name="position_encoding")
        # Attributes rather than lists, so SavedModel tracking sees each block.
        for i in range(num_layers):
            setattr(
                self,
                f"encoder_block_{i}",
                TransformerEncoderBlock(name=f"encoder_block_{i}", **block_args),
            )
            setattr(
                self,
                f"decoder_block_{i}",
                TransformerDecoderBlock(name=f"decoder_block_{i}", **block_args),
            )
        self.output_projection = keras.layers.Dense(self.target_text.size, name="output_projection")
        self._build_weights()

    @property
    def encoder_blocks(self):
        return [getattr(self, f"encoder_block_{i}") for i in range(self.num_layers)]

    @property
    def decoder_blocks(self):
        return [getattr(self, f"decoder_block_{i}") for i in range(self.num_layers)]

    def get_config(self):
        config = self._text_config()
        config.update(
            {
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention": self.attention_config,
                "norm_first": self.norm_first,
                "seed": self.seed,
            }
        )
        return config

    # ------------------------------------------------------------------ model
    def _embed(self, embedding, token_ids, start_index=0):
        embedded = embedding(token_ids)
        return embedded + self.position_encoding(embedded, start_index=start_index)

    def encode(self, source_ids, training=None):
        """`(B, T_in)` ids -> `(encoder outputs (B, T_in, d), source mask)`."""
        source_mask = tf.not_equal(source_ids, PAD_ID)
        outputs = self._embed(self.source_embedding, source_ids)
        for block in self.encoder_blocks:
            outputs = block(outputs, padding_mask=source_mask, training=training)
        return outputs, source_mask

    def call(self, inputs, training=None, return_attention_scores=False):
        """Teacher forcing: `(source_ids, decoder_inputs)` -> logits `(B, T_out, V)`.

        With `return_attention_scores=True` also the cross-attention weights
        `(B, layers, heads, T_out, T_in)`.
        """
        source_ids, decoder_inputs = inputs
        encoder_outputs, source_mask = self.encode(source_ids, training)
        outputs = self._embed(self.target_embedding, decoder_inputs)
        cross = []
        for block in self.decoder_blocks:
            outputs, _, cross_scores = block(
                outputs,
                encoder_outputs,
                encoder_padding_mask=source_mask,
                return_attention_scores=True,
                training=training,
            )
            cross.append(cross_scores)
        logits = self.output_projection(outputs)
        if return_attention_scores:
            return logits, tf.stack(cross, axis=1)
        return logits

    # ------------------------------------------------------ decoding hooks
    def _start_decoding(self, source_ids, max_length):
        encoder_outputs, source_mask = self.encode(source_ids, False)
        batch = tf.shape(source_ids)[0]
        cross_caches = tuple(
            block.precompute_cross_attention_cache(encoder_outputs) for block in self.decoder_blocks
        )
        self_caches = [
            block.initial_self_attention_cache(batch, max_length) for block in self.decoder_blocks
        ]
        return (source_mask, *cross_caches), self_caches

    def _decode_step(self, token_ids, states, context, step, with_scores=False):
        source_mask, *cross_caches = context
        outputs = self._embed(self.target_embedding, token_ids[:, None], step)
        new_states, weights, scores = [], [], []
        for block, cache, cross_cache in zip(
            self.decoder_blocks, states, cross_caches, strict=True
        ):
            outputs, _, cross_scores, *logits, cache = block(
                outputs,
                self_attention_cache=cache,
                cache_update_index=step,
                cross_attention_cache=cross_cache,
                encoder_padding_mask=source_mask,
                return_attention_scores=True,
                return_cross_attention_logits=with_scores and self._dot_product_cross_attention(),
                training=False,
            )
            new_states.append(cache)
            weights.append(cross_scores[:, :, 0, :])  # (N, H, T_in)
            scores += [tf.cast(x[:, :, 0, :], tf.float32) for x in logits]
        logits = self.output_projection(outputs)[:, 0, :]
        weights = tf.stack(weights, axis=1)  # (N, layers, H, T_in)
        # The cross-attention scores before softmax, like `weights`, when asked.
        scores = tf.stack(scores, axis=1) if scores else None
        return tf.cast(logits, tf.float32), new_states, tf.cast(weights, tf.float32), scores

    def _dot_product_cross_attention(self):
        # Scores before softmax and the cache's value layout are MultiHeadAttention's.
        return all(
            isinstance(block.cross_attention, MultiHeadAttention) for block in self.decoder_blocks
        )

    def session_values(self, state):
        # What each layer's cross-attention weights sum: the value vectors of
        # every head, projected once into the cross-attention cache.
        if not self._dot_product_cross_attention():
            return None
        _, *cross_caches = state["context"]
        values = [
            np.repeat(
                cache[0, 1, : state["length"]].numpy(),
                block.cross_attention.num_heads // cache.shape[3],
                axis=1,
            )
            for block, cache in zip(self.decoder_blocks, cross_caches, strict=True)
        ]  # each (T_in, H, head_dim)
        return np.stack(values).transpose(0, 2, 1, 3)  # (layers, H, T_in, head_dim)

    def _alignment_layout(self, alignment):
        # (T_out, layers, heads, T_in) -> (layers, heads, T_out, T_in)
        return np.transpose(alignment, (1, 2, 0, 3))
