"""Exporting a KerasHub causal LM as a SavedModel that TF Serving streams from.

`generate` runs the whole greedy decode loop in one request; `prefill` and
`decode_step` carry the decoding cache as explicit tensors, so a client
streams one token per request (TF Serving has no streaming call).
"""

import os

import keras
import numpy as np
import tensorflow as tf

from keras_attention import _extras
from keras_attention import validation
from keras_attention.export.saved_model import _check_path
from keras_attention.export.saved_model import _checked_text
from keras_attention.export.warmup import write_warmup_requests

# The signatures of every exported causal LM; `tokenize` and `detokenize`
# too when the tokenizer runs in the graph (`serving_default` is `generate`).
STEP_SIGNATURES = ("generate", "prefill", "decode_step")
TEXT_SIGNATURES = ("tokenize", "detokenize")
# The default warmup prompts: two lengths, so the warmup's prefill has a row
# still inside its prompt when decoding starts.
DEFAULT_WARMUP_PROMPTS = ("Hello", "Served token by token")
# Where KerasHub's causal LMs keep what decoding needs (read, not imported:
# keras_attention works without KerasHub).
DECODING_METHODS = ("call_with_cache", "_build_cache", "generate_step")


def export_causal_lm(
    causal_lm,
    path,
    max_length=None,
    stop_token_ids="auto",
    warmup_prompts=None,
    model_name=None,
):
    """Writes a KerasHub causal LM as a SavedModel that TF Serving serves as is.

    The causal LM is KerasHub's (`GemmaCausalLM`, `LlamaCausalLM`, ...), with
    our attention swapped in (`replace_keras_hub_attention(causal_lm)`).
    Decoding is greedy (the most probable token at each step, as KerasHub's
    `GreedySampler`), over a buffer of `max_length` tokens, prompt
    included, and stops when every row has produced one of
    `stop_token_ids`, as `causal_lm.generate(prompts, max_length=...)` with
    `causal_lm.compile(sampler="greedy")`. A KerasHub causal LM without our
    attention exports too, but KerasHub's attention layers write their
    caches with `XlaDynamicUpdateSlice` (`keras.ops.slice_update` on
    TensorFlow), which TF Serving runs only with XLA: `check_servable`
    refuses it. Ours write with `TensorScatterUpdate`.

    When the preprocessor's tokenizer is a SentencePiece model (Gemma's,
    Llama's, Mistral's), it runs in the graph with tensorflow-text's ops
    ("text mode"); otherwise the signatures take token ids. Signatures
    (`saved_model_cli show --dir PATH --all` lists them):

    - `generate` (and `serving_default`): text mode `text: (B,) string` ->
      `text`, `token_ids`, `padding_mask`; token-id mode `token_ids`,
      `padding_mask: (B, P)` -> `token_ids`, `padding_mask`. Outputs are
      `(B, max_length)`, prompt included; `padding_mask` is False after a
      row's stop token, and `text` is the prompt and its continuation with
      the special tokens removed, as `causal_lm.generate` returns it.
    - `tokenize(text)` -> `token_ids`, `padding_mask`, `(B, max_length)`, as
      KerasHub's `generate_preprocess` (start token, right padding), and
      `detokenize(token_ids, padding_mask)` -> `text` (text mode only).
    - `prefill(token_ids: (B, P) int32, padding_mask: (B, P) bool)`, a
      right-padded prompt with `P <= max_length`: fills the cache over the
      buffer, then returns `logits: (B, V)` float32 and `next_token: (B,)`
      int32 for position `index` (int32 scalar, the shortest prompt's
      length) and the cache.
    - `decode_step(token: (B,) int32, index: () int32, cache...)`: writes
      `token` at position `index` and returns `logits` and `next_token`
      for position `index + 1`, `index + 1` and the new cache. `index` must
      be below `max_length`.

    The cache is one tensor per element of what the model's `_build_cache`
    returns (its structure is read from the model, not assumed), named
    `cache` when it is one tensor, else `cache_0`, `cache_1`, ...; for
    KerasHub's Gemma and Llama it is `(B, layers, 2, max_length, Hkv, D)`.
    A streaming client feeds back the cache it received. Where a row's
    prompt is longer than `index`, the client feeds that row's prompt token
    instead of `next_token` (as `generate` does); a client streaming one
    prompt never needs to. `check_servable(path)` runs this client in a
    fresh process and checks that it streams `generate`'s tokens.

    The graph holds only TensorFlow core and tensorflow-text ops (no
    PyFunc, no XLA; `generate` is a `tf.while_loop`), so a standard TF
    Serving build serves it; a Python consumer loading it with
    `tf.saved_model.load` must `import tensorflow_text` first in text mode.
    One warmup request per signature is written to
    `assets.extra/tf_serving_warmup_requests`.

    Args:
        causal_lm: a built KerasHub causal LM whose `_build_cache` takes
            token ids only (not Gemma 3's images).
        path: the SavedModel directory to create (a string or
            `os.PathLike`; not an existing file).
        max_length: the decode buffer's length (prompt included); defaults
            to the preprocessor's `sequence_length`.
        stop_token_ids: `"auto"` (the tokenizer's end tokens, as
            `generate`), None (decode to `max_length`) or token ids.
        warmup_prompts: strings (text mode) or lists of token ids for the
            warmup requests; defaults to two short prompts.
        model_name: the model name in the warmup requests (defaults to the
            directory name; TF Serving ignores it for warmup).

    Returns:
        `path`.
    """
    owner = "export_causal_lm"
    _check_causal_lm(owner, causal_lm)
    path = _check_path(owner, path)
    _check_backend(owner)
    preprocessor = getattr(causal_lm, "preprocessor", None)
    tokenizer = getattr(preprocessor, "tokenizer", None)
    max_length = _check_max_length(owner, max_length, preprocessor)
    vocabulary_size = _vocabulary_size(causal_lm)
    stop_token_ids = _check_stop_token_ids(owner, stop_token_ids, tokenizer, vocabulary_size)
    if model_name is not None and not isinstance(model_name, str):
        raise TypeError(
            validation.error(
                owner, f"`model_name` must be a string or None. Received: model_name={model_name!r}"
            )
        )
    proto = getattr(tokenizer, "proto", None) if preprocessor is not None else None
    text_mode = isinstance(proto, bytes) and hasattr(preprocessor, "generate_preprocess")
    warmup_prompts = _check_warmup_prompts(
        owner, warmup_prompts, text_mode, vocabulary_size, max_length
    )
    pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)

    served = _ServedCausalLM(causal_lm, max_length, stop_token_ids, pad_id)
    text = None
    if text_mode:
        text = _TextProcessing(
            _extras.require_tensorflow_text(owner), proto, preprocessor, max_length, pad_id
        )
    module, signatures = _serving_module(causal_lm, served, text)
    tf.saved_model.save(module, path, signatures=signatures)
    write_warmup_requests(
        path,
        _warmup_requests(signatures, warmup_prompts, text_mode, pad_id),
        model_name=model_name or os.path.basename(os.path.normpath(path)),
    )
    return path


