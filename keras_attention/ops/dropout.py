"""Attention dropout inside the tiled kernels: keep masks from a hash.

The standard attention dropout drops each weight of `softmax(logits)` with
probability `rate` and scales the kept ones by `1 / (1 - rate)`. The
materialised kernels draw a `(B, H, Tq, Tk)` mask with Keras' `Dropout`;
the tiled kernels (blockwise, block-sparse) never hold those weights, so
they cannot. Here the keep
bit of each weight is a pure function of `(seed, batch, head, query row,
key column)`, with the row and column the pair's positions in the call
(`0..Tq-1`, `0..Tk-1`): a kernel computes any tile's bits where it needs
them, the recomputing backward computes the same bits again, and nothing
`L x L` is stored. Keying by positions, not by tiles, makes the mask the
same whatever the block sizes, and `dropout_keep_mask` materialises it for
a small case (a reference fed the same mask checks a kernel's values and
gradients).

The bit, with `u32` arithmetic modulo `2**32` (`keras.ops` on `uint32`, so
TensorFlow graph, XLA and JAX compute the same bits):

    r = fmix(fmix(fmix(fmix(seed ^ ROW_SALT) ^ batch) ^ head) ^ row)
    c = fmix(fmix(fmix(seed ^ COLUMN_SALT)) ^ column) | 1
    keep = (r * c mod 2**32) >= round(rate * 2**32)

`fmix` is MurmurHash3's 32-bit finaliser (a bijection with full
avalanche). `r` and `c` are per row and per column, so a tile's keys cost
`O(bq + bk)` (and are computed once per call for every row and column);
each weight then takes one multiply and one comparison. `c` is odd, so for
a uniform `r` the product is uniform on `[0, 2**32)`: a weight is kept with
probability `1 - rate` (to `2**-32`). The top bits of a product mix all bits
of both factors, so bits of different rows and columns are uncorrelated
(tests/ops/dropout_test.py measures it: the rectangles' parity, the rows'
and columns' correlations). An XOR or a sum of `r` and `c` would not do:
the four corners of any rectangle would be linearly related.

`KeepBits` holds one call's keys for a kernel to cut into tiles;
`dropout_keep_mask` is the public, materialised form.
"""

from keras import ops

from keras_attention import validation

_ROW_SALT = 0x9E3779B9
_COLUMN_SALT = 0x7F4A7C15
_U32 = 2**32


def _u32(value):
    return ops.convert_to_tensor(value, dtype="uint32")


def fmix(x):
    """MurmurHash3's 32-bit finaliser of a `uint32` tensor."""
    x = ops.bitwise_xor(x, ops.right_shift(x, _u32(16)))
    x = ops.multiply(x, _u32(0x85EBCA6B))
    x = ops.bitwise_xor(x, ops.right_shift(x, _u32(13)))
    x = ops.multiply(x, _u32(0xC2B2AE35))
    return ops.bitwise_xor(x, ops.right_shift(x, _u32(16)))


def seed_key(seed):
    """The `uint32` key of an integer seed (a Python int or an integer scalar
    tensor; its value modulo `2**32`)."""
    if validation.is_int(seed):
        return _u32(int(validation.as_python_scalar(seed)) % _U32)
    return ops.cast(seed, "uint32")


def threshold(rate):
    """The `uint32` bound under which a product drops its weight."""
    return _u32(min(round(rate * _U32), _U32 - 1))


def row_keys(key, batch, heads, rows):
    """`(B, H, R)` row keys for batch `0..B-1`, heads `0..H-1` and the row
    positions `rows` (an int32 vector): `r` of the module docstring."""
    salted = fmix(ops.bitwise_xor(key, _u32(_ROW_SALT)))
    by_batch = fmix(ops.bitwise_xor(salted, ops.cast(ops.arange(batch), "uint32")))
    by_head = fmix(ops.bitwise_xor(by_batch[:, None], ops.cast(ops.arange(heads), "uint32")[None]))
    return fmix(ops.bitwise_xor(by_head[:, :, None], ops.cast(rows, "uint32")[None, None]))


def column_keys(key, columns):
    """Odd column keys for the column positions `columns` (int32, any
    shape): `c` of the module docstring."""
    salted = fmix(fmix(ops.bitwise_xor(key, _u32(_COLUMN_SALT))))
    keys = fmix(ops.bitwise_xor(salted, ops.cast(columns, "uint32")))
    return ops.bitwise_or(keys, _u32(1))


class KeepBits:
    """One call's dropout, for a kernel to cut into tiles.

    `rows(positions)` gives the `(B, H, R)` keys of the query rows at
    `positions` and `columns(positions)` those of key columns (computed once
    per call: `O(B H Tq + Tk)`); a tile's keep bits are then
    `keep(row_keys, column_keys)` of the two broadcast against each other,
    one product and one comparison per weight. `scale` is `1 / (1 - rate)`.
    """

    def __init__(self, seed, rate, batch, heads):
        self.key = seed_key(seed)
        self.bound = threshold(rate)
        self.scale = 1.0 / (1.0 - rate)
        self.batch, self.heads = batch, heads

    def rows(self, positions):
        return row_keys(self.key, self.batch, self.heads, positions)

    def columns(self, positions):
        return column_keys(self.key, positions)

    def keep(self, rows, columns):
        """Keep bits where `rows * columns >= bound` (`uint32`), broadcast."""
        return ops.greater_equal(ops.multiply(rows, columns), self.bound)


def check_seed(owner, argument, seed):
    """Raises unless `seed` is an integer or an integer scalar tensor."""
    tensor = hasattr(seed, "shape") and hasattr(seed, "dtype")
    if validation.is_int(seed) or (tensor and len(seed.shape) == 0 and "int" in str(seed.dtype)):
        return
    raise TypeError(
        validation.error(
            owner,
            f"`{argument}` must be an integer or an integer scalar tensor. Received: "
            f"{argument}={validation.describe(seed)}",
        )
    )


def dropout_keep_mask(seed, batch, heads, query_length, key_length, rate):
    """The blockwise kernel's dropout keep mask, materialised.

    `memory_efficient_attention(..., dropout_rate=rate, dropout_seed=seed)`
    keeps weight `(b, h, i, j)` (query row `i` of the call, key `j`) exactly
    where this mask is True, and scales the kept weights by `1 / (1 - rate)`,
    whatever its block sizes. For tests and small cases: the result is
    `(batch, heads, query_length, key_length)`.

    Args:
        seed: an integer or an integer scalar tensor (its value modulo
            `2**32` is used).
        batch, heads, query_length, key_length: the sizes, ints >= 0.
        rate: the dropout rate, a float in `[0, 1)`.

    Returns:
        A boolean tensor, True where the weight is kept.
    """
    owner = "dropout_keep_mask"
    check_seed(owner, "seed", seed)
    batch, heads, query_length, key_length = (
        validation.validate_non_negative_int(owner, argument, value)
        for argument, value in (
            ("batch", batch),
            ("heads", heads),
            ("query_length", query_length),
            ("key_length", key_length),
        )
    )
    bits = KeepBits(seed, validation.validate_rate(owner, "rate", rate), batch, heads)
    rows = bits.rows(ops.arange(query_length, dtype="int32"))
    return bits.keep(rows[..., None], bits.columns(ops.arange(key_length, dtype="int32")))
