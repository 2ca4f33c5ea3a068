"""Small modules, classes and functions (the guide's standard): no product module over 350 lines, no class over
200, no function over 60 (argparse definitions aside), in the parts listed here."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "eagle3_target"
PARTS = ("client", "protocol", "operator", "server")
MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 350, 200, 60
# Known exceptions, each with the reason it is allowed for now; the entry goes when its split lands.
EXCEPTIONS: dict[str, str] = {}


def modules(part: str) -> list[Path]:
    return sorted((SRC / part).rglob("*.py"))


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
    assert modules(part), f"no modules under {SRC / part}"
    names = [str(p.relative_to(SRC)) for p in modules(part)]
    found = [line for n in names if n not in EXCEPTIONS for line in too_long(n, (SRC / n).read_text())]
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
