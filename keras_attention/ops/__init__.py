"""Pure attention functions written with `keras.ops` only."""

from keras_attention.ops.attention_mask import AttentionMask
from keras_attention.ops.block_sparse import block_plan
from keras_attention.ops.block_sparse import block_sparse_attention
from keras_attention.ops.block_sparse import sparse_tile_plan
from keras_attention.ops.dropout import dropout_keep_mask
from keras_attention.ops.favor import causal_linear_attention
from keras_attention.ops.favor import favor_attention
from keras_attention.ops.favor import linear_attention
from keras_attention.ops.favor import random_projection
from keras_attention.ops.favor import relu_features
from keras_attention.ops.favor import softmax_features
from keras_attention.ops.linformer import linformer_attention
from keras_attention.ops.masking import causal_mask
from keras_attention.ops.masking import masked_softmax
from keras_attention.ops.masking import merge_masks
from keras_attention.ops.masking import to_bool_mask
from keras_attention.ops.memory_efficient import memory_efficient_attention
from keras_attention.ops.mods import and_masks
from keras_attention.ops.mods import or_masks
from keras_attention.ops.online_softmax import merge_attention
from keras_attention.ops.ring import ring_attention
from keras_attention.ops.score_functions import additive_score
from keras_attention.ops.score_functions import dot_score
from keras_attention.ops.score_functions import general_score
from keras_attention.ops.score_functions import low_rank_score
from keras_attention.ops.score_functions import weighted_sum
from keras_attention.ops.score_modifier import ScoreModifier
from keras_attention.ops.score_modifier import alibi_slopes
from keras_attention.ops.tiling import TilePlan
from keras_attention.ops.tiling import tile_plan

__all__ = [
    "AttentionMask",
    "causal_mask",
    "masked_softmax",
    "merge_masks",
    "to_bool_mask",
    "and_masks",
    "or_masks",
    "merge_attention",
    "memory_efficient_attention",
    "ring_attention",
    "additive_score",
    "dot_score",
    "general_score",
    "low_rank_score",
    "weighted_sum",
    "block_plan",
    "block_sparse_attention",
    "sparse_tile_plan",
    "dropout_keep_mask",
    "causal_linear_attention",
    "favor_attention",
    "linear_attention",
    "random_projection",
    "relu_features",
    "softmax_features",
    "linformer_attention",
    "ScoreModifier",
    "TilePlan",
    "tile_plan",
    "alibi_slopes",
]
