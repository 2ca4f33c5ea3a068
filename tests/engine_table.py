"""docs/engines.md's engine table rendered from the code (protocol/engines/), and its worked example's files."""

from __future__ import annotations

import re
from pathlib import Path

from eagle3_target.protocol.engine_spec import PIPELINE, TENSOR, Engine
from eagle3_target.protocol.engines import engines

DOC = Path(__file__).resolve().parents[1] / "docs" / "engines.md"
# The worked example: a path in backquotes and a colon, then the file's complete text in a python block.
EXAMPLE_FILE = re.compile(r"^`(src/eagle3_target/[\w/]+\.py)`:\n\n```python\n(.*?)```", re.S | re.M)


def yes(value: bool) -> str:
    return "yes" if value else "no"


def table_row(engine: Engine) -> str:
    splits = ", ".join(s for s in (TENSOR, PIPELINE) if engine.can(s)) or "no"
    cells = (
        f"`{engine.name}`",
        splits,
        yes(engine.both_at_once),
        yes(engine.nodes),
        ", ".join(engine.devices),
        f"`{engine.package}`" if engine.package else "none",
        yes(engine.image_text),
        yes(engine.fleet),
    )
    return "| " + " | ".join(cells) + " |"


def code_rows() -> list[str]:
    return [table_row(engine) for engine in engines().values()]


def docs_rows(doc: Path = DOC) -> list[str]:
    return [
        line for line in doc.read_text().splitlines() if re.match(r"\| `\w+` \| (no|tensor|pipeline)", line)
    ]


def example_files(doc: Path = DOC) -> dict[str, str]:
    """The worked example's files by path, as docs/engines.md gives them."""
    return dict(EXAMPLE_FILE.findall(doc.read_text()))
