"""mkdocs hook: the README as the home page, the guides, one API page per public module.

Nothing here is copied by hand, so the site cannot drift from the README, the
guides or the package's `__all__`s:

- README.md is the home page. Its links to `docs/...` files go to those pages
  of the site; links to files that are pages of the site (benchmarks/RESULTS.md)
  go to that page; other files of the repository stay as their path in code font.
- The guides are the Markdown files of docs/guides/, written to read well on
  GitHub too: a link or image `../../PATH` (a repository file) becomes the site's
  copy of it, or its path in code font; a link to a guide not written yet
  (`migration.md` before it lands) becomes its label, not a broken link.
- Every public module (`PUBLIC_MODULES`) gets a page with one mkdocstrings
  block per name of its `__all__`, pointing at the symbol's defining module;
  the navigation lists each module once, grouped as the package is.
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
    "keras_attention.interchange.keras_hub_models",
    "keras_attention.analysis",
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


GUIDES_DIR = os.path.join(ROOT, "docs", "guides")
# The guides in reading order; any other guide file follows, by name.
GUIDE_ORDER = (
    "long-sequences.md",
    "programmable-attention.md",
    "modern-attention.md",
    "decoding-and-serving.md",
    "distribution.md",
    "analysis.md",
    "widgets.md",
    "migration.md",
    "supported-versions.md",
)


def guide_pages():
    """[(site path, title)] of docs/guides/*.md, in reading order."""
    names = sorted(os.listdir(GUIDES_DIR)) if os.path.isdir(GUIDES_DIR) else []
    names = [n for n in GUIDE_ORDER if n in names] + [
        n for n in names if n.endswith(".md") and n not in GUIDE_ORDER
    ]
    pages = []
    for name in names:
        with open(os.path.join(GUIDES_DIR, name), encoding="utf-8") as f:
            title = next((line[2:].strip() for line in f if line.startswith("# ")), name)
        pages.append((f"guides/{name}", title.replace("`", "")))
    return pages


def readme_pages():
    """[(file name, title, markdown)]: the README, whole, as the home page."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    return [("index.md", "Home", text)]


def _rewrite_links(markdown, page_name, anchors):
    depth = page_name.count("/")

    def relative(target):
        return "../" * depth + target

    def link(match):
        image, label, target = match.group(1), match.group(2), match.group(3)
        if target.startswith(("http://", "https://", "mailto:")):
            return match.group(0)
        if image:  # docs/figures/x.png is in the site; other images are copied in
            inside = target[len("docs/") :] if target.startswith("docs/") else target
            return f"![{label}]({relative(inside)})"
        if target.startswith("#"):
            page = anchors.get(target[1:])
            return f"[{label}]({relative(page)}{target})" if page else label
        if target in EXTRA_PAGES:
            return f"[{label}]({relative(EXTRA_PAGES[target])})"
        path, _, anchor = target.partition("#")
        if path.startswith("docs/") and path.endswith(".md"):
            if os.path.exists(os.path.join(ROOT, path)):
                return (
                    f"[{label}]({relative(path[len('docs/') :])}{'#' + anchor if anchor else ''})"
                )
            return label
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
    for name, _ in guide_pages():
        with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as f:
            body = f.read()
        for image in re.findall(r"!\[[^\]]*\]\(\.\./\.\./([^)\s]+)\)", body):
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
        for _name, path in symbols:
            # mkdocstrings writes the heading (the name, then the signature).
            blocks.append(f"::: {path}\n")
        files.append(File.generated(config, f"api/{module_name}.md", content="\n".join(blocks)))
    return files


def on_page_markdown(markdown, page, config, files):
    """A guide's repository links (`../../PATH`) and links to guides not written yet."""
    if not page.file.src_uri.startswith("guides/"):
        return markdown

    def link(match):
        image, label, target = match.group(1), match.group(2), match.group(3)
        if target.startswith(("http://", "https://", "mailto:", "#")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        if path.startswith("../../"):
            inside = path[len("../../") :]
            if inside.startswith("docs/"):
                return f"{image}[{label}](../{inside[len('docs/') :]})"
            if image or inside in EXTRA_PAGES:
                return f"{image}[{label}](../{EXTRA_PAGES.get(inside, inside)})"
            return label if label.startswith("`") else f"`{inside}`"
        if (
            path.endswith(".md")
            and files.get_file_from_path(os.path.normpath(os.path.join("guides", path))) is None
        ):
            return label
        return match.group(0)

    return re.sub(r"(!?)\[([^\]]+)\]\(([^)\s]+)\)", link, markdown)


# The API pages, grouped as the package is (module: label in the navigation).
API_GROUPS = {
    "keras_attention": "layers (keras_attention)",
    "keras_attention.interchange.keras_hub_models": "interchange.keras_hub_models",
    "keras_attention.ops": "ops",
    "keras_attention.analysis": "analysis",
    "keras_attention.models": "models",
    "keras_attention.models.alignment_chart": "models.alignment_chart",
    "keras_attention.export": "export",
    "keras_attention.widgets": "widgets",
    "keras_attention.distribution": "distribution",
}


def on_config(config):
    config["nav"] = [
        {"Home": "index.md"},
        {"Guides": [{title: name} for name, title in guide_pages()]},
        {
            "API reference": [
                {API_GROUPS.get(module, module): f"api/{module}.md"}
                for module in sorted(PUBLIC_MODULES, key=list(API_GROUPS).index)
            ]
        },
        {"Benchmarks": "benchmarks.md"},
    ]
    return config
