"""Progress for long operations, the Keras way: `verbose=` and `keras.utils.Progbar`."""

import keras


def progress_bar(target, verbose, unit_name="step", auto=True, owner="progress"):
    """A `keras.utils.Progbar` over `target` steps, or None when silent.

    Args:
        target: number of steps.
        verbose: as in `model.predict`: 0 silent, 1 a bar, 2 one line when
            done, `"auto"` whichever `auto` says (1 when true, else 0).
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
    return keras.utils.Progbar(target, verbose=verbose, unit_name=unit_name)
