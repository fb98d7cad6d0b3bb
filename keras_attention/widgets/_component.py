"""What the three widgets share: notebook display and notebook detection."""

import html


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