def _serving_module(causal_lm, served, text):
    """The module to save and its signatures by name: `generate` (from text
    when `text`, a `_TextProcessing`, is given, else from token ids),
    `prefill`, `decode_step`, and `serving_default` (`generate`)."""
    module = tf.Module()
    # The serving graph reads the tf.Variables inside the Keras variables:
    # the module tracks those, not the model, whose own traced functions
    # (KerasHub's XLA-compiled `generate_function`) would be saved too.
    module.tf_variables = [v.value for v in causal_lm.variables]
    signatures = {}
    if text is not None:
        module.sentencepiece = text.sentencepiece  # a resource the graph captures
        signatures.update(text.signatures(served))
    else:
        signatures["generate"] = served.generate_from_ids()
    signatures["prefill"] = served.prefill()
    signatures["decode_step"] = served.decode_step()
    signatures["serving_default"] = signatures["generate"]
    for name, function in signatures.items():
        setattr(module, name, function)
    return module, signatures


class _ServedCausalLM:
    """The decoding functions of one causal LM at one `max_length`."""

    def __init__(self, causal_lm, max_length, stop_token_ids, pad_id):
        self.causal_lm = causal_lm
        self.max_length = max_length
        self.stop_token_ids = stop_token_ids
        self.pad_id = pad_id
        self.cache_structure = None  # set when `prefill` is traced

    def padded(self, token_ids, padding_mask):
        """A `(B, P)` right-padded prompt as the `(B, max_length)` buffer."""
        token_ids = _checked_shape(token_ids, "token_ids", "[0-9]+,[0-9]+", "(B, P)")
        padding_mask = _checked_shape(padding_mask, "padding_mask", "[0-9]+,[0-9]+", "(B, P)")
        length = tf.shape(token_ids)[1]
        checks = [
            tf.debugging.assert_equal(
                tf.shape(token_ids),
                tf.shape(padding_mask),
                message="`token_ids` and `padding_mask` must have the same shape",
            ),
            tf.debugging.assert_less_equal(
                length,
                self.max_length,
                message=f"the prompt must have at most {self.max_length} tokens, "
                "the max_length fixed at export",
            ),
        ]
        with tf.control_dependencies(checks):
            pad = [[0, 0], [0, self.max_length - length]]
            token_ids = tf.pad(token_ids, pad, constant_values=self.pad_id)
            padding_mask = tf.pad(padding_mask, pad, constant_values=False)
        token_ids.set_shape([None, self.max_length])
        padding_mask.set_shape([None, self.max_length])
        return token_ids, padding_mask

    def generate(self, token_ids, padding_mask):
        """KerasHub's `generate_step` with its greedy sampler, written as a
        `tf.while_loop` of `step` (its sampler writes the buffer with
        `slice_update`, an XLA op on TensorFlow): the cache over the whole
        buffer, then from the shortest prompt's end, each step feeds the
        previous token, keeps prompt tokens, and the loop stops once every
        row has a new stop token; the output mask ends after it."""
        _, cache = self.causal_lm._build_cache(token_ids)
        index = tf.reduce_min(tf.reduce_sum(tf.cast(padding_mask, tf.int32), axis=-1))
        positions = tf.range(self.max_length)

        def stopped(buffer):
            """`(B, T)`: True at each new stop token."""
            found = tf.zeros_like(buffer, tf.bool)
            for stop in self.stop_token_ids or ():
                found |= tf.equal(buffer, stop)
            return found & ~padding_mask

        def cond(buffer, cache, index):
            if self.stop_token_ids is None:
                return tf.constant(True)
            return ~tf.reduce_all(tf.reduce_any(stopped(buffer), axis=-1))

        def body(buffer, cache, index):
            _, next_token, cache = self.step(buffer[:, index - 1], cache, index - 1)
            next_token = tf.where(padding_mask[:, index], buffer[:, index], next_token)
            buffer = tf.where(tf.equal(positions, index), next_token[:, None], buffer)
            return buffer, cache, index + 1

        token_ids, _, _ = tf.while_loop(
            cond, body, (token_ids, cache, index), maximum_iterations=self.max_length - index
        )
        if self.stop_token_ids is None:
            return {"token_ids": token_ids, "padding_mask": tf.ones_like(token_ids, tf.bool)}
        ends = tf.cast(stopped(token_ids), tf.int32)
        # False after each row's first new stop token.
        after = tf.cumsum(ends, axis=-1) - ends
        return {"token_ids": token_ids, "padding_mask": tf.equal(after, 0)}

    def generate_from_ids(self):
        @tf.function(input_signature=_prompt_specs(), autograph=False)
        def generate(token_ids, padding_mask):
            return self.generate(*self.padded(token_ids, padding_mask))

        return generate.get_concrete_function()

    def step(self, token, cache, index):
        """`token` written at `index`: the logits and greedy choice for
        `index + 1` (KerasHub's greedy sampler: argmax of the float32
        softmax), and the new cache."""
        logits, _, cache = self.causal_lm.call_with_cache(token[:, None], cache, index)
        logits = tf.cast(logits[:, 0], tf.float32)
        next_token = tf.argmax(tf.nn.softmax(logits), axis=-1, output_type=tf.int32)
        return logits, next_token, cache

    def outputs(self, logits, next_token, index, cache):
        return {
            "logits": logits,
            "next_token": next_token,
            "index": index,
            **dict(zip(self.cache_names(), tf.nest.flatten(cache), strict=True)),
        }

    def cache_names(self):
        flat = tf.nest.flatten(self.cache_structure)
        return ["cache"] if len(flat) == 1 else [f"cache_{i}" for i in range(len(flat))]

    def prefill(self):
        @tf.function(input_signature=_prompt_specs(), autograph=False)
        def prefill(token_ids, padding_mask):
            token_ids, padding_mask = self.padded(token_ids, padding_mask)
            # As `generate_step`: the cache over the whole buffer, then the
            # first step, which feeds the shortest prompt's last token again.
            _, cache = self.causal_lm._build_cache(token_ids)
            index = tf.reduce_min(tf.reduce_sum(tf.cast(padding_mask, tf.int32), axis=-1))
            check = tf.debugging.assert_positive(
                index, message="prefill: every prompt needs at least one token"
            )
            with tf.control_dependencies([check]):
                last = tf.identity(index) - 1
            if self.cache_structure is None:
                self.cache_structure = cache
            logits, next_token, cache = self.step(token_ids[:, last], cache, last)
            return self.outputs(logits, next_token, index, cache)

        return prefill.get_concrete_function()

    def decode_step(self):
        specs = [
            tf.TensorSpec(t.shape, t.dtype, name=name)
            for t, name in zip(
                tf.nest.flatten(self.cache_structure), self.cache_names(), strict=True
            )
        ]

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.int32, name="token"),
                tf.TensorSpec([], tf.int32, name="index"),
                *specs,
            ],
            autograph=False,
        )
        def decode_step(token, index, *cache):
            checks = [
                tf.debugging.assert_non_negative(
                    index, message="decode_step: `index` must be at least 0"
                ),
                tf.debugging.assert_less(
                    index,
                    self.max_length,
                    message=f"decode_step: `index` must be below {self.max_length}, "
                    "the max_length fixed at export",
                ),
            ]
            with tf.control_dependencies(checks):
                index = tf.identity(index)
            cache = tf.nest.pack_sequence_as(self.cache_structure, list(cache))
            logits, next_token, cache = self.step(token, cache, index)
            return self.outputs(logits, next_token, index + 1, cache)

        return decode_step.get_concrete_function()


