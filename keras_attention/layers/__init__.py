"""Attention layers. Every public layer is re-exported at the top level."""

from keras_attention.layers.additive_attention import AdditiveAttention
from keras_attention.layers.attention_pooling import AttentionPooling
from keras_attention.layers.base_attention import BaseAttention
from keras_attention.layers.low_rank_attention import LowRankAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.capture import capture_attention
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.linformer_attention import LinformerAttention
from keras_attention.layers.performer_attention import PerformerAttention
from keras_attention.layers.performer_attention import RedrawFeatures
from keras_attention.layers.sparse_attention import SparseAttention
