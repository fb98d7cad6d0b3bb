"""Tiny KerasHub causal LMs with a SentencePiece vocabulary trained here.

Presets cannot be downloaded, so the tests that need a tokenizer (serving a
causal LM, stepping through its decoding) train one on a few sentences and
give a small Gemma random weights (scale 0.5, so the tokens vary).
"""

import io

import numpy as np

SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the bird sang a song",
    "one two three four five",
    "keras serves tokens one at a time",
    "attention is all you need",
]


def gemma_causal_lm(seed, max_length, *, sliding_window=None, sampler="greedy"):
    """A 2-block `GemmaCausalLM` (hidden 16, 2 query heads, 1 key-value head)
    with its own SentencePiece tokenizer and random weights from `seed`;
    `sliding_window` makes its even blocks local (Gemma 2's layout)."""
    import keras_hub
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 4),
        model_writer=model,
        vocab_size=64,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        bos_piece="<bos>",
        eos_piece="<eos>",
        unk_piece="<unk>",
        minloglevel=2,
    )
    tokenizer = keras_hub.models.GemmaTokenizer(proto=model.getvalue())
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=max_length)
    window = {}
    if sliding_window is not None:
        window = dict(use_sliding_window_attention=True, sliding_window_size=sliding_window)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
        **window,
    )
    causal_lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=preprocessor)
    rng = np.random.default_rng(seed)
    for variable in causal_lm.weights:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype("float32"))
    causal_lm.compile(sampler=sampler)
    return causal_lm
