"""The painted-text check, as the browser tests name it: the code lives in
`keras_attention.widgets._legibility`, which the figure generator
(`docs/make_figures.py`) runs on every published figure too."""

from keras_attention.widgets._legibility import READ_TEXT_BOXES  # noqa: F401
from keras_attention.widgets._legibility import assert_legible  # noqa: F401
from keras_attention.widgets._legibility import wait_until_drawn  # noqa: F401
