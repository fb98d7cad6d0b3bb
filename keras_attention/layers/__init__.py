"""Attention layers. Every public layer is re-exported at the top level.

`__all__` lists exactly the symbols marked with `keras_attention_export`.
"""

from keras_attention.api_export import public_names
from keras_attention.layers.additive_attention import AdditiveAttention
from keras_attention.layers.attention_pooling import AttentionPooling
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.capture import capture_attention
from keras_attention.layers.cbam import CBAM
from keras_attention.layers.linformer_attention import LinformerAttention
from keras_attention.layers.low_rank_attention import LowRankAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.memory_budget import attention_memory_budget
from keras_attention.layers.memory_budget import set_attention_memory_budget
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.performer_attention import PerformerAttention
from keras_attention.layers.performer_attention import RedrawFeatures
from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.layers.score_attention import ScoreAttention
from keras_attention.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attention.layers.sparse_attention import SparseAttention
from keras_attention.layers.squeeze_excitation import SqueezeExcitation
from keras_attention.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attention.layers.transformer_encoder_block import TransformerEncoderBlock

__all__ = public_names("layers")
