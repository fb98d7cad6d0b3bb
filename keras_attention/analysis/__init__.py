"""Which input tokens a model's output depends on, and which heads matter.

Attention rollout and attention flow (Abnar & Zuidema, 2020,
https://arxiv.org/abs/2005.00928) combine the attention weights of a stack
of self-attention layers into one `(B, L, L)` map from the last layer's
tokens to the input tokens. Each layer's weights are averaged over the
heads (or a chosen set), mixed with the identity for the residual
connection and renormalised, as in the paper:
`A' = (1 - r) * mean_h(A_h) + r * I` (rows divided by their sum), with
`r = residual_weight = 0.5`. Rollout multiplies these matrices; flow treats
them as the capacities of a layered graph and takes, for each output token,
the maximum flow to each input token, normalised to sum to 1.

Head importance (Michel et al., 2019, https://arxiv.org/abs/1905.10650) is
the expected absolute gradient of the loss with respect to each head's
`head_mask` of `MultiHeadAttention`; `mask_least_important_heads` masks the
heads it ranks lowest and reports the loss.

The weights are those `keras_attention.layers.capture_attention` records
(`(B, H, Lq, Lk)` per call, or `(B, Lq, Lk)` for a single-head layer); the
`model_*` functions call a model once and capture them. Everything here is
NumPy on the captured weights except the gradients, which use the backend's
(TensorFlow or JAX). Nothing imports the widgets.

Example:

>>> import numpy as np, keras_attention
>>> uniform = np.full((1, 2, 3, 3), 1 / 3)  # one example, two heads, 3 tokens
>>> rollout = keras_attention.analysis.attention_rollout([uniform, uniform])
>>> np.round(rollout[0], 3)  # 0.25 * I + 0.75 / 3 everywhere
array([[0.5 , 0.25, 0.25],
       [0.25, 0.5 , 0.25],
       [0.25, 0.25, 0.5 ]])

The functions live in `analysis.rollout` (rollout and flow, on weights or a
model) and `analysis.heads` (head masks and importance).
"""

from keras_attention.analysis.heads import HeadMaskingResult as HeadMaskingResult
from keras_attention.analysis.heads import head_importance as head_importance
from keras_attention.analysis.heads import head_layers as head_layers
from keras_attention.analysis.heads import mask_least_important_heads as mask_least_important_heads
from keras_attention.analysis.heads import masking_heads as masking_heads
from keras_attention.analysis.rollout import attention_flow as attention_flow
from keras_attention.analysis.rollout import attention_rollout as attention_rollout
from keras_attention.analysis.rollout import model_attention_flow as model_attention_flow
from keras_attention.analysis.rollout import model_attention_rollout as model_attention_rollout
from keras_attention.api_export import public_names

__all__ = public_names("analysis")
