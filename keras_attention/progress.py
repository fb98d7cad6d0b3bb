"""Progress for long operations, the Keras way: `verbose=` and `keras.utils.Progbar`.

In a terminal or a notebook the bar is Keras' own. Anywhere else (a log file,
a pipe, CI) Keras' bar still writes `\\r`/`\\b` and ANSI colour codes (it takes
any POSIX system for a live display), which run together on one line; there
the bar prints one plain line per update instead.
"""

import sys
import time

import keras
from keras.src.utils import io_utils


def _is_live_display(stream=None):
    stream = sys.stdout if stream is None else stream
    if "ipykernel" in sys.modules:  # a notebook renders `\r` updates in place
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class _LineProgbar(keras.utils.Progbar):
    """`keras.utils.Progbar(verbose=1)` for a non-terminal: one plain line per update."""

    def update(self, current, values=None, finalize=None):
        if finalize is None:
            finalize = self.target is not None and current >= self.target
        now = time.time()
        if now - self._last_update < self.interval and not finalize:
            return
        time_per_unit = self._estimate_step_duration(current, now)
        self._seen_so_far = current
        count = f"{current}/{self.target}" if self.target else f"{current}"
        line = (
            f"{count} - {now - self._start:.0f}s{self._format_time(time_per_unit, self.unit_name)}"
        )
        io_utils.print_msg(line)
        self._last_update = now


def progress_bar(target, verbose, unit_name="step", auto=True, owner="progress"):
    """A `keras.utils.Progbar` over `target` steps, or None when silent.

    Args:
        target: number of steps.
        verbose: as in `model.predict`: 0 silent, 1 a bar, 2 one line when
            done, `"auto"` whichever `auto` says (1 when true, else 0).
            Outside a terminal or a notebook, 1 prints one plain line per
            update (no escape codes).
        unit_name: what a step is, shown in the bar ("batch", "stage").
        auto: what `"auto"` means for this call.
        owner: the function named in the error for a bad `verbose`.
    """
    if verbose == "auto":
        verbose = 1 if auto else 0
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise ValueError(
            f'{owner}: `verbose` must be 0, 1, 2 or "auto". Received: verbose={verbose!r}'
        )
    if verbose == 0:
        return None
    if verbose == 1 and not _is_live_display():
        return _LineProgbar(target, verbose=1, unit_name=unit_name)
    return keras.utils.Progbar(target, verbose=verbose, unit_name=unit_name)
