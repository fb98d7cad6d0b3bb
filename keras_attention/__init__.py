"""keras-attention-layers: attention mechanisms as serializable Keras 3 layers.

The core imports only keras (and its backend). Widgets live in
`keras_attention.widgets` (the `widgets` extra); tensorflow-text is imported
only by the text-processing code that needs it.
"""

from keras_attention._conflicts import warn_if_shadowed as _warn_if_shadowed
from keras_attention._quiet import quiet_startup as _quiet_startup

_warn_if_shadowed()  # the unrelated 2019 `keras-attention` shares our import name

# Only for our own entry points (examples, CLI): see keras_attention/_quiet.py.
with _quiet_startup():
    from keras_attention import analysis
    from keras_attention import distribution
    from keras_attention import layers
    from keras_attention import ops

    # Registers the loader of swapped KerasHub backbones: their `.keras` files
    # load after `import keras_attention` (KerasHub itself is not imported).
    from keras_attention.interchange import keras_hub_models as _keras_hub_models
    from keras_attention.layers import *  # noqa: F401,F403
    from keras_attention.models import register_serializables as _register

_register()  # translators load from `.keras` after `import keras_attention`
del _register, _warn_if_shadowed, _quiet_startup, _keras_hub_models

__version__ = "0.2.0"

__all__ = list(layers.__all__) + ["analysis", "distribution", "layers", "ops"]
