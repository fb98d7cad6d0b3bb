"""Every figure a page of ours shows is made by `make figures` (docs/make_figures.py),
exists, is a PNG and stays small. No browser, no training: the generator's own checks
(painted text, page errors) are tests/docs/make_figures_test.py's."""

import glob
import importlib.util
import os
import pathlib
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The README (the site's home page), every Markdown page of docs/ (the guides), the other
# site page (benchmarks/RESULTS.md) and the notebooks' README.
DOCUMENTS = sorted(
    ["README.md", "benchmarks/RESULTS.md", "examples/notebooks/README.md"]
    + [
        os.path.relpath(p, ROOT)
        for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    ]
)
# Markdown images and HTML <img> tags.
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)|<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']")


def make_figures():
    spec = importlib.util.spec_from_file_location(
        "make_figures", os.path.join(ROOT, "docs", "make_figures.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def images(document):
    """The images `document` shows, as paths from the repository root (resolved
    relative to the document, as GitHub and the docs site resolve them)."""
    text = pathlib.Path(ROOT, document).read_text(encoding="utf-8")
    found = [a or b for a, b in IMAGE.findall(text)]
    return [
        os.path.relpath(os.path.normpath(os.path.join(ROOT, os.path.dirname(document), i)), ROOT)
        for i in found
        if "://" not in i
    ]


def shown_images():
    return {(document, image) for document in DOCUMENTS for image in images(document)}


def test_the_readme_shows_the_decoding_stepper():
    assert images("README.md") == ["docs/figures/decoding_stepper.png"]


def test_every_image_a_page_shows_is_made_by_make_figures():
    published = set(make_figures().PUBLISHED)
    missing = sorted(
        (document, image) for document, image in shown_images() if image not in published
    )
    assert not missing, f"shown but not made by docs/make_figures.py (add to SHOTS): {missing}"
    # The check reads what the pages show: the README's and the guides' figures at least.
    assert {image for _, image in shown_images()} >= {
        "docs/figures/decoding_stepper.png",
        "docs/figures/attention_explorer.png",
        "docs/figures/live_attention.png",
        "benchmarks/long_sequence.png",
    }


def test_every_figure_made_exists_as_a_small_png():
    generator = make_figures()
    for image in generator.PUBLISHED:
        with open(os.path.join(ROOT, image), "rb") as f:
            data = f.read()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), image
        assert len(data) <= generator.MAX_BYTES, (image, len(data))
