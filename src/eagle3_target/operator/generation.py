"""`spec.generation`: whether a target's replicas serve OpenAI-compatible generation (`/v1/...` on the HTTP
port, from the weights they already hold) and its caps, as `serve` flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_TOKENS_BOUND = 1 << 20  # the CRD's maximum too: a cap above it is a typo, not a model's context


@dataclass(frozen=True)
class Generation:
    """On by default, with the server's own cap; `enabled: false` serves supervision only."""

    enabled: bool = True
    max_tokens: int | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> Generation:
        raw = raw or {}
        cap = raw.get("maxTokens")
        return cls(enabled=bool(raw.get("enabled", True)), max_tokens=int(cap) if cap is not None else None)

    def problems(self) -> list[str]:
        """The CRD's rules, for a spec that skipped validation."""
        if self.max_tokens is None:
            return []
        if not self.enabled:
            return ["generation.maxTokens is set but generation.enabled is false"]
        if not 1 <= self.max_tokens <= MAX_TOKENS_BOUND:
            return [f"generation.maxTokens must be between 1 and {MAX_TOKENS_BOUND}, got {self.max_tokens}"]
        return []

    def server_args(self) -> list[str]:
        """Nothing for the defaults, so that a target written before the field existed keeps its pods' args."""
        if not self.enabled:
            return ["--no-generation"]
        return ["--max-generation-tokens", str(self.max_tokens)] if self.max_tokens is not None else []
