import inspect
import subprocess
import sys

import keras

import keras_attention
from keras_attention import layers


def test_core_import_does_not_pull_optional_dependencies():
    """Nor KerasHub, though the loader of swapped KerasHub backbones is
    registered by the import (their `.keras` files load after it)."""
    code = (
        "import sys, keras, keras_attention, keras_attention.layers, keras_attention.ops\n"
        "heavy = [m for m in ('ipywidgets', 'bokeh', 'jupyter_bokeh', 'tensorflow_text',"
        " 'keras_hub') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert keras.saving.get_registered_object("
        "'keras_attention>KerasHubBackboneOnOurAttention')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_layers_are_reexported_and_registered():
    public = [
        obj
        for name, obj in vars(layers).items()
        if inspect.isclass(obj)
        and issubclass(obj, keras.layers.Layer)
        and not name.startswith("Base")
    ]
    assert len(public) >= 4
    for cls in public:
        assert getattr(keras_attention, cls.__name__) is cls
        registered = keras.saving.get_registered_name(cls)
        assert registered == f"keras_attention>{cls.__name__}", registered
