"""Backend-neutral gradients for tests (TensorFlow tape or `jax.grad`)."""

import keras
import numpy as np


def input_gradients(fn, arrays, cotangent, jit=False):
    """Gradients of `sum(fn(*arrays) * cotangent)` w.r.t. every array;
    `jit=True` (JAX only) compiles the gradient with `jax.jit` (several
    times faster than op by op for the tiled kernels' loops)."""
    if keras.backend.backend() == "jax":
        import jax

        def loss(*xs):
            return (fn(*xs).astype("float32") * cotangent).sum()

        grad = jax.grad(loss, argnums=tuple(range(len(arrays))))
        grads = (jax.jit(grad) if jit else grad)(*arrays)
        return [np.asarray(g) for g in grads]
    import tensorflow as tf

    tensors = [tf.constant(a) for a in arrays]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        loss = tf.reduce_sum(tf.cast(fn(*tensors), "float32") * cotangent)
    return [g.numpy() for g in tape.gradient(loss, tensors)]


def layer_gradients(layer, inputs, cotangent, jit=False, **call_kwargs):
    """Output, and gradients w.r.t. the inputs and the trainable weights.

    `inputs` is a list of arrays passed positionally to `layer`. `jit=True`
    (JAX only) compiles the whole computation with `jax.jit`, as a layer
    sharded over devices needs.
    """
    if keras.backend.backend() == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def loss(weights, *xs):
            out, _ = layer.stateless_call(weights, non_trainable, *xs, **call_kwargs)
            return (out * cotangent).sum(), out

        value_and_grad = jax.value_and_grad(
            loss, argnums=tuple(range(len(inputs) + 1)), has_aux=True
        )
        if jit:
            value_and_grad = jax.jit(value_and_grad)
        (_, out), grads = value_and_grad(trainable, *inputs)
        return (
            np.asarray(out),
            [np.asarray(g) for g in grads[1:]],
            [np.asarray(g) for g in grads[0]],
        )
    if jit:
        raise ValueError("layer_gradients: jit=True is for the JAX backend")
    import tensorflow as tf

    tensors = [tf.constant(a) for a in inputs]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = layer(*tensors, **call_kwargs)
        loss = tf.reduce_sum(out * cotangent)
    grads = tape.gradient(loss, tensors + list(layer.trainable_variables))
    return (
        out.numpy(),
        [g.numpy() for g in grads[: len(tensors)]],
        [g.numpy() for g in grads[len(tensors) :]],
    )


def compiled_squared_sum_gradient(fn, x):
    """Gradient of `sum(fn(x) ** 2)` w.r.t. `x`, compiled with XLA.

    `jax.jit` on JAX, `tf.function(jit_compile=True)` on TensorFlow: the
    check that an op compiles and differentiates, not only that it runs eagerly.
    """
    if keras.backend.backend() == "jax":
        import jax

        def loss(q):
            return (fn(q) ** 2).sum()

        grad = jax.jit(jax.grad(loss))(x)
    else:
        import tensorflow as tf

        @tf.function(jit_compile=True, autograph=False)
        def grad_fn(q):
            with tf.GradientTape() as tape:
                tape.watch(q)
                loss = tf.reduce_sum(fn(q) ** 2)
            return tape.gradient(loss, q)

        grad = grad_fn(tf.constant(x))
    return keras.ops.convert_to_numpy(grad)
