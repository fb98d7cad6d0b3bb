"""The memory `MultiHeadAttention(memory_efficient="auto")` may spend on logits.

With `"auto"`, a call materialises the `(B, H, Tq, Tk)` logits (the fastest
exact kernel wherever it fits) when their forward + backward working set fits
this budget, and runs the blockwise, memory-linear kernel otherwise. The
default is `DEFAULT_FRACTION` of the memory available when it is first needed
(read once per process): the accelerator's free memory on JAX GPU/TPU, else
the host's available memory (`MemAvailable` on Linux, capped by a
container's memory limit and the process' `RLIMIT_DATA` / `RLIMIT_AS`). A
layer's
`memory_budget=` argument overrides it for that layer.
"""

import os

from keras_attention import validation
from keras_attention.api_export import keras_attention_export

# Three quarters: where Keras' own (always materialised) layer fits, ours
# materialises too, at its speed and memory. Keras' layer at L = 8192 (8
# heads, 2 GiB per logits tensor) peaks at 7.3 GiB in a 16 GiB process (6.6
# GiB above the runtime: 3.3 such tensors, which the selector counts as 4):
# half of the 15 GiB available there sent that call blockwise, 1.16x Keras'
# time; three quarters (11 GiB) keeps it dense. The rest is headroom for
# what the model keeps besides one layer's logits.
DEFAULT_FRACTION = 0.75

_budget = None  # bytes, set by `set_attention_memory_budget` or read once


def _host_available():
    """The host's available memory, capped by this process' limits (a
    container's cgroup limit, `RLIMIT_DATA` / `RLIMIT_AS`)."""
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limits = []
    try:
        with open("/sys/fs/cgroup/memory.max") as cgroup:
            text = cgroup.read().strip()
        with open("/sys/fs/cgroup/memory.current") as cgroup:
            used = int(cgroup.read().strip())
        if text != "max":
            limits.append(int(text) - used)
    except (OSError, ValueError):
        pass
    try:
        import resource

        for which in (resource.RLIMIT_DATA, resource.RLIMIT_AS):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY:
                limits.append(soft - resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    except (ImportError, OSError, ValueError):
        pass
    return max(0, min([available] + limits))


def _device_available():
    import keras

    if keras.backend.backend() != "jax":
        return None
    import jax

    if jax.default_backend() == "cpu":
        return None
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
        return None
    return stats["bytes_limit"] - stats.get("bytes_in_use", 0)


def available_memory():
    """Bytes free for attention's working set here (None if unknown)."""
    device = _device_available()
    return device if device is not None else _host_available()


@keras_attention_export("layers", serializable=False)
def set_attention_memory_budget(num_bytes):
    """Sets the default memory budget of `memory_efficient="auto"` (bytes).

    `None` goes back to `DEFAULT_FRACTION` of the available memory, read
    again on next use. A layer's own `memory_budget` takes precedence.
    """
    global _budget
    _budget = validation.validate_positive_int(
        "set_attention_memory_budget", "num_bytes", num_bytes, allow_none=True
    )


@keras_attention_export("layers", serializable=False)
def attention_memory_budget():
    """The default memory budget in bytes (None when it cannot be read)."""
    global _budget
    if _budget is None:
        available = available_memory()
        if available is None:
            return None
        _budget = int(available * DEFAULT_FRACTION)
    return _budget
