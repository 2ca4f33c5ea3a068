"""Small modules and functions (the guide's standard): no product module over 400 lines, no function over
60 (argparse definitions aside), in the parts listed here."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "eagle3_target"
PARTS = ("client", "protocol", "operator", "server")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def modules(part: str) -> list[Path]:
    return sorted((SRC / part).rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "add_arguments":
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}() is {length} lines")
    return found


@pytest.mark.parametrize("part", PARTS)
def test_modules_and_functions_are_small(part):
    assert modules(part), f"no modules under {SRC / part}"
    too_long = [
        f"{p.relative_to(SRC)} is {n} lines"
        for p in modules(part)
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    too_long += [line for p in modules(part) for line in long_functions(p)]
    assert not too_long, "\n".join(too_long)
