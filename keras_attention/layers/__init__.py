"""Attention layers. Every public layer is re-exported at the top level.

`__all__` lists exactly the symbols marked with `keras_attention_export`.
"""

from keras_attention.api_export import public_names

# `import X as X`: explicit re-exports (PEP 484 / ruff F401). `__all__` below is
# computed at import time, which a linter cannot read.
from keras_attention.layers.additive_attention import AdditiveAttention as AdditiveAttention
from keras_attention.layers.attention_pooling import AttentionPooling as AttentionPooling
from keras_attention.layers.base_attention import BaseAttention as BaseAttention
from keras_attention.layers.base_multi_head_attention import (
    BaseMultiHeadAttention as BaseMultiHeadAttention,
)
from keras_attention.layers.cbam import CBAM as CBAM
from keras_attention.layers.linformer_attention import LinformerAttention as LinformerAttention
from keras_attention.layers.low_rank_attention import LowRankAttention as LowRankAttention
from keras_attention.layers.luong_attention import LuongAttention as LuongAttention
from keras_attention.layers.machinery.capture import capture_attention as capture_attention
from keras_attention.layers.machinery.memory_budget import (
    attention_memory_budget as attention_memory_budget,
)
from keras_attention.layers.machinery.memory_budget import (
    set_attention_memory_budget as set_attention_memory_budget,
)
from keras_attention.layers.multi_head_attention import MultiHeadAttention as MultiHeadAttention
from keras_attention.layers.performer_attention import PerformerAttention as PerformerAttention
from keras_attention.layers.performer_attention import RedrawFeatures as RedrawFeatures
from keras_attention.layers.position_embedding import PositionEmbedding as PositionEmbedding
from keras_attention.layers.relative_position_bias import (
    RelativePositionBias as RelativePositionBias,
)
from keras_attention.layers.rotary_embedding import RotaryEmbedding as RotaryEmbedding
from keras_attention.layers.score_attention import ScoreAttention as ScoreAttention
from keras_attention.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding as SinusoidalPositionEncoding,
)
from keras_attention.layers.sparse_attention import SparseAttention as SparseAttention
from keras_attention.layers.squeeze_excitation import SqueezeExcitation as SqueezeExcitation
from keras_attention.layers.transformer_decoder_block import (
    TransformerDecoderBlock as TransformerDecoderBlock,
)
from keras_attention.layers.transformer_encoder_block import (
    TransformerEncoderBlock as TransformerEncoderBlock,
)

__all__ = public_names("layers")
