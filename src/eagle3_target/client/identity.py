"""The fleet's model: every server must run the same target as the first one we admitted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from eagle3_target.protocol.model_info import ModelInfo


class ModelMismatchError(RuntimeError):
    """Servers behind one endpoint spec serve different targets."""


class FleetModel:
    def __init__(self):
        self.reference: ModelInfo | None = None  # what every member must match

    async def check_fleet(
        self, urls: list[str], model_info: Callable[[str], Awaitable[ModelInfo]]
    ) -> dict[str, ModelInfo]:
        """Refuse a mixed fleet up front rather than admitting whichever server answers first.
        Returns the answers, which each server's first join uses instead of asking again."""
        infos = await asyncio.gather(*(model_info(url) for url in urls), return_exceptions=True)
        answered = {url: info for url, info in zip(urls, infos, strict=True) if isinstance(info, ModelInfo)}
        if not answered:
            return {}  # none ready yet: the first join sets the reference
        groups: dict[str, list[str]] = {}
        for url, info in answered.items():
            groups.setdefault(info.describe(), []).append(url)
        if len(groups) > 1:
            lines = "; ".join(f"{', '.join(servers)} serve {model}" for model, servers in groups.items())
            raise ModelMismatchError(f"target servers disagree on the model: {lines}")
        self.reference = next(iter(answered.values()))
        return answered

    def admit(self, url: str, info: ModelInfo) -> None:
        """Accept ``info`` (the first one sets the reference) or raise ModelMismatchError naming the fields."""
        if self.reference is None:
            self.reference = info
        diff = self.reference.difference(info)
        if diff:
            raise ModelMismatchError(f"{url} serves a different target: {'; '.join(diff)}")
