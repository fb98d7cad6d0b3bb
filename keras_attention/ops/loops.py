"""Loops for the chunked kernels: one iteration at a time, on every backend.

`keras.ops.fori_loop` is a `tf.while_loop` on TensorFlow with the default
`parallel_iterations=10`: iterations whose work does not depend on the loop
state (each chunk of a chunked kernel reads its own slice of the inputs) are
started up to ten at a time, so ten chunks' intermediates are alive together
and a kernel chunked to save memory keeps most of what it meant to avoid
(measured: 1.4 GiB instead of 0.95 GiB above the baseline for block-sparse
attention at L = 16384 with 16-block chunks; more with bigger chunks).
`sequential_fori_loop` runs the iterations one after another (the exact
kernel, `memory_efficient.py`, uses it too: 2.1 GiB down to 1.3 GiB total at
L = 8192). JAX's
`lax.fori_loop` is sequential already; other backends use `ops.fori_loop`.
"""

import keras
from keras import ops


def sequential_fori_loop(lower, upper, body_fun, init_val, parallel_iterations=1):
    """`ops.fori_loop(lower, upper, body_fun, init_val)`, one step at a time.

    `parallel_iterations` (TensorFlow only) allows a few steps in flight.
    On JAX a loop of one static step is its body (a query block that is the
    whole sequence: no `while` to compile; ring attention's parts are many
    such calls).
    """
    static = isinstance(lower, int) and isinstance(upper, int)
    if static and upper - lower == 1 and keras.backend.backend() == "jax":
        return body_fun(lower, init_val)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.while_loop(
            lambda i, val: i < upper,
            lambda i, val: (i + 1, body_fun(i, val)),
            (lower, init_val),
            parallel_iterations=parallel_iterations,
        )[1]
    return ops.fori_loop(lower, upper, body_fun, init_val)


def to_time_blocks(x, num_blocks, block):
    """`(B, T, H, D)` -> `(num_blocks, B, H, block, D)`, time zero-padded.

    The chunk-major layout the chunked kernels loop over: step `i` takes
    block `i` with one `ops.take(..., i, axis=0)`.
    """
    pad = num_blocks * block - x.shape[1]
    if pad:
        x = ops.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    x = ops.reshape(x, (-1, num_blocks, block, x.shape[2], x.shape[3]))
    return ops.transpose(x, (1, 0, 3, 2, 4))


def _tensor_array_buffers():
    """True where block buffers should be TensorArrays: TensorFlow outside XLA.

    A TensorFlow graph (outside XLA) runs `dynamic_update_slice` as a copy of
    the whole buffer, so a loop writing one block per step costs O(buffer)
    per step (measured: 2.4 ms per write of a 16 MiB buffer; at L = 8192 the
    exact kernel's backward made 128 such writes, at 32768 over 2000 of a
    64 MiB buffer). A TensorArray writes one element in O(1). XLA and JAX
    update in place.
    """
    if keras.backend.backend() != "tensorflow":
        return False
    from keras_attention.ops.xla import tensorflow_xla_trace

    return not tensorflow_xla_trace()


def block_buffer(initial):
    """A buffer of `initial.shape[0]` blocks, read and written one at a time.

    Loop state for `sequential_fori_loop`: `read_block(buffer, i)`,
    `write_block(buffer, i, value)` (returns the new buffer) and
    `stack_blocks(buffer)` (the `(n, ...)` tensor).
    """
    if _tensor_array_buffers():
        import tensorflow as tf

        return tf.TensorArray(
            initial.dtype,
            size=initial.shape[0],
            clear_after_read=False,
            element_shape=initial.shape[1:],
        ).unstack(initial)
    return initial


def read_block(buffer, index):
    if hasattr(buffer, "read") and hasattr(buffer, "stack"):
        return buffer.read(index)
    return ops.take(buffer, index, axis=0)


def write_block(buffer, index, value):
    if hasattr(buffer, "write") and hasattr(buffer, "stack"):
        return buffer.write(index, value)
    start = (index,) + (0,) * (len(buffer.shape) - 1)
    return ops.slice_update(buffer, start, ops.expand_dims(value, 0))


def stack_blocks(buffer):
    if hasattr(buffer, "write") and hasattr(buffer, "stack"):
        return buffer.stack()
    return buffer
