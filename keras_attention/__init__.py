"""keras-attention-layers: attention mechanisms as serializable Keras 3 layers.

The core imports only keras (and its backend). Widgets live in
`keras_attention.widgets` (the `widgets` extra); tensorflow-text is imported
only by the text-processing code that needs it.
"""

from keras_attention._conflicts import warn_if_shadowed as _warn_if_shadowed

_warn_if_shadowed()  # the unrelated 2019 `keras-attention` shares our import name
del _warn_if_shadowed

from keras_attention import layers  # noqa: E402
from keras_attention import ops  # noqa: E402
from keras_attention.layers import *  # noqa: E402,F401,F403
from keras_attention.models import register_serializables as _register  # noqa: E402

_register()  # translators load from `.keras` after `import keras_attention`
del _register

__version__ = "0.2.0"

__all__ = list(layers.__all__) + ["layers", "ops"]
