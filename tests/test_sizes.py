"""Small modules, classes and functions (the guide's standard): no module over 350 lines, no class over 200, no
function over 60 (argparse definitions aside), in the product's parts and in bench/; and at most three
``# fmt: skip`` markers in the repository, each saying why."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "eagle3_target"
PARTS = {part: SRC / part for part in ("client", "protocol", "operator", "server")} | {
    "bench": ROOT / "bench"
}
MAX_FMT_SKIPS = 3
# a marker ruff still honours, followed by its reason: `# fmt: skip # why: ...`
FMT_SKIP, FMT_SKIP_WITH_REASON = "fmt: skip", re.compile(r"# fmt: skip # why: \S")
MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 350, 200, 60
# Known exceptions, each with the reason it is allowed for now; the entry goes when its split lands.
EXCEPTIONS: dict[str, str] = {}


def modules(part: str) -> list[Path]:
    return sorted(PARTS[part].rglob("*.py"))


def named(path: Path) -> str:
    """A product module relative to src/eagle3_target/ (as EXCEPTIONS names it), a bench one as bench/x.py."""
    return str(path.relative_to(SRC if path.is_relative_to(SRC) else ROOT))


def too_long(name: str, text: str) -> list[str]:
    """The module ``name`` itself, each class and each function in ``text`` that is over its limit."""
    found = []
    if (n := len(text.splitlines())) > MAX_MODULE_LINES:
        found.append(f"{name} is {n} lines")
    for node in ast.walk(ast.parse(text)):
        length = (node.end_lineno - node.lineno + 1) if hasattr(node, "end_lineno") else 0
        if isinstance(node, ast.ClassDef) and length > MAX_CLASS_LINES:
            found.append(f"{name}:{node.lineno} class {node.name} is {length} lines")
        is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if is_function and node.name != "add_arguments" and length > MAX_FUNCTION_LINES:
            found.append(f"{name}:{node.lineno} {node.name}() is {length} lines")
    return found


@pytest.mark.parametrize("part", PARTS)
def test_modules_classes_and_functions_are_small(part):
    assert modules(part), f"no modules under {PARTS[part]}"
    paths = [p for p in modules(part) if named(p) not in EXCEPTIONS]
    found = [line for p in paths for line in too_long(named(p), p.read_text())]
    assert not found, "\n".join(found)


def test_every_exception_is_still_needed():
    """An exception whose module is gone or small again is dropped, so the list never hides a new one."""
    stale = [n for n in EXCEPTIONS if not (SRC / n).exists() or not too_long(n, (SRC / n).read_text())]
    assert not stale, f"no longer over a limit, drop from EXCEPTIONS: {stale}"


def test_the_checks_see_a_long_module_class_and_function():
    fields = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    steps = "\n".join(f"    y{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    text = f"class C:\n{fields}\n\n\ndef f():\n{steps}\n" + "#\n" * MAX_MODULE_LINES
    found = too_long("probe.py", text)
    assert found == [
        f"probe.py is {MAX_CLASS_LINES + MAX_FUNCTION_LINES + 4 + MAX_MODULE_LINES} lines",
        f"probe.py:1 class C is {MAX_CLASS_LINES + 1} lines",
        f"probe.py:{MAX_CLASS_LINES + 4} f() is {MAX_FUNCTION_LINES + 1} lines",
    ]
    assert too_long("probe.py", "class C:\n" + "\n".join(fields.splitlines()[:-1]) + "\n") == []


def fmt_skips() -> list[tuple[str, str]]:
    """(path:line, line) for each line of a tracked Python file that carries the marker."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [
        (f"{name}:{number}", line)
        for name in files.stdout.split()
        if (ROOT / name).is_file()
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if "# " + FMT_SKIP in line and name != "tests/test_sizes.py"
    ]


def test_few_fmt_skip_markers_and_each_says_why():
    found = fmt_skips()
    assert len(found) <= MAX_FMT_SKIPS, (
        f"{len(found)} `# fmt: skip` markers, at most {MAX_FMT_SKIPS}: {found}"
    )
    unexplained = [where for where, line in found if not FMT_SKIP_WITH_REASON.search(line)]
    assert not unexplained, f"a `# fmt: skip` without `# why: ...` after it: {unexplained}"