class _TextProcessing:
    """KerasHub's `generate_preprocess` / `generate_postprocess` for a
    SentencePiece tokenizer, written with tensorflow-text's ops."""

    def __init__(self, tf_text, proto, preprocessor, max_length, pad_id):
        tokenizer = preprocessor.tokenizer
        if not preprocessor.built:
            preprocessor.build(None)  # makes its packer
        self.sentencepiece = tf_text.SentencepieceTokenizer(
            model=proto,
            out_type=tf.int32,
            add_bos=bool(getattr(tokenizer, "add_bos", False)),
            add_eos=bool(getattr(tokenizer, "add_eos", False)),
        )
        start = preprocessor.packer.start_value if preprocessor.add_start_token else None
        self.start = [int(i) for i in start or ()]
        self.special_token_ids = sorted(int(i) for i in tokenizer.special_token_ids)
        self.max_length = max_length
        self.pad_id = pad_id

    def tokenize(self, text):
        text = _checked_text(text)
        pieces = self.sentencepiece.tokenize(text)
        # The packer keeps the first tokens that fit after the start tokens.
        pieces = pieces[:, : self.max_length - len(self.start)]
        if self.start:
            start = tf.ones([tf.shape(text)[0], len(self.start)], tf.int32) * self.start
            pieces = tf.concat([tf.RaggedTensor.from_tensor(start), pieces], axis=1)
        shape = [None, self.max_length]
        token_ids = pieces.to_tensor(default_value=self.pad_id, shape=shape)
        padding_mask = tf.ones_like(pieces, tf.bool).to_tensor(default_value=False, shape=shape)
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def detokenize(self, token_ids, padding_mask):
        keep = tf.cast(padding_mask, tf.bool)
        for special in self.special_token_ids:
            keep &= tf.not_equal(token_ids, special)
        return self.sentencepiece.detokenize(tf.ragged.boolean_mask(token_ids, keep))

    def signatures(self, served):
        text_spec = tf.TensorSpec([None], tf.string, name="text")

        @tf.function(input_signature=[text_spec], autograph=False)
        def tokenize(text):
            return self.tokenize(text)

        @tf.function(input_signature=_prompt_specs(), autograph=False)
        def detokenize(token_ids, padding_mask):
            return {"text": self.detokenize(token_ids, padding_mask)}

        @tf.function(input_signature=[text_spec], autograph=False)
        def generate(text):
            prompt = self.tokenize(text)
            outputs = served.generate(prompt["token_ids"], prompt["padding_mask"])
            return {"text": self.detokenize(**outputs), **outputs}

        return {
            "generate": generate.get_concrete_function(),
            "tokenize": tokenize.get_concrete_function(),
            "detokenize": detokenize.get_concrete_function(),
        }


