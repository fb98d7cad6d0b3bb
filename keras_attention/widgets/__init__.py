"""Notebook widgets for watching attention: step through decoding, follow
attention live while training, explore every layer and head.

Installed with the `widgets` extra (`pip install "keras-attention[widgets]"`):
ipywidgets 8, Bokeh 3 and jupyter_bokeh. `import keras_attention` never
imports them; importing this package without them raises an ImportError that
names the extra.
"""

try:
    import bokeh  # noqa: F401
    import ipywidgets  # noqa: F401
    import jupyter_bokeh  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "keras_attention.widgets needs the optional `widgets` extra "
        "(ipywidgets, bokeh, jupyter_bokeh): pip install \"keras-attention[widgets]\". "
        f"Missing module: {error.name}"
    ) from error

from keras_attention.widgets.attention_explorer import AttentionExplorer
from keras_attention.widgets.decoding_stepper import DecodingStepper
from keras_attention.widgets.export import export_html
from keras_attention.widgets.export import export_png
from keras_attention.widgets.export import find_chromium
from keras_attention.widgets.figures import candidate_bars
from keras_attention.widgets.figures import distribution_bars
from keras_attention.widgets.figures import head_grid
from keras_attention.widgets.figures import heatmap
from keras_attention.widgets.figures import heatmap_source
from keras_attention.widgets.figures import image_heatmap
from keras_attention.widgets.figures import weighted_sum
from keras_attention.widgets.live_attention import LiveAttention
