"""SavedModel export for TF Serving, and the check to run before deploying.

- `export_translator(translator, path)`: a translator as a SavedModel taking
  raw strings.
- `export_causal_lm(causal_lm, path)`: a KerasHub causal LM (with our
  attention) as a SavedModel with `generate`, and `prefill` / `decode_step`
  signatures that carry the cache, to stream one token per request.
- `check_servable(path)` / `python -m keras_attention.export check PATH`:
  verifies that TF Serving can load and run a SavedModel.
"""

from keras_attention.export.causal_lm import export_causal_lm
from keras_attention.export.check import CheckReport
from keras_attention.export.check import NotASavedModelError
from keras_attention.export.check import check_servable
from keras_attention.export.saved_model import export_translator
from keras_attention.export.warmup import write_warmup_requests

__all__ = [
    "CheckReport",
    "NotASavedModelError",
    "check_servable",
    "export_causal_lm",
    "export_translator",
    "write_warmup_requests",
]
