"""Notebook widgets for watching attention: step through decoding, follow
attention live while training, explore every layer and head.

Installed with the `widgets` extra (`pip install "keras-attention-layers[widgets]"`):
ipywidgets 8, Bokeh 3 and jupyter_bokeh. `import keras_attention` never
imports them; importing this package without them raises an ImportError that
names the extra.

- `DecodingStepper(translator, text)`: step through a translator's decoding.
- `LiveAttention(model_or_layer, probe_inputs)`: Keras callback redrawing
  the probe batch's attention during `fit` (HTML snapshots outside notebooks).
- `AttentionExplorer(model, inputs)`: every layer and head of a model.
- Figure builders (`heatmap`, `distribution_bars`, `candidate_bars`,
  `weighted_sum`, `head_grid`, `image_heatmap`, `model_view`, `head_view`)
  return Bokeh objects;
  `export_html` writes standalone HTML with BokehJS inlined (no CDN), of a
  figure or of a whole widget (its controls replay the embedded steps,
  heads or frames without a kernel).
  `export_png` needs a chromium browser, an optional system dependency
  (Debian: `apt-get install chromium`; or set `KERAS_ATTENTION_CHROMIUM`).

Figures update over the widget comm (`jupyter_bokeh.BokehModel`), so they
work in JupyterLab, Notebook 7, VS Code and Voila. Load BokehJS once per
notebook without network access with `keras_attention.widgets.output_notebook()`
(Bokeh's `output_notebook(INLINE)` stores it twice in the saved notebook).

Token text is always shown as text, never interpreted as HTML.
"""

try:
    import bokeh  # noqa: F401
    import ipywidgets  # noqa: F401
    import jupyter_bokeh  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "keras_attention.widgets needs the optional `widgets` extra "
        '(ipywidgets, bokeh, jupyter_bokeh): pip install "keras-attention-layers[widgets]". '
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
from keras_attention.widgets.figures import head_view
from keras_attention.widgets.figures import heatmap
from keras_attention.widgets.figures import heatmap_source
from keras_attention.widgets.figures import image_heatmap
from keras_attention.widgets.figures import model_view
from keras_attention.widgets.figures import weighted_sum
from keras_attention.widgets.live_attention import LiveAttention
from keras_attention.widgets.notebook import output_notebook

__all__ = [
    "AttentionExplorer",
    "DecodingStepper",
    "export_html",
    "export_png",
    "find_chromium",
    "candidate_bars",
    "distribution_bars",
    "head_grid",
    "head_view",
    "heatmap",
    "heatmap_source",
    "image_heatmap",
    "model_view",
    "weighted_sum",
    "LiveAttention",
    "output_notebook",
]
