"""Whether the code being traced will be compiled by XLA."""

import keras


def tensorflow_xla_trace():
    """True inside a TensorFlow `tf.function(jit_compile=True)` trace.

    TensorFlow graphs outside XLA (TF Serving's, graph mode without
    `jit_compile`) run op by op, so some choices differ there: XLA-only ops
    cannot be served, and XLA fuses written-out kernels that graph mode runs
    unfused. Always False on the other backends.
    """
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def under_xla():
    """True where the code being traced is compiled by XLA: always on JAX,
    inside a `jit_compile=True` trace on TensorFlow (`tensorflow_xla_trace`)."""
    return keras.backend.backend() == "jax" or tensorflow_xla_trace()
