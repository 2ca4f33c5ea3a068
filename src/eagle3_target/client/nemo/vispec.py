"""NeMo's ViSpec recipes (arXiv:2509.15235) with the fleet as their vision-language target.

Stage 1 (TrainVispecStage1Recipe) is EAGLE-1's training plus a ranking term, on text, against the target's
language model: the fleet sends EAGLE-1's features (eagle1.py's RemoteEagleTarget builds NeMo's batch from
them, ``remote_target.compact`` included). NeMo's setup loads the target with transformers'
AutoModelForImageTextToText and checks that its input embedding looks trained; here it reads the config
only and NeMo's check runs on the embedding fetched from the fleet.
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py) with ``prefetch_depth`` and ``compact``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._imports import nemo_module
from .eagle1 import RemoteEagle1Recipe
from .takeover import ConfigOnlyLoader

_vispec = nemo_module("recipes.llm.train_vispec")


class FetchedEmbeddings:
    """What NeMo's untrained-target check reads of a target: its input embedding, here the fleet's."""

    def __init__(self, target_wrapper):
        self._embedding = target_wrapper.get_input_embeddings()

    def named_parameters(self) -> Iterator:
        return iter(())  # nothing is on the meta device: the trainer holds no target parameters

    def get_input_embeddings(self):
        return self._embedding


@contextlib.contextmanager
def swapped(module, **replacements) -> Iterator[None]:
    """Within: ``module``'s names are ``replacements``; restored after."""
    saved = {name: getattr(module, name) for name in replacements}
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


class TrainVispecStage1Recipe(RemoteEagle1Recipe, _vispec.TrainVispecStage1Recipe):
    """NeMo's TrainVispecStage1Recipe, unchanged but for where the target runs: the eagle3-target fleet."""

    def setup(self):
        checked: list[str] = []  # the target paths NeMo's setup asked to check, checked after the fetch
        with swapped(
            _vispec,
            AutoModelForImageTextToText=ConfigOnlyLoader,
            HFEagleTargetModel=self._fleet_wrapper,
            raise_if_target_not_materialized=lambda _target, path: checked.append(path),
        ):
            super().setup()
        for path in checked:
            _vispec.raise_if_target_not_materialized(FetchedEmbeddings(self.target_wrapper), path)
