"""The painted-text check, as the browser tests name it: the code lives in
`tests/widgets/legibility.py`, which the figure generator
(`docs/make_figures.py`) runs on every published figure too."""

from tests.widgets.legibility import READ_TEXT_BOXES  # noqa: F401
from tests.widgets.legibility import assert_legible  # noqa: F401
from tests.widgets.legibility import wait_until_drawn  # noqa: F401
