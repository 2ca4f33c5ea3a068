"""The committed pictures are what their sources render: Graphviz sources by scripts/render-pictures.sh, the
benchmark plots by docs/pictures/bench_plots.py, the dashboard by docs/pictures/dashboard.py (a live run)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
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


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_the_benchmark_plots_are_redrawn_by_their_script(tmp_path):
    """The numbers drawn are the docs' numbers now (the PNG's "Data" text), and where the same matplotlib drew
    the committed picture, so are the pixels."""
    from PIL import Image

    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "pictures" / "bench_plots.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    drawn = sorted(p.name for p in tmp_path.glob("*.png"))
    assert drawn == ["client-scaling.png", "encodings.png"]
    for name in drawn:
        stale = f"run python docs/pictures/bench_plots.py: docs/pictures/{name} is stale"
        assert png_size(tmp_path / name) == png_size(ROOT / "docs" / "pictures" / name), name
        with Image.open(tmp_path / name) as new, Image.open(ROOT / "docs" / "pictures" / name) as committed:
            assert new.text["Data"] == committed.text.get("Data"), stale
            if new.text["Software"] == committed.text["Software"]:
                assert new.tobytes() == committed.tobytes(), stale


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dashboard_picture_is_redrawn_from_a_live_run(tmp_path):
    if shutil.which("prometheus") is None:
        missing(
            "prometheus is not on PATH",
            "apt-get install prometheus, Debian's package; .ci/prometheus does it in CI",
        )
    out = tmp_path / "dashboard.png"
    script = ROOT / "docs" / "pictures" / "dashboard.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out), "--seconds", "4"],
        capture_output=True,
        text=True,
        timeout=540,
        # Started with SIGINT ignored, as in a full CI run: its benches must still stop on their Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert png_size(out) == png_size(ROOT / "docs" / "pictures" / "dashboard.png")


def test_the_readme_shows_the_architecture_picture():
    assert "](docs/pictures/architecture.svg)" in (ROOT / "README.md").read_text()
