"""NeMo's target-wrapper call as its recipes make it, for the trainer's one fleet target, `FleetTarget`
(fleet_target.py), whose family subclass turns one `BatchInputs` into NeMo's batch."""

from __future__ import annotations

import torch

from ..inputs import BatchInputs, nemo_inputs

__all__ = ["BatchInputs", "NeMoTarget"]


class NeMoTarget:
    """Mixed in first: NeMo's ``generate_batch`` (client/inputs.py's nemo_inputs has its signature)."""

    @torch.no_grad()
    def generate_batch(self, *args, **kwargs):
        return self.batch(nemo_inputs(*args, **kwargs))

    def batch(self, inputs: BatchInputs):
        raise NotImplementedError(f"{type(self).__name__} builds no batch")

    @property
    def supports_async(self) -> bool:
        return True
