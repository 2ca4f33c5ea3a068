"""Prefetch for recipes whose loops ask for each batch's target features only when they reach the batch
(NeMo's DFlash family): the train and validation loaders, wrapped, submit the next batches as they hand one
out, and the target wrapper takes their replies in the same order."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import torch

from ..backend import RemoteTargetBackend
from ..inputs import BatchInputs, batch_inputs


class PrefetchedBatches:
    """Requests in flight for batches the loop has not reached yet, oldest first.

    ``depth``: at most this many requests ahead of the batch being trained on; default and cap: what
    the healthy servers take at once (servers x max_in_flight), as NeMo caps EAGLE-3's prefetch.
    """

    def __init__(self, backend: RemoteTargetBackend, depth: int | None = None):
        self.backend = backend
        self.depth = depth
        self._waiting: collections.deque = collections.deque()  # (input_ids on the CPU, handle)

    def limit(self) -> int:
        capacity = max(1, self.backend.healthy_servers * self.backend.pool.options.max_in_flight)
        return capacity if self.depth is None else min(self.depth, capacity)

    def submit(self, batch: dict[str, torch.Tensor]) -> None:
        handle = self.backend.capture_async(batch_inputs(batch))
        self._waiting.append((batch["input_ids"], handle))

    def take(self, inputs: BatchInputs) -> dict:
        """The reply for this batch: the oldest request when it is this batch's, else asked now."""
        if self._waiting and torch.equal(self._waiting[0][0], inputs.input_ids.detach().cpu()):
            return self._waiting.popleft()[1].result()
        self.cancel()  # the loop left the loader's order (a validation batch, or an interrupted epoch)
        return self.backend.capture(inputs)

    def cancel(self) -> None:
        while self._waiting:
            self._waiting.popleft()[1].cancel()

    def wrap_loaders(self, recipe) -> None:
        """NeMo's loops ask for each batch's target features as they reach it: the recipe's train and
        validation loaders submit the next ones ahead, in the order the loops will ask."""
        recipe.train_dataloader = PrefetchingLoader(recipe.train_dataloader, self)
        if recipe.val_dataloader is not None:
            recipe.val_dataloader = PrefetchingLoader(recipe.val_dataloader, self)


class PrefetchingLoader:
    """The recipe's train loader, unchanged to the recipe (len, sampler, ...), submitting ahead."""

    def __init__(self, loader, prefetched: PrefetchedBatches):
        self.loader = loader
        self.prefetched = prefetched

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self.prefetched.cancel()
        ahead: collections.deque = collections.deque()
        for batch in self.loader:
            self.prefetched.submit(batch)
            ahead.append(batch)
            while len(ahead) > self.prefetched.limit():
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()
