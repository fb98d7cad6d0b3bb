"""Which kernel a `MultiHeadAttention` call ran, from the kernel functions.

The layer keeps no trace-time state for tests: `spy_kernels` wraps the kernel
functions the layer dispatches to and records a `Kernel` each time one runs
(once per trace in compiled code).
"""

from keras_attention.layers import multi_head_attention as mha_module
from keras_attention.layers.machinery.kernel_selector import Kernel
from keras_attention.ops import dense_attention


def spy_kernels(monkeypatch, flash_flags=None):
    """Returns the list that every kernel run of `MultiHeadAttention` appends to.

    `flash_flags`, if a list, receives the `flash_attention` flag each
    `keras.ops.dot_product_attention` call asked for; the call itself then
    runs with `flash_attention=None` (this CPU has no flash kernel).
    """
    ran = []

    def wrap(owner, name, kernel_of):
        original = getattr(owner, name)

        def spy(*args, **kwargs):
            ran.append(kernel_of(kwargs))
            if flash_flags is not None and "flash_attention" in kwargs:
                flash_flags.append(kwargs["flash_attention"])
                if kwargs["flash_attention"]:
                    kwargs["flash_attention"] = None
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)

    wrap(dense_attention, "dense_attention", lambda kw: Kernel.DENSE)
    wrap(dense_attention, "shifted_attention", lambda kw: Kernel.SHIFTED)
    wrap(
        dense_attention,
        "composite_attention",
        lambda kw: Kernel.COMPOSITE if kw.get("flash_attention") is False else Kernel.FUSED,
    )
    wrap(mha_module, "memory_efficient_attention", lambda kw: Kernel.BLOCKWISE)
    wrap(mha_module.ring, "ring_attention", lambda kw: Kernel.RING)
    return ran