def _prompt_specs():
    return [
        tf.TensorSpec([None, None], tf.int32, name="token_ids"),
        tf.TensorSpec([None, None], tf.bool, name="padding_mask"),
    ]


def _checked_shape(tensor, name, pattern, description):
    """`tensor` once the graph has checked its run-time shape against
    `pattern` (see `_checked_text`: a rank check would be folded away)."""
    shape = tf.strings.reduce_join(tf.strings.as_string(tf.shape(tensor)), separator=",")
    check = tf.debugging.Assert(
        tf.strings.regex_full_match(shape, pattern),
        [
            f"`{name}` must have shape {description}. Received: {name} with shape",
            tf.strings.join(["(", shape, ")"]),
        ],
        name=f"check_{name}_rank",
    )
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def _warmup_requests(signatures, prompts, text_mode, pad_id):
    """One request per signature; `decode_step`'s carries `prefill`'s
    answer for the first prompt (a real cache)."""
    requests = []
    if text_mode:
        text = tf.constant(prompts)
        prompt = signatures["tokenize"](text=text)
        requests += [
            ("serving_default", {"text": prompts}),
            ("generate", {"text": prompts}),
            ("tokenize", {"text": prompts}),
            ("detokenize", {k: v.numpy() for k, v in prompt.items()}),
        ]
        token_ids, padding_mask = prompt["token_ids"].numpy(), prompt["padding_mask"].numpy()
    else:
        width = max(len(p) for p in prompts)
        token_ids = np.full((len(prompts), width), pad_id, "int32")
        padding_mask = np.zeros((len(prompts), width), bool)
        for row, prompt in enumerate(prompts):
            token_ids[row, : len(prompt)] = prompt
            padding_mask[row, : len(prompt)] = True
        feed = {"token_ids": token_ids, "padding_mask": padding_mask}
        requests += [("serving_default", feed), ("generate", feed)]
    feed = {"token_ids": token_ids, "padding_mask": padding_mask}
    requests.append(("prefill", feed))
    first = signatures["prefill"](
        token_ids=tf.constant(token_ids[:1]), padding_mask=tf.constant(padding_mask[:1])
    )
    step = {name: value.numpy() for name, value in first.items() if name.startswith("cache")}
    step.update(token=first["next_token"].numpy(), index=first["index"].numpy())
    requests.append(("decode_step", step))
    return requests


