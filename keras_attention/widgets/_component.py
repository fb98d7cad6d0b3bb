"""What the widgets share: notebook display, escaping, a Bokeh widget wrapper."""

import html

from bokeh.core.json_encoder import serialize_json
from jupyter_bokeh.widgets import BokehModel


def in_notebook():
    """True inside a Jupyter kernel (notebook, lab, Voila, VS Code)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def escape(text):
    """Token text for an ipywidgets HTML value: always shown as text."""
    return html.escape(str(text), quote=True)


class Component:
    """Displays as its `.widget` (an ipywidgets box) in a notebook."""

    widget = None

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


class FreshBokehModel(BokehModel):
    """`jupyter_bokeh.BokehModel` whose state always carries the current document.

    BokehModel sends later changes as comm messages, which a front end that
    connects later (Voila renders after the cells ran, a reloaded notebook,
    VS Code re-rendering an output) never receives; it would draw the
    document as it was when the widget was created. Serialising the document
    again whenever a front end asks for the widget's state makes late front
    ends draw what the kernel holds now; updates then flow as messages.
    """

    def get_state(self, key=None, drop_defaults=False):
        state = super().get_state(key, drop_defaults)
        if "render_bundle" in state:
            state["render_bundle"] = serialize_json(self._model_to_traits(self._model))
        return state

    def close(self):
        # jupyter_bokeh's close is not idempotent (a second call, e.g. from
        # __del__ after an explicit close, raises KeyError).
        if getattr(self, "_closed_once", False):
            return
        self._closed_once = True
        super().close()
