"""What the widgets share: notebook display, escaping, a Bokeh widget wrapper."""

import contextlib
import html
import weakref

from bokeh.core.json_encoder import serialize_json
from bokeh.core.serialization import Deserializer
from bokeh.core.serialization import Serialized
from bokeh.document import Document
from bokeh.events import DocumentReady
from bokeh.models import ColumnarDataSource
from jupyter_bokeh.widgets import BokehModel

from keras_attention.widgets import _theme


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
    """Displays as its `.widget` (an ipywidgets box) in a notebook.

    Its observers return at once while `_updating` is set: the component sets
    its own controls inside `with self._updating_controls():`.
    """

    widget = None
    _updating = False

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    @contextlib.contextmanager
    def _updating_controls(self):
        """Sets `_updating` for the block, so that the controls it sets do not call back."""
        self._updating = True
        try:
            yield
        finally:
            self._updating = False


class FreshBokehModel(BokehModel):
    """`jupyter_bokeh.BokehModel` whose views always draw the kernel's current document.

    BokehModel's front end draws the document serialised in its
    `render_bundle` state and then applies the changes the kernel sends as
    comm messages. Those messages reach only views that already exist: the
    ones sent before a view is drawn are dropped. JupyterLab and Notebook 7
    receive the state when the widget is created, so everything a cell does
    to a widget before its output is drawn (stepping a stepper, choosing a
    layer) never reached the page, and later changes were applied to the
    stale drawing (only their deltas arrived).

    Two things keep every view current:

    - the document is serialised afresh whenever the front end is sent the
      widget's state (creation, `request_state` from Voila or a reloaded
      page), not only when the widget was built;
    - every view, once BokehJS has drawn it, announces itself
      (`DocumentReady`, a Bokeh event sent over the widget comm). If the
      document changed since its state was last serialised, the view may
      have missed some changes, so the current state is sent again and the
      views redraw from it. Changes made while a view is connected keep
      flowing as small patches.

    Serialising a document takes long (0.1-0.8 s a figure on a loaded
    2-core machine), and a page that opens asks for every widget's state at
    once: Voila waits 4 s for that answer, then falls back to asking widget
    by widget, and a page with two explorers then drew only the first. So
    the serialised document is kept until the document changes, and the
    ones a cell changed are serialised after the cell (`post_execute`),
    while the kernel is busy anyway: a page that opens is answered at once.
    """

    def __init__(self, model, **kwargs):
        # Document changes made in the kernel, and how many of them the last
        # serialised state included.
        self._changes = 0
        self._changes_serialised = 0
        # The serialised document and the document version it holds (every
        # change counts, the page's too).
        self._version = 0
        self._bundle_json, self._bundle_version, self._bundle_changes = None, -1, 0
        self._view_drawn = False  # a page has drawn it (`DocumentReady`)
        if model.document is None:
            Document().add_root(model)
        # Before the first serialisation: the figures follow the page's light/dark theme.
        _theme.follow_page_theme(model.document, model)
        super().__init__(model, **kwargs)
        self._document.on_event(DocumentReady, self._on_view_drawn)
        _serialise_after_each_cell()

    def update_from_model(self, model):
        super().update_from_model(model)  # serialises the document into `render_bundle`
        self._bundle_json, self._bundle_version = serialize_json(self.render_bundle), self._version

    def get_state(self, key=None, drop_defaults=False):
        keys = self.keys if key is None else [key] if isinstance(key, str) else list(key)
        state = super().get_state([k for k in keys if k != "render_bundle"], drop_defaults)
        if "render_bundle" in keys:  # sent: the views drawn from it hold these changes
            state["render_bundle"] = self.serialised_document()
            self._changes_serialised = self._bundle_changes
        return state

    def serialised_document(self):
        """The `render_bundle` of the document as it is now (kept until it changes)."""
        if self._bundle_version != self._version:
            changes, version = self._changes, self._version
            self._bundle_json = serialize_json(self._model_to_traits(self._model))
            self._bundle_version, self._bundle_changes = version, changes
        _changed.discard(self)
        return self._bundle_json

    def _document_patched(self, event):
        self._version += 1
        _changed.add(self)
        if event.setter is not self:  # changes made in the page are already there
            self._changes += 1
        super()._document_patched(event)

    def _sync_model(self, widget, content, buffers):
        if content.get("event") == "jsevent" and self._is_data_echo(content):
            return
        # jupyter_bokeh applies a property change made in the page with the
        # setter (which runs the `on_change` callbacks) and then runs the
        # callbacks a second time; a tap on a bar would act twice.
        if content.get("event") == "jsevent" and content.get("kind") == "ModelChanged":
            content = dict(content)
            del content["event"]
            deserializer = Deserializer(list(self._document.models), setter=self)
            event = deserializer.deserialize(Serialized(content=content, buffers=[]))
            model, name = event["model"], event["attr"]
            model.lookup(name).set_from_json(model, event["new"], setter=self)
            return
        super()._sync_model(widget, content, buffers)

    def _is_data_echo(self, content):
        """True for a page event that changes a data source's columns.

        jupyter_bokeh's view sends every change it applies back to the
        kernel, the kernel's own included (it queues the events of a patch
        and sends them once the patch is applied). The echo of a stream
        appended its rows a second time to the kernel's copy, which then
        patched rows the page never had: BokehJS drew a stale subset of
        the rows ("Size mismatch") and the alignment stayed blank after
        Back or Reset. Only the kernel writes the columns it later diffs
        against (`_frames.set_data`), so the page's copies are never read.
        """
        kind = content.get("kind")
        if kind in ("ColumnsStreamed", "ColumnsPatched", "ColumnDataChanged"):
            return True
        if kind != "ModelChanged" or content.get("attr") != "data":
            return False
        model = self._document.get_model_by_id(content.get("model", {}).get("id"))
        return isinstance(model, ColumnarDataSource)

    def _on_view_drawn(self, _event):
        self._view_drawn = True
        if self._changes != self._changes_serialised:
            self.send_state("render_bundle")

    def close(self):
        # jupyter_bokeh's close is not idempotent (a second call, e.g. from
        # __del__ after an explicit close, raises KeyError).
        if getattr(self, "_closed_once", False):
            return
        self._closed_once = True
        super().close()


# The FreshBokehModels whose documents changed since they were last serialised.
_changed = weakref.WeakSet()
_hooked = False  # the post-cell hook is registered (once per kernel)


def _serialise_changed(*_):
    # A drawn view follows the changes as patches: its document is serialised
    # only if a page asks again (a reload), not after every cell that steps it.
    for widget in list(_changed):
        if not widget._view_drawn:
            widget.serialised_document()


def _serialise_after_each_cell():
    """In a kernel, once: serialise the changed documents after each cell runs."""
    global _hooked
    if _hooked:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "events"):
        shell.events.register("post_execute", _serialise_changed)
        _hooked = True
