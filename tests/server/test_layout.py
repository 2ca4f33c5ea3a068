"""The server stays small enough to read: no module over 400 lines, no function over 60 (argparse
definitions aside), and the service knows nothing of HTTP."""

import ast
import pathlib
import subprocess
import sys

import eagle3_target.server

SERVER = pathlib.Path(eagle3_target.server.__file__).parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules():
    return sorted(SERVER.rglob("*.py"))


def _is_argparse_definition(node: ast.AST) -> bool:
    return node.name == "add_arguments" or node.name.endswith("_arguments")


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(SERVER)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long


def test_no_function_is_over_60_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_argparse_definition(node):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(SERVER)}:{node.name}"] = lines
    assert not long, long


def test_serve_flags_are_parsed_before_any_heavy_import():
    code = (
        "import sys, argparse; from eagle3_target.server import cli; cli.add_arguments(argparse.ArgumentParser()); "
        "print(sorted(m for m in ('torch', 'aiohttp', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
