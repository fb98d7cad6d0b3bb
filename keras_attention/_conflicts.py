"""Warns when the unrelated 2019 `keras-attention` distribution shares our directory.

Both distributions install the import package `keras_attention`, so pip puts
their files in one directory and the one installed last owns `__init__.py`.
When ours won, this warning says why `keras_attention.self_attention` exists
and that uninstalling the other later deletes our `__init__.py` too. (When the
other won, this code never runs: `import keras_attention` is theirs.)
"""

import importlib.metadata
import warnings

# Files that only the 2019 package (keras-attention 1.0.0) installs.
_FOREIGN_FILES = {"keras_attention/self_attention.py", "keras_attention/settings.py"}


def foreign_distribution():
    """The installed `keras-attention` distribution that is not ours, or None."""
    try:
        distribution = importlib.metadata.distribution("keras-attention")
    except importlib.metadata.PackageNotFoundError:
        return None
    files = {str(path).replace("\\", "/") for path in distribution.files or ()}
    return distribution if files & _FOREIGN_FILES else None


def warn_if_shadowed():
    distribution = foreign_distribution()
    if distribution is not None:
        warnings.warn(
            f"The unrelated package keras-attention {distribution.version} is "
            "installed in the same directory as keras-attention-layers (both "
            "import as `keras_attention`). Run `pip uninstall keras-attention` "
            "and then `pip install --force-reinstall --no-deps "
            "keras-attention-layers`.",
            UserWarning,
            stacklevel=3,
        )
