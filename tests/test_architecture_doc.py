"""docs/architecture.md stays true to the tree: every module it names exists, every module and package is named
in it by a path that says which one it is, and every `Class.attribute` and `module.name` it names is defined in
the code."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "eagle3_target"
DOC = ROOT / "docs" / "architecture.md"


def spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def module_names(text: str) -> set[str]:
    """Backticked tokens ending in .py: `service.py`, `p2p/groups.py`, `src/eagle3_target/cli.py`."""
    return {t for span in spans(text) for t in span.split() if re.fullmatch(r"[\w/]+\.py", t)}


def packages() -> list[str]:
    """Every package under src/eagle3_target, relative to it ("" is eagle3_target itself)."""
    return sorted(str(p.parent.relative_to(SRC)).replace(".", "") for p in SRC.rglob("__init__.py"))


def package_named(package: str, text: str) -> bool:
    names = {
        f"src/eagle3_target/{package}/".replace("//", "/"),
        *((package, f"{package}/") if package else ()),
    }
    return any(span in names or span.startswith("src/eagle3_target/" + package) for span in spans(text))


class Code:
    """What the source defines: each class's attributes and bases, and each module's top-level names."""

    def __init__(self, root: Path = SRC):
        self.attributes: dict[str, set[str]] = defaultdict(set)
        self.bases: dict[str, list[str]] = defaultdict(list)
        self.module_names: dict[str, set[str]] = defaultdict(set)
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text())
            self.module_names[path.stem] |= {n for node in tree.body for n in _defined(node)}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.bases[node.name] += [b.id if isinstance(b, ast.Name) else "?" for b in node.bases]
                    self.attributes[node.name] |= {n for item in node.body for n in _defined(item)}
                    self.attributes[node.name] |= {
                        t.attr
                        for sub in ast.walk(node)
                        if isinstance(sub, (ast.Assign, ast.AnnAssign))
                        for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
                        if isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    }

    def has(self, cls: str, attribute: str) -> bool:
        """True when ``cls`` or a base defines ``attribute``, or a base lies outside this code (unknowable)."""
        if attribute in self.attributes[cls]:
            return True
        return any(b not in self.attributes or self.has(b, attribute) for b in self.bases[cls])


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
    )
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def dotted_names(text: str) -> list[tuple[str, str]]:
    """(owner, name) for each backticked `Owner.name` or `module.name`, calls and paths around them cut."""
    found = []
    for span in spans(text):
        match = re.fullmatch(r"(?:[\w/]+/)?(\w+)\.(\w+)(?:\(.*\))?", span)
        if match and not span.endswith(".py") and not span.endswith(".md"):
            found.append((match[1], match[2]))
    return found


def unknown_names(text: str, code: Code) -> list[str]:
    wrong = []
    for owner, name in dotted_names(text):
        if (
            owner in code.attributes
            and not code.has(owner, name)
            or owner not in code.attributes
            and owner in code.module_names
            and name not in code.module_names[owner]
        ):
            wrong.append(f"{owner}.{name}")
    return wrong


def test_every_module_named_exists():
    modules = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")}
    absent = sorted(
        name
        for name in module_names(DOC.read_text())
        if not any(m == name.removeprefix("src/eagle3_target/") or m.endswith("/" + name) for m in modules)
    )
    assert not absent, f"docs/architecture.md names modules that do not exist: {absent}"


def product_modules() -> list[str]:
    """Every module under src/eagle3_target relative to it, package __init__.py files aside."""
    return sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name != "__init__.py")


def named_modules(text: str, modules: list[str]) -> set[str]:
    """The modules the text names unambiguously: by their path from src/eagle3_target/ (or with that
    prefix), or by a shorter tail of it that no other module's path ends in (`runners/hf.py`, not `cli.py`)."""
    found = set()
    for token in module_names(text):
        if token.startswith("src/eagle3_target/"):
            exact = token.removeprefix("src/eagle3_target/")
            found |= {exact} & set(modules)
            continue
        matches = [m for m in modules if m == token or m.endswith("/" + token)]
        if len(matches) == 1:
            found.add(matches[0])
    return found


def test_every_module_is_named_by_a_path_that_says_which_one():
    modules = product_modules()
    missing = sorted(set(modules) - named_modules(DOC.read_text(), modules))
    assert not missing, f"docs/architecture.md names no path that is only these modules': {missing}"


def test_every_package_is_named():
    text = DOC.read_text()
    missing = [p or "eagle3_target" for p in packages() if not package_named(p, text)]
    assert not missing, f"docs/architecture.md does not name these packages: {missing}"


def test_every_class_attribute_and_module_name_named_is_defined():
    wrong = unknown_names(DOC.read_text(), Code())
    assert not wrong, f"docs/architecture.md names what the code does not define: {wrong}"


def test_the_checks_catch_a_stale_name_module_and_package():
    code = Code()
    assert unknown_names("`ServerConnection.lm_head`, `ServerConnection.post`", code) == [
        "ServerConnection.lm_head"
    ]
    assert unknown_names("`process.listen`, `process.nothing_here`", code) == ["process.nothing_here"]
    assert module_names("see `server/gone.py` and `p2p/groups.py`") == {"server/gone.py", "p2p/groups.py"}
    assert named_modules("`cli.py`, `server/cli.py`", ["cli.py", "server/cli.py", "operator/cli.py"]) == {
        "server/cli.py"
    }
    assert named_modules("`src/eagle3_target/cli.py`", ["cli.py", "server/cli.py"]) == {"cli.py"}
    assert not package_named("client/nemo", "only `client/` here")
    assert package_named("client/nemo", "`client/nemo/` here")
