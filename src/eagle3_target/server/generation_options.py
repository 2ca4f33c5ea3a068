"""The OpenAI-compatible generation endpoints' settings and their `serve` flags (no torch: parsed before any
heavy import)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from eagle3_target.protocol.contract import PRIORITIES

DEFAULT_MAX_GENERATION_TOKENS = 4096  # max_tokens a request may ask for
# Tokens one turn at the model decodes before queued /generate requests get theirs (scheduler.py).
DEFAULT_CHUNK_TOKENS = 16
# Below supervision's default ("normal"): a regeneration flood leaves training its share.
DEFAULT_GENERATION_PRIORITY = "low"


@dataclass(frozen=True)
class GenerationOptions:
    enabled: bool = True
    max_tokens: int = DEFAULT_MAX_GENERATION_TOKENS
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    priority: str = (
        DEFAULT_GENERATION_PRIORITY  # a request's X-Eagle3-Priority overrides it, up to --max-priority
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GenerationOptions:
        return cls(
            args.generation,
            args.max_generation_tokens,
            args.generation_chunk_tokens,
            args.generation_priority,
        )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(g) -> None:
    g.add_argument(
        "--generation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve OpenAI's /v1/models, /v1/completions and /v1/chat/completions from the loaded target "
        "(hf engine; default on)",
    )
    g.add_argument(
        "--max-generation-tokens",
        type=_positive,
        default=DEFAULT_MAX_GENERATION_TOKENS,
        help=f"the largest max_tokens a request may ask for; more get 400 (default {DEFAULT_MAX_GENERATION_TOKENS})",
    )
    g.add_argument(
        "--generation-chunk-tokens",
        type=_positive,
        default=DEFAULT_CHUNK_TOKENS,
        help="tokens a generation decodes per turn at the model before queued requests get theirs "
        f"(default {DEFAULT_CHUNK_TOKENS})",
    )
    g.add_argument(
        "--generation-priority",
        choices=PRIORITIES,
        default=DEFAULT_GENERATION_PRIORITY,
        help="the scheduler class of a generation request that names none (X-Eagle3-Priority); "
        f"default {DEFAULT_GENERATION_PRIORITY}, below supervision's normal",
    )