# ------------------------------------------------------------ arguments
def _check_backend(owner):
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            validation.error(
                owner,
                "a SavedModel is written from the TensorFlow backend; set "
                "KERAS_BACKEND=tensorflow. Received: backend="
                f"{keras.backend.backend()!r}",
            )
        )


def _check_causal_lm(owner, causal_lm):
    if not isinstance(causal_lm, keras.Model) or not all(
        callable(getattr(causal_lm, name, None)) for name in DECODING_METHODS
    ):
        raise TypeError(
            validation.error(
                owner,
                "`causal_lm` must be a KerasHub causal LM (a keras.Model with "
                f"{', '.join(f'`{m}`' for m in DECODING_METHODS)}). Received: "
                f"causal_lm of type {type(causal_lm).__name__}",
            )
        )
    import inspect

    parameters = inspect.signature(causal_lm._build_cache).parameters
    if len(parameters) != 1:
        raise ValueError(
            validation.error(
                owner,
                "`causal_lm` must build its cache from token ids alone; "
                f"{type(causal_lm).__name__}._build_cache takes "
                f"({', '.join(parameters)}) (Gemma 3's images are not served yet). "
                f"Received: causal_lm of type {type(causal_lm).__name__}",
            )
        )
    if not causal_lm.built:
        raise ValueError(
            validation.error(
                owner,
                f"`causal_lm` must be built. Received: an unbuilt {type(causal_lm).__name__}",
            )
        )


