"""How inputs of any rank map onto the `(B', T, features)` the kernels see.

`keras.layers.MultiHeadAttention` attends over `attention_axes` of inputs of
any rank with generated einsum equations; ours flattens the attention axes
into one time axis (the other middle axes join the batch), runs the same
kernels, and unflattens. `attention_equations` gives Keras' equations for
subclasses written against Keras' protected surface.
"""

from keras import ops


class Layout:
    """How an input of rank > 3 maps to the `(B', T, features)` the kernels see.

    The attention axes are flattened into one time axis; the other middle
    axes join the batch. `keras.layers.MultiHeadAttention` computes the same
    thing with generated einsum equations.
    """

    def __init__(self, rank, attention_axes):
        self.rank = rank
        self.attention_axes = tuple(attention_axes)
        self.batch_axes = tuple(
            axis for axis in range(1, rank - 1) if axis not in self.attention_axes
        )
        self.trivial = rank == 3  # (B, T, F): nothing to move

    def flatten(self, x, features=True):
        """`(B, ..., F)` -> `(B', T, F)`; `features=False` for masks `(B, ...)`."""
        if self.trivial or x is None:
            return x
        last = (self.rank - 1,) if features else ()
        x = ops.transpose(x, (0,) + self.batch_axes + self.attention_axes + last)
        shape = ops.shape(x)
        start = 1 + len(self.batch_axes)
        length = shape[start]
        for i in range(1, len(self.attention_axes)):
            length = length * shape[start + i]
        return ops.reshape(x, (-1, length) + ((x.shape[-1],) if features else ()))

    def unflatten(self, x, query_shape):
        """`(B', Tq, *out)` back to `(B, ..., *out)` in the query's axis order."""
        if self.trivial:
            return x
        out_dims = tuple(x.shape[2:])
        order = (0,) + self.batch_axes + self.attention_axes
        x = ops.reshape(x, tuple(query_shape[a] for a in order) + out_dims)
        inverse = [order.index(axis) for axis in range(self.rank - 1)]
        inverse += [self.rank - 1 + i for i in range(len(out_dims))]
        return ops.transpose(x, inverse)

    def scores_shape(self, query_shape, key_shape, num_heads):
        """Keras' layout: `(B, <batch axes>, H, <query axes>, <key axes>)`."""
        return (
            (query_shape[0],)
            + tuple(query_shape[a] for a in self.batch_axes)
            + (num_heads,)
            + tuple(query_shape[a] for a in self.attention_axes)
            + tuple(key_shape[a] for a in self.attention_axes)
        )


def attention_equations(rank, attention_axes):
    """Keras' `(dot_product, combine, scores_rank)` einsum equations.

    For projected tensors of `rank` (`(B, <axes>, H, D)`) attending over
    `attention_axes`: scores are `(B, <batch axes>, H, <query axes>, <key
    axes>)`, as `keras.layers.MultiHeadAttention._build_attention` makes them.
    """
    letters = "abcdefghijklmnopqrstuvwxyz"
    target = letters[:rank]
    batch_dims = tuple(a for a in range(rank) if a not in attention_axes + (rank - 1,))
    source = list(target)
    next_letter = rank
    for axis in attention_axes:
        source[axis] = letters[next_letter]
        next_letter += 1
    source = "".join(source)
    product = (
        "".join(target[a] for a in batch_dims)
        + "".join(target[a] for a in attention_axes)
        + "".join(source[a] for a in attention_axes)
    )
    dot_product = f"{source},{target}->{product}"
    combine = f"{product},{source}->{target}"
    return dot_product, combine, len(product)
