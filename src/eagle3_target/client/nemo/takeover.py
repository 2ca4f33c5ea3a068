"""Where NeMo's recipes without a remote path or a target hook load their target, swapped during setup().

TrainEagle1Recipe and TrainDSparkRecipe load and wrap the target inside one setup() method: while it runs,
their module's NeMoAutoModelForCausalLM gives a config-only stand-in (the trainer reads the target's
config, never its weights) and their target-wrapper class gives ours.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from transformers import AutoConfig


class ConfigOnlyTarget:
    """What a recipe keeps as ``target_model``: the target's config, no weights."""

    def __init__(self, config):
        self.config = config

    def to(self, *_args, **_kwargs) -> ConfigOnlyTarget:
        return self

    def requires_grad_(self, _flag: bool = True) -> ConfigOnlyTarget:
        return self


class ConfigOnlyLoader:
    @staticmethod
    def from_pretrained(path, *_args, trust_remote_code: bool = False, **_kwargs) -> ConfigOnlyTarget:
        return ConfigOnlyTarget(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))


# One swap at a time: two of our recipes set up at once in threads would otherwise restore each other's
# stand-ins, or NeMo's classes while the other still needs ours.
_SWAP = threading.Lock()


@contextlib.contextmanager
def fleet_target(module, wrapper_name: str, make_wrapper: Callable, **more):
    """Within: ``module``'s NeMoAutoModelForCausalLM loads configs only, ``module.<wrapper_name>(...)``
    is ``make_wrapper(...)`` and each of ``more``'s names is its value."""
    replacements = {"NeMoAutoModelForCausalLM": ConfigOnlyLoader, wrapper_name: make_wrapper, **more}
    with _SWAP:
        saved = {name: getattr(module, name) for name in replacements}
        for name, value in replacements.items():
            setattr(module, name, value)
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(module, name, value)
