"""Pure attention functions written with `keras.ops` only."""

from keras_attention.ops.masking import attention_mask_from
from keras_attention.ops.masking import causal_mask
from keras_attention.ops.masking import masked_softmax
from keras_attention.ops.masking import merge_masks
from keras_attention.ops.masking import to_bool_mask
from keras_attention.ops.scores import additive_score
from keras_attention.ops.scores import dot_score
from keras_attention.ops.scores import general_score
from keras_attention.ops.scores import low_rank_score
from keras_attention.ops.scores import weighted_sum
