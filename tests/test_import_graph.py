"""The import graph of src/ has no circle: static imports (grimp, as lint-imports reads them) and the modules
``importlib.import_module`` loads, each call's targets derived from its argument. A call whose targets this
test cannot derive fails it, so a new dynamic load is either derivable here or given a rule below."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import grimp

ROOT = "eagle3_target"
SRC = Path(__file__).resolve().parents[1] / "src"


def submodules(package: str) -> set[str]:
    module = importlib.import_module(package)
    return {f"{package}.{m.name}" for m in pkgutil.iter_modules(module.__path__)}


def engine_entries() -> set[str]:
    from eagle3_target.protocol.engines import engines

    paths = [getattr(e, f) for e in engines().values() for f in ("load", "load_split", "follow", "rank")]
    return {p.partition(":")[0] for p in paths if p}


def family_adapters() -> set[str]:
    from eagle3_target.client.nemo.registry import families

    return {family.adapter_module for family in families().values()}


def offline_cache_writers() -> set[str]:
    from eagle3_target.client.nemo.registry import families

    caches = [f.offline_cache for f in families().values() if f.offline_cache]
    return {cache.writer.partition(":")[0] for cache in caches}


def commands() -> set[str]:
    from eagle3_target.cli import COMMANDS

    return {entry[0] for entry in COMMANDS.values()}


def client_exports() -> set[str]:
    from eagle3_target.client import _EXPORTS  # noqa: PLC2701 - the lazy exports' own table

    return {importlib.util.resolve_name(name, "eagle3_target.client") for name in set(_EXPORTS.values())}


# (module, the call's arguments as written) -> the modules that call can load
DERIVED = {
    ("eagle3_target.cli", "COMMANDS[name][0]"): commands,
    ("eagle3_target.client", "_EXPORTS[name], __name__"): client_exports,
    ("eagle3_target.client.nemo._imports", "f'nemo_automodel.{name}'"): set,  # outside src/
    ("eagle3_target.client.nemo.registry", "f'{__package__}.families.{name}'"): lambda: submodules(
        "eagle3_target.client.nemo.families"
    ),
    ("eagle3_target.client.nemo.loading", "found[name].adapter_module"): family_adapters,
    # load() imports a "module:function" reference: the offline caches' writers are the ones it is given
    ("eagle3_target.client.nemo.loading", "module"): offline_cache_writers,
    ("eagle3_target.protocol.families", "f'{__name__}.{module.name}'"): lambda: submodules(
        "eagle3_target.protocol.families"
    ),
    ("eagle3_target.protocol.engines", "f'{__name__}.{module.name}'"): lambda: submodules(
        "eagle3_target.protocol.engines"
    ),
    # engine_spec.entry() loads what its callers name: the edges go from them (ENTRY_CALLERS)
    ("eagle3_target.protocol.engine_spec", "module"): set,
}
# Modules that load the engine table's runner modules through engine_spec.entry()
ENTRY_CALLERS = ("eagle3_target.server.runners", "eagle3_target.server.rank_process")


def dynamic_loads(module: str, path: Path) -> tuple[set[str], list[str]]:
    """(modules ``module`` loads by importlib, the calls whose targets are not derivable)."""
    loads, unknown = set(), []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module")):
            continue
        args = ", ".join(ast.unparse(a) for a in node.args)
        if len(node.args) == 1 and isinstance(node.args[0], ast.Constant):
            loads.add(node.args[0].value)
        elif (module, args) in DERIVED:
            loads |= DERIVED[module, args]()
        else:
            unknown.append(f"{module}: import_module({args})")
    return loads, unknown


def module_path(module: str) -> Path:
    base = SRC / module.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    graph = grimp.build_graph(ROOT)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    unknown = []
    for module in graph.modules:
        loads, cannot = dynamic_loads(module, module_path(module))
        edges[module] |= {m for m in loads if m.split(".")[0] == ROOT}
        unknown += cannot
    for caller in ENTRY_CALLERS:
        edges[caller] |= engine_entries()
    return edges, unknown


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_importlib_load_in_src_is_derivable():
    assert import_graph()[1] == []


def test_the_import_graph_of_src_has_no_circle():
    circles = cycles(import_graph()[0])
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_a_circle_through_an_importlib_load_is_found():
    """The check has teeth: a runner that imports the package loading it closes a circle."""
    edges, _ = import_graph()
    edges["eagle3_target.server.runners.hf"].add("eagle3_target.server.runners")
    assert any("eagle3_target.server.runners.hf" in c for c in cycles(edges))
