"""Static sizes: what Python may compare, and what it must leave unknown.

A dimension is *static* when it is a Python (or NumPy) integer. It is
*unknown* when it is `None` (a TensorFlow graph traced for any size, a
`KerasTensor`) or a JAX symbolic dimension: Keras infers the output of a
layer that calls ours inside its own `call` by tracing that `call` with
`jax.export`'s shape polymorphism, where an unknown batch is an expression
such as `b` and `b * 160000 > 2**34` cannot be decided in Python (#41).
Every size the layers and kernels compute with in Python (the kernel
selector's working set, block plans, chunk sizes, cache checks) goes through
`static_dim` first, and an unknown size takes the rule written for it.
"""

import numbers


def static_dim(dim):
    """`dim` as a Python int, or None when it is not known in Python.

    Python and NumPy integers are static; `None`, a JAX symbolic dimension
    and anything else are unknown.
    """
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        return None
    return int(dim)


def static_shape(shape):
    """A shape (or a tensor's shape) with every unknown size as None."""
    shape = shape.shape if hasattr(shape, "shape") else shape
    return tuple(static_dim(d) for d in shape)
