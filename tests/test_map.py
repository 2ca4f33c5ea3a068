"""tests/MAP.md stays true: every module under src/eagle3_target is listed once, and every test file it names
exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "eagle3_target"
MAP = ROOT / "tests" / "MAP.md"


def rows(text: str) -> list[tuple[str, list[str]]]:
    """(module, [test file, ...]) for each table row."""
    found = []
    for line in text.splitlines():
        match = re.fullmatch(r"\| `([\w/]+\.py)` \| (.*) \|", line)
        if match:
            found.append((match[1], re.findall(r"`([^`]+)`", match[2])))
    return found


def modules() -> list[str]:
    return sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name != "__init__.py")


def test_every_module_is_listed_once():
    listed = [module for module, _ in rows(MAP.read_text())]
    assert sorted(set(listed)) == sorted(listed), "a module is listed twice"
    assert set(listed) == set(modules()), {
        "not listed": sorted(set(modules()) - set(listed)),
        "not a module": sorted(set(listed) - set(modules())),
    }


def test_every_listed_test_exists_and_each_module_has_one():
    table = rows(MAP.read_text())
    assert all(tests for _, tests in table), [m for m, tests in table if not tests]
    absent = sorted({t for _, tests in table for t in tests if not (ROOT / t).is_file()})
    assert not absent, f"tests/MAP.md names test files that do not exist: {absent}"


def test_rows_are_read_as_written():
    assert rows("| `server/app.py` | `tests/server/test_endpoints.py`, `tests/x.py` |\n| other |") == [
        ("server/app.py", ["tests/server/test_endpoints.py", "tests/x.py"])
    ]


def mutation_modules() -> list[str]:
    return re.search(r"^ORDER=\((.*?)\)", (ROOT / "scripts" / "mutation.sh").read_text(), re.S | re.M)[
        1
    ].split()


def test_mutation_testing_lists_real_modules_and_the_weekly_job_and_table_follow_it():
    """scripts/mutation.sh's modules exist, each has its tests, the weekly workflow runs each, and
    docs/testing.md's table has a row for each."""
    script = (ROOT / "scripts" / "mutation.sh").read_text()
    order = mutation_modules()
    assert all((SRC / m).exists() for m in order), [m for m in order if not (SRC / m).exists()]
    assert all(f"[{m}]=" in script for m in order), [m for m in order if f"[{m}]=" not in script]
    workflow = (ROOT / ".github" / "workflows" / "mutation.yaml").read_text()
    assert re.findall(r"^          - (\S+)$", workflow, re.M) == order
    table = (ROOT / "docs" / "testing.md").read_text()
    assert [m for m in order if f"`{m}`" not in table] == []
