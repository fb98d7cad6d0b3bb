"""The README's figures exist, are PNGs and stay small."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_images_are_small_pngs():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme)
    assert {"docs/figures/decoding_stepper.png", "docs/figures/attention_explorer.png",
            "docs/figures/live_attention.png", "benchmarks/long_sequence.png"} <= set(images)
    for image in images:
        with open(os.path.join(ROOT, image), "rb") as f:
            data = f.read()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), image
        assert len(data) < 150_000, (image, len(data))
