"""What a draft family asks of the target, as data: the ``Family`` each module of protocol/families/ defines.
Apart from the package that finds those modules, so that they import it and the package loads them, and no
import runs both ways. Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .features import Features

# (target_layer_ids, num_hidden_layers) -> what one batch asks of the target
Ask = Callable[[Sequence[int], int], Features]


@dataclass(frozen=True)
class Family:
    name: str  # the module's name, here and in client/nemo/
    ask: Ask  # the exact request: the batch as NeMo's co-located target wrapper computes it
    weights: tuple[str, ...]  # fetched once at setup (features.py WEIGHT_NAMES)
    # The compact request where full-vocabulary logits dominate: the post-norm hidden state, the
    # trainer applying the lm_head (weights then include "lm_head"). None: the exact request is small.
    compact: Ask | None = None
