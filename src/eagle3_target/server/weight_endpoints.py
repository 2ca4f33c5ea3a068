"""The weights a trainer fetches once: the input embeddings (NeMo's endpoint), and our extensions, the
lm_head rows of the session's draft vocabulary and any whole weight a feature family names. No HTTP here."""

from __future__ import annotations

import torch

from eagle3_target.protocol import encodings

from .errors import InvalidInput
from .model_host import ModelHost, offered
from .sessions import SessionTable


class WeightEndpoints:
    """/input_embeddings, /lm_head and /weights/<name>, each returning a tensor in host memory and the version
    of the weights it was read from (read in the same call on the model thread, so a refresh cannot fall
    between the two)."""

    def __init__(self, model: ModelHost, sessions: SessionTable):
        self.model, self.sessions = model, sessions

    async def input_embeddings(self, session_id: str) -> tuple[torch.Tensor, str | None]:
        runner = self.model.ready()
        self.sessions.touch(session_id)
        # Not cached: on a GPU the host copy is ~1 GB for an 8B model, and each trainer asks once.
        # On the CPU .cpu() is a view, so the blob streams straight from the model's own weight.
        return await self.model.call(lambda: (runner.input_embeddings().detach().cpu(), self.model.version))

    async def lm_head_rows(self, session_id: str) -> tuple[torch.Tensor, str | None]:
        """Our extension: the lm_head rows of the session's draft vocabulary, for the "hidden" encoding."""
        runner = self.model.ready()
        session = self.sessions.touch(session_id)
        offered(runner, encodings.HIDDEN)
        ids = session.mapping().selected_token_ids
        return await self.model.call(lambda: (runner.lm_head_rows(ids).cpu(), self.model.version))

    async def weight(self, session_id: str, name: str) -> tuple[torch.Tensor, str | None]:
        """Our extension: a whole weight a trainer fetches once (protocol/features.py WEIGHT_NAMES), on the host."""
        runner = self.model.ready()
        self.sessions.touch(session_id)
        if name not in runner.info.weights:
            available = ", ".join(runner.info.weights) or "none"
            raise InvalidInput(
                "weight_not_offered", f"no weight {name[:64]!r} here; this server offers {available}"
            )
        return await self.model.call(lambda: (runner.weight(name).detach().cpu(), self.model.version))
