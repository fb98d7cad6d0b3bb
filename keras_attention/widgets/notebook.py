"""Loading BokehJS into a notebook, stored once."""


def output_notebook():
    """`bokeh.io.output_notebook(bokeh.resources.INLINE, hide_banner=True)`, BokehJS stored once.

    Bokeh's loader publishes the inlined BokehJS twice in one output (as
    `application/javascript` for the classic notebook and as
    `application/vnd.bokehjs_load.v0+json` for JupyterLab), so every saved
    notebook carried two copies (~4 MB each). This keeps the
    `application/javascript` copy, which JupyterLab 4, Notebook 7, Voila and
    nbconvert's HTML all run. No network: BokehJS comes from the installed
    package.
    """
    from bokeh.io import notebook as bokeh_notebook
    from bokeh.io import output_notebook as bokeh_output_notebook
    from bokeh.resources import INLINE

    publish = bokeh_notebook.publish_display_data

    def once(data, *args, **kwargs):
        if bokeh_notebook.JS_MIME_TYPE in data:
            data = {
                key: value for key, value in data.items() if key != bokeh_notebook.LOAD_MIME_TYPE
            }
        return publish(data, *args, **kwargs)

    bokeh_notebook.publish_display_data = once  # the loader calls it by its module name
    try:
        bokeh_output_notebook(INLINE, hide_banner=True)
    finally:
        bokeh_notebook.publish_display_data = publish
