"""`parallel_iterations` of every while loop in a TF gradient graph (tests)."""


def while_loop_parallelism(fn, arrays):
    """Traces `grad(sum(fn(*arrays)^2))` with `tf.function` and returns the
    `parallel_iterations` of each While op in it and its function bodies."""
    import tensorflow as tf

    tensors = [tf.constant(a) for a in arrays]

    # No AutoGraph: the kernels need none (their loops are ops.fori_loop),
    # and converting library code recursively once mapped `favor_attention`
    # to another function's converted code in a long-running test worker.
    @tf.function(autograph=False)
    def step(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            loss = tf.reduce_sum(tf.square(fn(*xs)))
        return tape.gradient(loss, xs)

    found = []

    def collect(graph):
        for op in graph.get_operations():
            if op.type in ("While", "StatelessWhile"):
                found.append(op.get_attr("parallel_iterations"))
        for function in graph._functions.values():
            collect(function.graph)

    collect(step.get_concrete_function(*tensors).graph)
    return found