def _check_max_length(owner, max_length, preprocessor):
    if max_length is None:
        max_length = getattr(preprocessor, "sequence_length", None)
        if max_length is None:
            raise ValueError(
                validation.error(
                    owner,
                    "`max_length` must be given when the causal LM has no "
                    "preprocessor (its `sequence_length` is the default). "
                    "Received: max_length=None",
                )
            )
    if validation.is_int(max_length) and validation.as_python_scalar(max_length) < 2:
        raise ValueError(
            validation.error(
                owner,
                "`max_length` must be at least 2 (a prompt token and a new one). "
                f"Received: max_length={max_length!r}",
            )
        )
    return validation.validate_positive_int(owner, "max_length", max_length)


def _vocabulary_size(causal_lm):
    size = getattr(causal_lm.backbone, "vocabulary_size", None)
    return int(size) if validation.is_int(size) else None


def _check_stop_token_ids(owner, stop_token_ids, tokenizer, vocabulary_size):
    if isinstance(stop_token_ids, str):
        if stop_token_ids != "auto":
            raise ValueError(
                validation.error(
                    owner,
                    '`stop_token_ids` must be "auto", None or token ids. '
                    f"Received: stop_token_ids={stop_token_ids!r}",
                )
            )
        if tokenizer is None:
            raise ValueError(
                validation.error(
                    owner,
                    '`stop_token_ids="auto"` reads the end tokens of the '
                    "preprocessor's tokenizer, and the causal LM has no "
                    "preprocessor: pass None (decode to max_length) or token "
                    'ids. Received: stop_token_ids="auto"',
                )
            )
        ids = [tokenizer.end_token_id]
        if hasattr(tokenizer, "end_token2_id"):  # as `generate` (Llama 3)
            ids.append(tokenizer.end_token2_id)
        return tuple(int(i) for i in ids)
    if stop_token_ids is None:
        return None
    if not isinstance(stop_token_ids, (list, tuple)) or not stop_token_ids:
        raise TypeError(
            validation.error(
                owner,
                '`stop_token_ids` must be "auto", None or a non-empty list of '
                f"token ids. Received: stop_token_ids={stop_token_ids!r}",
            )
        )
    high = vocabulary_size if vocabulary_size is not None else 2**31 - 1
    for value in stop_token_ids:
        if not validation.is_int(value) or not 0 <= validation.as_python_scalar(value) < high:
            raise ValueError(
                validation.error(
                    owner,
                    f"`stop_token_ids` must be token ids in [0, {high}). "
                    f"Received: stop_token_ids={stop_token_ids!r}",
                )
            )
    return tuple(int(validation.as_python_scalar(v)) for v in stop_token_ids)


def _check_warmup_prompts(owner, prompts, text_mode, vocabulary_size, max_length):
    if prompts is None:
        if text_mode:
            return list(DEFAULT_WARMUP_PROMPTS)
        return [[1, 2, 3], [1]]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(
            validation.error(
                owner,
                "`warmup_prompts` must be a non-empty list of "
                f"{'strings' if text_mode else 'lists of token ids'}. "
                f"Received: warmup_prompts={prompts!r}",
            )
        )
    if text_mode:
        if not all(isinstance(p, str) for p in prompts):
            raise TypeError(
                validation.error(
                    owner,
                    "`warmup_prompts` must be strings (the tokenizer runs in "
                    f"the graph). Received: warmup_prompts={prompts!r}",
                )
            )
        return list(prompts)
    high = vocabulary_size if vocabulary_size is not None else 2**31 - 1
    for prompt in prompts:
        if (
            not isinstance(prompt, (list, tuple))
            or not 0 < len(prompt) <= max_length
            or not all(validation.is_int(i) and 0 <= i < high for i in prompt)
        ):
            raise ValueError(
                validation.error(
                    owner,
                    "`warmup_prompts` must be lists of 1 to max_length "
                    f"({max_length}) token ids in [0, {high}) (the model takes "
                    f"token ids). Received: warmup_prompts={prompts!r}",
                )
            )
    return [[int(i) for i in p] for p in prompts]
