"""The committed pictures are what their sources render: Graphviz sources by scripts/render-pictures.sh."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tiers import missing

ROOT = Path(__file__).resolve().parents[1]
DOT_SOURCES = sorted((ROOT / "docs" / "pictures").glob("*.dot"))


@pytest.mark.parametrize("source", DOT_SOURCES, ids=lambda p: p.name)
def test_the_committed_svg_is_the_render_of_its_source(source, tmp_path):
    if shutil.which("dot") is None:
        missing("Graphviz's dot is not on PATH", "apt-get install graphviz; .ci/prometheus installs it in CI")
    rendered = tmp_path / "rendered.svg"
    subprocess.run(["dot", "-Tsvg", str(source), "-o", str(rendered)], check=True, timeout=60)
    committed = source.with_suffix(".svg")
    assert committed.read_text() == rendered.read_text(), (
        f"run scripts/render-pictures.sh: {committed} is stale"
    )


def test_the_readme_shows_the_architecture_picture():
    assert "](docs/pictures/architecture.svg)" in (ROOT / "README.md").read_text()
