"""What the layers are made of, not layers themselves.

The multi-head family's kernel choice (`kernel_selector`) and memory budget
(`memory_budget`), its call options (`call_options`), decoding cache
(`decoding_cache`), input layout (`attention_layout`), weight selection
(`scores_selection`), head masks (`head_mask`) and score modifier options
(`score_options`); `capture` (behind `keras_attention.capture_attention`) and
the helpers every layer shares (`utils`). The public names among them are
re-exported by `keras_attention.layers` and the top level.
"""
