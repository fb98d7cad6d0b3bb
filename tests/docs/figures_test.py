"""The figures of the README (one) and of the guides exist, are PNGs and stay small."""

import glob
import os
import pathlib
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENTS = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "guides", "*.md"))
)


def images(document):
    text = pathlib.Path(ROOT, document).read_text(encoding="utf-8")
    return re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)


def test_the_readme_has_one_figure():
    assert images("README.md") == ["docs/figures/decoding_stepper.png"]


def test_images_are_small_pngs_where_their_document_points():
    found = set()
    for document in DOCUMENTS:
        for image in images(document):
            # Relative to the document, as GitHub resolves it.
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(document), image))
            found.add(os.path.relpath(path, ROOT))
            with open(path, "rb") as f:
                data = f.read()
            assert data.startswith(b"\x89PNG\r\n\x1a\n"), (document, image)
            assert len(data) < 150_000, (document, image, len(data))
    assert {
        "docs/figures/decoding_stepper.png",
        "docs/figures/attention_explorer.png",
        "docs/figures/live_attention.png",
        "benchmarks/long_sequence.png",
    } <= found
