"""What a family runs, imported when it runs: the adapter module that defines a recipe class (with the
NeMo recipe it subclasses) and an offline cache's writer. registry.py names them; nothing that an adapter
imports imports this module, so no import, static or through importlib, runs back here.
"""

from __future__ import annotations

import importlib

from .registry import recipes, unknown_recipe


def load(reference: str):
    """``package.module:attribute``, imported now."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def recipe_class(name: str) -> type:
    """Our remote subclass of NeMo's recipe ``name``, from its family's adapter; ValueError naming the
    recipes there are."""
    found = recipes()
    if name not in found:
        raise unknown_recipe(name)
    return getattr(importlib.import_module(found[name].adapter_module), name)


def offline_cache_writer(family_name: str):
    """The function that writes the family's NeMo offline cache (OfflineCache.writer)."""
    from .registry import offline_caches

    return load(offline_caches()[family_name].offline_cache.writer)
