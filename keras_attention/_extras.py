"""Optional dependencies (setup.cfg's extras): an ImportError that names the
extra and the pip command, raised from the public call that needs it."""

import importlib

DISTRIBUTION = "keras-attention-layers"


def install_hint(extra):
    return (
        f'pip install "{DISTRIBUTION}[{extra}]" '
        f'(from a clone of the repository: pip install ".[{extra}]")'
    )


def require(module, extra, feature, purpose=""):
    """Imports and returns `module`, or raises an ImportError naming `extra`.

    `feature` names the public call the user made (`"Seq2SeqTranslator.
    from_texts"`); `purpose` says what the module is for there.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != module.split(".")[0]:
            raise  # a module the extra itself needs: its own error is clearer
        package = module.replace("_", "-")
        raise ImportError(
            f"{feature} needs {package}{purpose}, which is not installed: it "
            f"comes with the optional `{extra}` extra. {install_hint(extra)}",
            name=module,
        ) from error


def require_tensorflow_text(feature):
    """tensorflow-text (the `text` extra), for tokenizing in the graph."""
    return require(
        "tensorflow_text", "text", feature, " (the translators tokenize text with its ops)"
    )
