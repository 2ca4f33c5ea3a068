"""The ``recipe_args:`` a recipe reads, found in NeMo's own code (and ours), so a misspelt key or a value of the
wrong kind is one line before NeMo starts, not a traceback minutes into setup.

NeMo's recipes keep no schema: they read ``recipe_cfg.get("key", default)`` and ``recipe_cfg.key`` wherever they
need a setting. The keys are those reads, taken from the source of every class in the recipe's MRO that is
NeMo's or ours; a key's kind is that of a literal default, of an ``int(...)``/``float(...)`` around the read, or
of the annotated parameter the read is passed to. Only what is surely wrong is refused: a key that reads like
a known one (``seq_lenght``), or a non-numeric string for a numeric setting. Any other unknown key may be read
by code this scan does not see, so it gets a warning and is left to NeMo.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import logging
import sys
import typing
from functools import cache
from typing import Any

log = logging.getLogger(__name__)
READERS = ("recipe_cfg", "recipe_args")  # the names NeMo's recipes (and ours) give the section
NUMERIC = {int: "an integer", float: "a number"}


@cache
def known_settings(recipe_class: type) -> dict[str, type | None]:
    """Every recipe_args key the recipe's code reads, with its kind where the code says one."""
    found: dict[str, type | None] = {}
    for cls in recipe_class.__mro__:
        module = sys.modules.get(cls.__module__)
        if module is None or not cls.__module__.startswith(("nemo_automodel.", "eagle3_target.")):
            continue
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError, SyntaxError):
            continue
        for key, kind in _reads(tree, vars(module)):
            if found.get(key) is None:
                found[key] = kind
    return found


def _key_of(node: ast.AST) -> str | None:
    """The key ``node`` reads from the section: ``recipe_cfg.get("k", ...)`` or ``recipe_cfg.k``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        owner, args = node.func.value, node.args
        if isinstance(owner, ast.Name) and owner.id in READERS and args and isinstance(args[0], ast.Constant):
            return args[0].value if isinstance(args[0].value, str) else None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in READERS:
        return None if node.attr.startswith("_") or node.attr in ("get", "to_dict") else node.attr
    return None


def _reads(tree: ast.AST, names: dict[str, Any]):
    for node in ast.walk(tree):
        key = _key_of(node)
        if key is not None:
            default = node.args[1] if isinstance(node, ast.Call) and len(node.args) > 1 else None
            value = default.value if isinstance(default, ast.Constant) else None
            yield key, type(value) if type(value) in NUMERIC else None
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id in ("int", "float") and node.args and (key := _key_of(node.args[0])) is not None:
            yield key, int if node.func.id == "int" else float
        for keyword in node.keywords:
            if keyword.arg and (key := _key_of(keyword.value)) is not None:
                yield key, _annotation(names.get(node.func.id), keyword.arg)


def _annotation(function: Any, parameter: str) -> type | None:
    """The numeric type ``function`` declares for ``parameter`` (None where it declares none)."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 -- not a function, or hints that do not resolve: no kind known
        return None
    hint = hints.get(parameter)
    return hint if hint in NUMERIC else None


def check_recipe_args(recipe_class: type, recipe_args: dict[str, Any] | None) -> None:
    """Raise ValueError (one line) for a misspelt recipe_args key or a non-numeric string for a numeric one."""
    known = known_settings(recipe_class)
    if not known:
        return  # a recipe whose code we cannot read: NeMo judges it
    name = recipe_class.__name__
    for key, value in (recipe_args or {}).items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
            if close:
                raise ValueError(f"recipe_args.{key}: {name} has no such setting; did you mean {close[0]}?")
            log.warning("recipe_args.%s is not a setting %s's code reads; passing it on to NeMo", key, name)
            continue
        kind = known[key]
        if kind in NUMERIC and isinstance(value, str):
            try:
                kind(value)
            except ValueError:
                raise ValueError(f"recipe_args.{key}={value!r}: {name} takes {NUMERIC[kind]}") from None
