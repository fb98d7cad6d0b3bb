import keras
import numpy as np

from keras_attention.api_export import keras_attention_export
from keras_attention.layers.base_multi_head_attention import BaseMultiHeadAttention
from keras_attention.layers.machinery import call_options
from keras_attention.layers.machinery import score_options
from keras_attention.layers.machinery import utils
from keras_attention.layers.machinery.score_options import ScoreModifierOptions
from keras_attention.layers.machinery.utils import validate_non_negative_int
from keras_attention.layers.machinery.utils import validate_positive_int
from keras_attention.ops import block_sparse
from keras_attention.ops import dense_attention

# The random plan has at least this many rows (query blocks), so a layer
# built on short sequences still draws distinct random blocks on long ones.
MIN_PLAN_ROWS = 64
_PLAN_HIGH = 2**31 - 1


@keras_attention_export("layers")
class SparseAttention(ScoreModifierOptions, BaseMultiHeadAttention):
    """Block-sparse multi-head attention: BigBird and Longformer patterns.

    Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences"
    (https://arxiv.org/abs/2007.14062); Beltagy et al. 2020, "Longformer"
    (https://arxiv.org/abs/2004.05150).

    The sequence is cut into blocks of `block_size` tokens. Each query block
    attends to a sliding window of `window_blocks` key blocks, to the first
    `global_blocks` blocks, and to `random_blocks` random blocks; queries in
    the first `global_blocks` blocks attend to everything. Longformer's
    `global_tokens` are token positions that attend to, and are attended by,
    every position. `random_blocks=0, global_blocks=0` is pure local
    attention. With `use_causal_mask=True` the window looks only backwards
    and random blocks are drawn from the past.

    Every length works. Where the window and global blocks already cover
    every key (short sequences: with the defaults, up to 4 blocks, 256 keys;
    see `covers_every_key`), the sparse pattern restricts nothing and the
    layer computes exact attention (`ops.dense_attention.dense_attention`)
    under the same masks, which is the same answer; longer sequences run
    the sparse kernel.

    Each query block attends to the key blocks of its pattern (as BigBird
    does): time and memory grow linearly with the length, never forming an
    `L x L` matrix. Any length works: inputs are padded to whole blocks
    internally and the padding is masked. See `keras_attention.ops.block_sparse`
    for the exact pattern. With static lengths the call is one sweep of the
    tiled engine (the blockwise kernel's) over the pattern's tile plan
    (`ops.sparse_tile_plan`) under a recomputing gradient, so forward +
    backward keeps only `O(L * key_dim)` tensors; training with
    `dropout > 0` stays there too (the kernel draws each tile's keep bits
    from a hash of a per-call seed and the positions, again in the
    backward: `ops.dropout_keep_mask` materialises them), and so do an
    explicit `attention_mask` and a `mask_mod`, cut per tile. Returned or
    captured weights, or unknown lengths use autodiff over the gathered keys
    instead, which holds `O(L * S * block_size)` (several times more).

    The projections are those of `MultiHeadAttention` (both are
    `BaseMultiHeadAttention`), so `trainable_weights` move between the two
    with `set_weights`. The random plan is a non-trainable int32 weight
    `(rows, random_blocks)` drawn from `seed` in `build` and saved with the
    model: a loaded model attends exactly as it did in training. Query block
    `i` uses row `i mod rows` (`rows = max(query blocks at build, 64)`).

    Args:
        num_heads, key_dim: as `MultiHeadAttention`.
        block_size: tokens per block.
        window_blocks: blocks in the sliding window (the query's own block
            included; with an even count the extra block is on the left).
        global_blocks: number of leading global blocks (more than a
            sequence has makes every block global).
        random_blocks: random key blocks per query block.
        global_tokens: list of global token positions, or `None`.
        seed: seed of the random plan (and of the dropout); `None` draws a
            fresh plan, which is then saved with the model.
        logit_soft_cap, alibi, attention_sinks, score_mod: (keyword-only)
            `MultiHeadAttention`'s score modifiers, the same arguments
            (validated, saved and given weights the same way): a soft cap
            `c * tanh(logit / c)`, ALiBi (True or one slope per head), a
            learned sink logit per head (weight `sinks`; the weights returned
            are the keys', so a row may sum to less than 1), and a
            `score_mod(score, batch, head, q_idx, k_idx) -> score` (register
            it to save the model) or a layer with weights such as
            `RelativePositionBias`. Every path applies them at absolute
            positions: exact attention below the switch, and inside the
            pattern each gathered key block, global token and global row
            (the blockwise kernel), forward and backward. A mod gets the
            indices of `ops.mods`, except that in a gathered block `k_idx`
            holds that block's keys for each row, `(1, 1, Tq, keys)`:
            written with broadcasting, one function serves both.
        **kwargs: the other `MultiHeadAttention` arguments (`value_dim`,
            `num_key_value_heads`, `dropout`, `use_bias`, `output_shape`,
            `use_gate`, initializers, ..., `name`, `dtype`) of
            `BaseMultiHeadAttention`.

    Call arguments: as `BaseMultiHeadAttention` (no decoding `cache`). An explicit
    `attention_mask` is honoured inside the pattern (it is itself
    `(B, Tq, Tv)`).

    Returns:
        `(B, Tq, dim)`; with `return_attention_scores=True` also the weights
        scattered into a dense `(B, H, Tq, Tv)` array. That array is
        `O(Tq * Tv)` memory: for visualisation, not for long sequences.

    Example:

    >>> import numpy as np, keras_attention
    >>> layer = keras_attention.SparseAttention(
    ...     num_heads=2, key_dim=4, block_size=4, global_blocks=1, seed=0)
    >>> out, scores = layer(np.ones((1, 30, 8), "float32"),
    ...                     return_attention_scores=True)
    >>> tuple(out.shape), tuple(scores.shape)
    ((1, 30, 8), (1, 2, 30, 30))
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        block_size=64,
        window_blocks=3,
        global_blocks=2,
        random_blocks=3,
        global_tokens=None,
        seed=None,
        *,
        logit_soft_cap=None,
        alibi=None,
        attention_sinks=False,
        score_mod=None,
        **kwargs,
    ):
        name = "SparseAttention"
        validate_positive_int(name, "block_size", block_size)
        validate_positive_int(name, "window_blocks", window_blocks)
        validate_non_negative_int(name, "global_blocks", global_blocks)
        validate_non_negative_int(name, "random_blocks", random_blocks)
        if global_tokens is not None:
            if isinstance(global_tokens, (str, bytes)) or not hasattr(global_tokens, "__iter__"):
                raise TypeError(
                    f"{name}: `global_tokens` must be a list of token positions "
                    f"or None. Received: global_tokens={global_tokens!r}"
                )
            global_tokens = list(global_tokens)
            for position in global_tokens:
                validate_non_negative_int(name, "global_tokens", position)
            global_tokens = sorted(set(global_tokens))
        modifiers = score_options.validate_score_options(
            name,
            num_heads,
            logit_soft_cap=logit_soft_cap,
            alibi=alibi,
            attention_sinks=attention_sinks,
            score_mod=score_mod,
        )
        super().__init__(num_heads, key_dim, seed=seed, **kwargs)
        self._set_score_options(modifiers)
        self.block_size = block_size
        self.window_blocks = window_blocks
        self.global_blocks = global_blocks
        self.random_blocks = random_blocks
        self.global_tokens = global_tokens

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        self._check_lengths(value_shape[1])
        super().build(query_shape, value_shape, key_shape)
        self._build_score_options()  # `sinks` after the projections, as MultiHeadAttention
        query_length = query_shape[1]
        rows = MIN_PLAN_ROWS
        if query_length is not None:
            rows = max(rows, -(-query_length // self.block_size))
        plan = np.random.default_rng(self.seed).integers(0, _PLAN_HIGH, (rows, self.random_blocks))
        # Created after the parent's weights and non-trainable, so that
        # `trainable_weights` are exactly MultiHeadAttention's.
        self.random_plan = self.add_weight(
            name="random_plan",
            shape=(rows, self.random_blocks),
            dtype="int32",
            initializer=lambda shape, dtype=None: keras.ops.convert_to_tensor(plan, dtype="int32"),
            trainable=False,
        )

    def covers_every_key(self, query_length, key_length, causal=False):
        """Whether, at these (static) lengths, the window and global blocks
        already let every query see every key it may: then the layer
        computes exact attention (`ops.dense_attention`), the same answer.
        `False` for an unknown length."""
        if query_length is None or key_length is None:
            return False
        return block_sparse.covers_every_key(
            -(-query_length // self.block_size),
            -(-key_length // self.block_size),
            window_blocks=self.window_blocks,
            global_blocks=self.global_blocks,
            causal=causal,
        )

    def _check_lengths(self, key_length):
        if not key_length:  # unknown, or no keys: nothing to attend to
            return
        if self.global_tokens and self.global_tokens[-1] >= key_length:
            raise ValueError(
                self._error(
                    "`global_tokens` must be positions inside the key sequence "
                    f"of length {key_length}. Received: "
                    f"global_tokens={self.global_tokens}"
                )
            )

    def _check_call_options(self, query, value, attention_mask, use_causal_mask):
        self._reject_per_head_mask(attention_mask)
        keys = query if value is None else value
        if hasattr(keys, "shape") and len(keys.shape) == 3:
            self._check_lengths(keys.shape[1])

    def _attend(self, query, key, value, mask, *, dropout, return_weights):
        modifier = self._score_modifier()
        if self.covers_every_key(query.shape[1], key.shape[1], mask.causal):
            # Short sequences: the pattern holds every key, and exact
            # attention under the same masks is the same answer.
            output, weights = dense_attention.dense_attention(
                query, key, value, mask, scale=self._scale, dropout=dropout, modifier=modifier
            )
            return (output, weights) if return_weights else output
        # Dropout runs inside the kernel (keep bits hashed from a seed drawn
        # per call, recomputed in its backward), so training stays on the
        # engine's memory-linear path.
        result = block_sparse.block_sparse_attention(
            query,
            key,
            value,
            block_size=self.block_size,
            window_blocks=self.window_blocks,
            global_blocks=self.global_blocks,
            random_plan=self.random_plan.value if self.random_blocks else None,
            global_tokens=self.global_tokens,
            mask=mask,
            scale=self._scale,
            modifier=modifier,
            return_weights=return_weights,
            dropout_rate=0.0 if dropout is None else self.dropout,
            dropout_seed=None if dropout is None else self._dropout_seed(),
        )
        if return_weights:
            output, weights = result
            return output, keras.ops.cast(weights, query.dtype)
        return result

    @utils.follows_contract
    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        *,
        mask=None,
        segment_ids=None,
        key_segment_ids=None,
    ):
        """Keras' `MultiHeadAttention.call`, plus packed documents.

        Args:
            segment_ids: (keyword-only) `(B, Tq)` integers: documents packed
                into one sequence; a query sees only the keys of its own
                document (inside the block pattern). On the memory-linear
                path the ids are compared per gathered block, without a
                `(Tq, Tv)` mask.
            key_segment_ids: (keyword-only) `(B, Tv)`; defaults to
                `segment_ids` when the keys are the queries (one input, or the
                same tensor as query and value), needed otherwise.

        A prefix length (`MultiHeadAttention`'s `prefix_length`) is not
        offered: the causal block pattern never holds the key blocks a
        prefix would open ahead of a query.
        """
        return self._call(*call_options.from_arguments(self, locals()))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "block_size": self.block_size,
                "window_blocks": self.window_blocks,
                "global_blocks": self.global_blocks,
                "random_blocks": self.random_blocks,
                "global_tokens": self.global_tokens,
                **self._score_options_config(),
            }
        )
        return config
