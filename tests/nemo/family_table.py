"""The table of docs/families.md, rendered from the families' code (client/nemo/registry.py), and the
worked example's three files, which its table shows applied. Run as a module, it writes the table:

    PYTHONPATH=src python -m tests.nemo.family_table
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"
EXAMPLE_LAYERS, EXAMPLE_DEPTH = (1, 4, 7), 8  # the docs table shows each request for these


def table_row(found) -> str:
    request = found.request
    cells = [
        found.name,
        found.recipe_label,
        f"`{request.ask(EXAMPLE_LAYERS, EXAMPLE_DEPTH).to_header()}`",
        ", ".join(request.weights),
        "-" if request.compact is None else f"`{request.compact(EXAMPLE_LAYERS, EXAMPLE_DEPTH).to_header()}`",
        f"`{found.replaces}`",
        "yes" if found.offline_cache is not None else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def table_rows(families: dict) -> list[str]:
    return [table_row(families[name]) for name in sorted(families)]


def docs_rows(doc: Path = DOC) -> list[str]:
    return [line for line in doc.read_text().splitlines() if re.match(r"\| \w+ \| `", line)]


# The worked example: a path in backquotes and a colon, then the file's complete text in a python block.
EXAMPLE_FILE = re.compile(r"^`(src/eagle3_target/[\w/]+\.py)`:\n\n```python\n(.*?)```", re.S | re.M)


def example_files(doc: Path = DOC) -> dict[str, str]:
    """The worked example's files by path, as docs/families.md gives them."""
    return dict(EXAMPLE_FILE.findall(doc.read_text()))


@contextlib.contextmanager
def example_applied(folder: Path):
    """The worked example's modules found beside the real ones (their packages' search paths extended by
    ``folder``), the families found again on the way in and out."""
    import eagle3_target.client.nemo as trainer
    import eagle3_target.client.nemo.families as declared
    import eagle3_target.protocol.families as protocol
    from eagle3_target.client.nemo import registry

    packages = {
        "src/eagle3_target/protocol/families": protocol,
        "src/eagle3_target/client/nemo/families": declared,
        "src/eagle3_target/client/nemo": trainer,
    }
    saved = {package: list(package.__path__) for package in packages.values()}
    added = []
    for path, text in example_files().items():
        package = packages[str(Path(path).parent)]
        target = folder / package.__name__ / Path(path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        package.__path__.append(str(target.parent))
        added.append(f"{package.__name__}.{Path(path).stem}")
    protocol.families.cache_clear(), registry.families.cache_clear()
    try:
        yield
    finally:
        for package, path in saved.items():
            package.__path__[:] = path
        for name in added:
            sys.modules.pop(name, None)
        protocol.families.cache_clear(), registry.families.cache_clear()


def write_table(doc: Path = DOC) -> None:
    """docs/families.md with its table's rows rendered from the code, the worked example applied."""
    from eagle3_target.client.nemo.registry import families

    with tempfile.TemporaryDirectory() as folder, example_applied(Path(folder)):
        rows = table_rows(families())
    lines, old = doc.read_text().splitlines(), docs_rows(doc)
    first = lines.index(old[0])
    assert lines[first : first + len(old)] == old, "the table's rows are not one block"
    doc.write_text("\n".join([*lines[:first], *rows, *lines[first + len(old) :]]) + "\n")


if __name__ == "__main__":
    write_table()
