"""The Kubernetes quickstarts' commands, read from the docs' own text.

A fenced block belongs to a quickstart when the line before it is `<!-- quickstart NAME -->` (run everywhere),
`<!-- quickstart NAME on GPUs -->` (only with GPUs and internet) or `<!-- quickstart NAME without GPUs -->`
(only without them). docs/deploy.md's table marked `<!-- quickstart substitutions -->` lists what changes
without GPUs or internet, as `` `on GPUs` | `without` `` rows. tests/cluster/test_quickstarts.py runs the
CPU sequence; tests/test_quickstart_docs.py checks the text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools import REPO

DOCS = {
    "eagle3": REPO / "docs" / "deploy.md",
    "dflash": REPO / "docs" / "families.md",
    "vispec": REPO / "docs" / "families.md",  # text only: its stage 2 needs the image pipeline
}
SUBSTITUTIONS_DOC = REPO / "docs" / "deploy.md"
MARK = re.compile(
    r"^<!-- quickstart (\w+)(?: (on GPUs|without GPUs))? -->\n```(\w+)\n(.*?)^```$", re.M | re.S
)


@dataclass(frozen=True)
class Block:
    quickstart: str
    where: str  # "both", "on GPUs" or "without GPUs"
    language: str
    text: str


def blocks(path: Path) -> list[Block]:
    return [
        Block(name, where or "both", language, text)
        for name, where, language, text in MARK.findall(path.read_text())
    ]


def substitutions() -> list[tuple[str, str]]:
    """The (on GPUs, without GPUs) pairs of the table just above the substitutions mark."""
    text = SUBSTITUTIONS_DOC.read_text()
    table = text[: text.index("<!-- quickstart substitutions -->")].rstrip().rsplit("\n\n", 1)[-1]
    return re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", table, re.M)


def cpu_commands(name: str) -> list[str]:
    """The quickstart's bash blocks a machine without GPUs runs, in order, with the table's substitutions."""
    pairs = substitutions()
    commands = []
    for block in blocks(DOCS[name]):
        if block.quickstart != name or block.where == "on GPUs":
            continue
        text = block.text
        for gpu, cpu in pairs:
            text = text.replace(gpu, cpu)
        commands.append(text)
    return commands
