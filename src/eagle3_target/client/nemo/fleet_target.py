"""The fleet as NeMo's co-located target wrapper, for every family whose batch is built from a capture.

A family asks the fleet for the target features its trainer consumes (decoder-layer outputs, the post-norm
last hidden state, full-vocabulary logits) and fetches once per job, at setup, the target weights it copies
or applies on the trainer (its family's ``weights``, however many ranks run; ranks.py). What NeMo's
co-located wrapper derives from those (left shifts, concatenations, the lm_head matmul) is done here on the
trainer's device with the same ops, so a batch is bit-identical to NeMo's when the fleet's forward is.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from eagle3_target.protocol.families import Family
from eagle3_target.protocol.features import KEY_FINAL, WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD

from ..backend import RemoteTargetBackend
from ..handles import MappedHandle
from ..inputs import image_media
from .interface import BatchInputs, NeMoTarget
from .prefetch import PrefetchedBatches
from .ranks import fetched_weights
from .remote import RemoteTargetSettings, split_options

# What NeMo's packed dataloader adds to a batch and its targets take
PACKING_BATCH_KEYS = ("position_ids", "seq_lens", "doc_remaining")


class FleetMismatchError(ValueError):
    """The fleet serves something this recipe cannot train against; one line says what to change."""


def one_time_weights(family: Family, compact: bool) -> tuple[str, ...]:
    """The weights a family's trainer reads: those it declares, and the lm_head a compact request applies."""
    extra = (WEIGHT_LM_HEAD,) if compact and WEIGHT_LM_HEAD not in family.weights else ()
    return family.weights + extra


def check_dtype(draft_dtype: torch.dtype | None, model_info: dict[str, Any]) -> None:
    """The draft computes on the fleet's tensors as they come: the two dtypes must agree (a server that
    does not say its dtype, or a recipe that has none yet, is not checked)."""
    fleet, draft = model_info.get("dtype"), str(draft_dtype).removeprefix("torch.")
    if fleet and draft_dtype is not None and fleet != draft:
        raise FleetMismatchError(
            f"draft {draft}, fleet {fleet}: serve the target with --dtype {draft}, or train where the draft's "
            f"dtype is {fleet} (NeMo's recipes compute in bfloat16 on a GPU, float32 on the CPU)"
        )


