"""client/nemo/hooks.py against the installed NeMo AutoModel: each private hook the adapters override or call
has the parameters listed there, each name a takeover swaps is there, and every private NeMo method or
function an adapter overrides or calls is listed. A NeMo upgrade that moves one fails here, naming it."""

from __future__ import annotations

import ast
import importlib
import inspect
from importlib.metadata import version

from eagle3_target.client.nemo import hooks, loading, registry

NEMO = f"NeMo AutoModel {version('nemo-automodel')}"


def resolve(key: str):
    """``module:Qualified.name`` under nemo_automodel, or None where the installed NeMo has no such name."""
    module, _, path = key.partition(":")
    found = importlib.import_module(f"nemo_automodel.{module}")
    for part in path.split("."):
        found = getattr(found, part, None)
    return found


def parameters(function) -> str:
    """The signature without annotations: the names, kinds and defaults an override or a call relies on."""
    signature = inspect.signature(function)
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def test_each_private_hook_has_the_parameters_the_adapters_expect():
    changed = []
    for key, expected in hooks.PRIVATE_HOOKS.items():
        found = resolve(key)
        if found is None:
            changed.append(f"{key}: gone")
        elif (now := parameters(found)) != expected:
            changed.append(f"{key}: {now}, the adapters expect {expected}")
    assert not changed, f"{NEMO} changed what client/nemo/hooks.py lists:\n" + "\n".join(changed)


def test_each_name_a_takeover_swaps_is_there():
    gone = [
        f"{m}:{n}" for m, names in hooks.SWAPPED_NAMES.items() for n in names if resolve(f"{m}:{n}") is None
    ]
    assert not gone, f"{NEMO} lacks names the takeovers swap (client/nemo/hooks.py): {gone}"


def overridden(recipe: type) -> set[str]:
    """``module:Class.name`` for each private method our classes in ``recipe``'s bases define over NeMo's."""
    nemo = next(c for c in recipe.__mro__ if c.__module__.startswith("nemo_automodel."))
    ours = [c for c in recipe.__mro__ if c.__module__.startswith("eagle3_target.")]
    names = {n for c in ours for n in vars(c) if n.startswith("_") and not n.startswith("__")}
    module = nemo.__module__.removeprefix("nemo_automodel.")
    return {f"{module}:{nemo.__name__}.{n}" for n in names if hasattr(nemo, n)}


def called(adapter: str) -> set[str]:
    """``module:_name`` for each private NeMo function the adapter module calls through ``nemo_module``."""
    tree = ast.parse(inspect.getsource(importlib.import_module(adapter)))
    modules = {
        node.targets[0].id: node.value.args[0].value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "nemo_module"
    }
    return {
        f"{modules[node.value.id]}:{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and node.attr.startswith("_")
    }


def test_every_private_method_and_function_an_adapter_uses_is_listed():
    used = set()
    for recipe, family in registry.recipes().items():
        used |= overridden(loading.recipe_class(recipe)) | called(family.adapter_module)
    assert used, "no adapter overrides a private NeMo hook: the check finds nothing"
    assert not used - set(hooks.PRIVATE_HOOKS), (
        f"list these in client/nemo/hooks.py: {sorted(used - set(hooks.PRIVATE_HOOKS))}"
    )
    assert not set(hooks.PRIVATE_HOOKS) - used, (
        f"no adapter uses these any more: {set(hooks.PRIVATE_HOOKS) - used}"
    )
