"""mkdocs hook: the README's sections as guide pages, one API page per public module.

Nothing here is copied by hand, so the site cannot drift from the README or
from the package's `__all__`s:

- README.md is split at its `## ` headings; the text before the first one is
  the home page. Links to a README heading go to the page holding it; links to
  files that are pages of the site (benchmarks/RESULTS.md) go to that page;
  other files of the repository stay as their path in code font.
- Every public module (`PUBLIC_MODULES`) gets a page with one mkdocstrings
  block per name of its `__all__`, pointing at the symbol's defining module.
"""

import importlib
import inspect
import os
import re

from markdown.extensions.toc import slugify
from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLIC_MODULES = (
    "keras_attention",
    "keras_attention.ops",
    "keras_attention.distribution",
    "keras_attention.models",
    "keras_attention.models.alignment_chart",
    "keras_attention.export",
    "keras_attention.widgets",
)
EXTRA_PAGES = {"benchmarks/RESULTS.md": "benchmarks.md"}


def public_names(module):
    """The names of the module's `__all__` that are not modules."""
    return [name for name in module.__all__ if not inspect.ismodule(getattr(module, name))]


def public_symbols():
    """{module name: [(public name, defining path)]} for every public module."""
    symbols = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        symbols[module_name] = [
            (name, f"{getattr(module, name).__module__}.{getattr(module, name).__qualname__}")
            for name in public_names(module)
        ]
    return symbols


def readme_pages():
    """[(file name, title, markdown)] from README.md's `## ` sections."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    pages = [("index.md", "Home", parts[0])]
    for title, body in zip(parts[1::2], parts[2::2]):
        name = "guides/" + slugify(title.replace("`", ""), "-") + ".md"
        pages.append((name, title.replace("`", ""), f"# {title}\n{body}"))
    return pages


def written_guides():
    """[(file name, title)] of the guides written as pages (docs/guides/)."""
    folder = os.path.join(ROOT, "docs", "guides")
    guides = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if name.endswith(".md"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                title = f.readline().lstrip("# ").strip()
            guides.append(("guides/" + name, title))
    return guides


def _rewrite_links(markdown, page_name, anchors):
    depth = page_name.count("/")

    def relative(target):
        return "../" * depth + target

    def link(match):
        image, label, target = match.group(1), match.group(2), match.group(3)
        if target.startswith(("http://", "https://", "mailto:")):
            return match.group(0)
        if image:  # docs/figures/x.png is in the site; other images are copied in
            inside = target[len("docs/"):] if target.startswith("docs/") else target
            return f"![{label}]({relative(inside)})"
        if target.startswith("#"):
            page = anchors.get(target[1:])
            return f"[{label}]({relative(page)}{target})" if page else label
        if target in EXTRA_PAGES:
            return f"[{label}]({relative(EXTRA_PAGES[target])})"
        return label if label.startswith("`") else f"`{target}`"

    return re.sub(r"(!?)\[([^\]]+)\]\(([^)\s]+)\)", link, markdown)


def on_files(files, config):
    pages = readme_pages()
    anchors = {}
    for name, _, body in pages:
        for heading in re.findall(r"^#{1,6} (.+)$", body, flags=re.MULTILINE):
            anchors.setdefault(slugify(heading.replace("`", ""), "-"), name)
    for name, _, body in pages:
        files.append(File.generated(config, name, content=_rewrite_links(body, name, anchors)))
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s:]+)\)", body):
            if not image.startswith("docs/") and files.get_file_from_path(image) is None:
                files.append(File.generated(config, image, abs_src_path=os.path.join(ROOT, image)))
    for source, name in EXTRA_PAGES.items():
        with open(os.path.join(ROOT, source), encoding="utf-8") as f:
            files.append(File.generated(config, name, content=f.read()))
    for module_name, symbols in public_symbols().items():
        blocks = [f"# `{module_name}`\n"]
        doc = inspect.getdoc(importlib.import_module(module_name))
        if doc:
            blocks.append(doc.split("\n\n")[0] + "\n")
        for name, path in symbols:
            blocks.append(f"## `{module_name}.{name}`\n\n::: {path}\n")
        files.append(File.generated(config, f"api/{module_name}.md", content="\n".join(blocks)))
    return files


def on_config(config):
    config["nav"] = [
        {"Home": "index.md"},
        {"Guides": [{title: name} for name, title, _ in readme_pages()[1:]]
                   + [{title: name} for name, title in written_guides()]},
        {"API reference": [{module: f"api/{module}.md"} for module in PUBLIC_MODULES]},
        {"Benchmarks": "benchmarks.md"},
    ]
    return config