def open_backend(
    family: Family,
    device: torch.device | None,
    settings: RemoteTargetSettings,
    layers: Sequence[int] | None = (),
    num_layers: int = 0,
    draft_dtype: torch.dtype | None = None,
    fetch_weights: bool = True,
    check_info: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[RemoteTargetBackend, dict[str, torch.Tensor]]:
    """RemoteTargetBackend asking the fleet for what ``family`` asks (its compact request if the settings
    say so) of ``layers``, or, with None, of each server's own aux layers (EAGLE-3, as NeMo's remote target
    takes them), once every server that discovery found has joined (or failed to); its dtype checked against
    ``draft_dtype``, and its /model_info by ``check_info`` (the recipe's target, target_check.py), both before
    any weight is fetched; and (``fetch_weights``) the family's one-time weights on ``device``, fetched once per
    job however many ranks run."""
    pool, backend_kwargs = split_options(settings.client_options)
    backend_kwargs.setdefault("device", device)
    ask = family.compact if settings.compact else family.ask
    features = (
        ask(layers, num_layers)
        if layers is not None
        else lambda info: ask(info.aux_layer_ids, info.num_hidden_layers)
    )
    started = time.monotonic()
    backend = RemoteTargetBackend(
        settings.endpoints, auth_token=settings.auth_token, options=pool, features=features, **backend_kwargs
    )
    try:
        if settings.wait_timeout:
            backend.wait_for_servers(settings.wait_left(started))
        if draft_dtype is not None:
            check_dtype(draft_dtype, backend.model_info())
        if check_info is not None:
            check_info(backend.model_info())
        if not fetch_weights:
            return backend, {}
        names = one_time_weights(family, settings.compact)
        return backend, fetched_weights(backend, names, device or torch.device("cpu"))
    except BaseException:
        backend.close()
        raise


class FleetTarget(NeMoTarget):
    """NeMo's target-wrapper surface over RemoteTargetBackend's feature capture.

    A family subclass builds NeMo's batch from the captured tensors and the batch's inputs (``to_batch``).
    ``generate_batch`` (interface.py) takes replies that a PrefetchingLoader asked for ahead (prefetch.py),
    in the loop's order; ``generate_batch_async`` is for NeMo's own EAGLE-3 prefetch loop.
    """

    def __init__(
        self,
        backend: RemoteTargetBackend,
        weights: dict[str, torch.Tensor],
        device: torch.device | None,
        settings: RemoteTargetSettings,
        target_layer_ids: Sequence[int] | None = (),
        num_layers: int = 0,
    ):
        self.backend = backend
        self.device = device  # None: each batch where its input_ids are
        self.compact = settings.compact  # the reply has the final hidden state; the logits are computed here
        self.prefetched = PrefetchedBatches(backend, settings.prefetch_depth)
        self.target_layer_ids = list(target_layer_ids or ())  # NeMo saves them (DFlash's dflash_meta.pt)
        self.num_layers = num_layers
        self._weights = weights  # open_backend's, fetched at setup on every rank alike
        self._modules: dict[str, torch.nn.Module] = {}
        self._noted: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs):
        raise NotImplementedError(f"{type(self).__name__} builds no batch")

    # -- weights, fetched once per job onto the trainer's device at setup ----------------------

    def weight(self, name: str) -> torch.Tensor:
        # Never fetched here, later: under torchrun a fetch is a collective every rank must join at once.
        if name not in self._weights:
            raise KeyError(
                f"target weight {name!r} is not one this family fetches ({', '.join(self._weights)})"
            )
        return self._weights[name]

    def get_input_embeddings(self) -> torch.nn.Embedding:
        if "embeddings" not in self._modules:
            weight = self.weight(WEIGHT_INPUT_EMBEDDINGS)
            self._modules["embeddings"] = torch.nn.Embedding.from_pretrained(weight, freeze=True)
        return self._modules["embeddings"]

    def get_output_embeddings(self) -> torch.nn.Linear:
        if "lm_head" not in self._modules:
            weight = self.weight(WEIGHT_LM_HEAD)
            # on the meta device, then the fetched weight: a Linear's own init would draw from torch's global
            # RNG, which NeMo's recipes draw the draft's initial weights from next
            head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
            head.weight = torch.nn.Parameter(weight, requires_grad=False)
            self._modules["lm_head"] = head
        return self._modules["lm_head"]

    get_lm_head = get_output_embeddings  # EAGLE-1/2's name for it

    def logits(self, captured: dict[str, torch.Tensor]) -> torch.Tensor:
        """The full-vocabulary logits: sent by the fleet, or (compact) the target's final product applied
        here to the post-norm hidden state it sent."""
        return self.get_lm_head()(captured[KEY_FINAL]) if self.compact else captured["logits"]

    # -- batches --------------------------------------------------------------------------------

    def batch(self, inputs: BatchInputs):
        """The reply a PrefetchingLoader asked for ahead (or, out of the loader's order, asked now)."""
        captured = self.prefetched.take(dataclasses.replace(inputs, media=image_media(inputs.media)))
        return self.to_batch(self._on_device(captured), inputs)

    def generate_batch_async(self, input_ids, attention_mask, loss_mask) -> MappedHandle:
        """For NeMo's EAGLE-3 prefetch loop (EAGLE-3, P-EAGLE), which passes these three only; a packed batch's
        metadata comes from ``noting_packing``."""
        inputs = BatchInputs(input_ids, attention_mask, loss_mask)
        if self._noted is not None and self._noted[0] is input_ids:
            inputs = dataclasses.replace(inputs, **self._noted[1])
        handle = self.backend.capture_async(inputs)
        return MappedHandle(handle, lambda captured: self.to_batch(self._on_device(captured), inputs))

    def noting_packing(self, batches: Iterable[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
        """NeMo's dataloader batches, each packed one's metadata noted under its input_ids: NeMo's prefetch
        loop hands generate_batch_async only input_ids, attention_mask and loss_mask, right after each batch."""
        for batch in batches:
            if "seq_lens" in batch:
                self._noted = (batch["input_ids"], {k: batch[k] for k in PACKING_BATCH_KEYS})
            yield batch

    def _on_device(self, captured: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.device is None:
            return captured
        return {k: v.to(self.device, non_blocking=True) for k, v in captured.items()}

    # -- the rest of NeMo's backend surface ---------------------------------------------------

    @property
    def num_remote_servers(self) -> int:
        """Healthy servers now; NeMo's EAGLE-3 loop caps its prefetch depth at this."""
        return max(1, self.backend.healthy_servers)

    @property
    def target_version(self) -> str | None:
        """The target version batches come from now (remote_target.target_version: newest, or a label)."""
        return self.backend.target_version

    def pin_target_version(self, version: str) -> None:
        """Every batch taken from now on comes from ``version`` (or the newest again, with ``newest``)."""
        self.backend.pin_target_version(version)

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """These families project nothing onto a draft vocabulary on the fleet (NeMo's default no-op)."""

    def close(self) -> None:
        self.prefetched.cancel()
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
