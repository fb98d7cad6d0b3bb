"""Our layers to and from Keras' and KerasHub's.

`keras_layers`: `keras.layers.MultiHeadAttention`, `GroupQueryAttention` and
Keras' single-head attention layers as ours (the layers' `from_keras`).
`keras_hub_layers`: KerasHub's attention layers as ours (`from_keras_hub`)
and their decoding caches. `keras_hub_models`: whole KerasHub backbones and
causal LMs swapped onto ours (`replace_keras_hub_attention`).
"""
