"""The server's settings, built once from `serve`'s parsed flags (no torch, no aiohttp: read before any heavy import)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_target.protocol.contract import TokenFileError, read_token_file

from .generation_options import GenerationOptions
from .p2p.options import P2POptions

# The embedded default target's name: what /model_info reports, and what `--model` (or an Eagle3Target's
# spec.model, which cannot be empty) names it by.
EMBEDDED_MODEL = "embedded-tiny-llama"
# B=8, S=32768 is 6 MiB of /generate request; leave room for a 1M-token vocab mapping too.
DEFAULT_MAX_BODY_BYTES = 64 << 20
# B x S per /generate: the embedded model's CPU forward at 8192 tokens peaks near 0.5 GB and a few
# seconds (attention is quadratic in S); a GPU target with memory to spare raises it.
DEFAULT_MAX_BATCH_TOKENS = 8192
# Image tokens (placeholders in input_ids) one /generate may carry: 16 images of 448x448 on Qwen2.5-VL
DEFAULT_MAX_IMAGE_TOKENS = 4096
DEFAULT_MAX_SESSIONS = 1024
# /generate requests one session may have waiting for the model; more get 429 + Retry-After.
DEFAULT_MAX_QUEUED_PER_SESSION = 32
# The class of a /generate that names none; a server bounds what it grants (--max-priority, contract.PRIORITIES).
DEFAULT_PRIORITY = "normal"
# SIGTERM to exit: fits Kubernetes' default 30 s grace with room for the endpoint update.
DEFAULT_DRAIN_TIMEOUT = 20.0


class UsageError(Exception):
    """A flag or environment that cannot work; the message says which and what to do."""


@dataclass(frozen=True)
class ServerOptions:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_image_tokens: int = DEFAULT_MAX_IMAGE_TOKENS
    session_ttl: float = 3600.0  # 0: sessions never expire
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_queued_per_session: int = DEFAULT_MAX_QUEUED_PER_SESSION
    max_priority: str = DEFAULT_PRIORITY  # the highest X-Eagle3-Priority class granted
    # The copy of a reply to host memory runs on a side CUDA stream after the turn at the model ends;
    # False waits for it inside the turn, as before (bench/gpu_check.py's baseline).
    overlap_host_copy: bool = True
    exit_on_disconnect: bool = False
    auth_token: str | None = None
    admin_token: str | None = None  # enables POST /weights/refresh for its holder alone (refresh.py)
    keepalive_timeout: float = 30.0  # idle connections, and ones still sending headers, are closed
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    body_timeout: float = 30.0  # a request body must arrive in full within this long (else 408)
    write_timeout: float = 60.0  # a client that takes no 4 MiB slice of a response in this long is dropped
    p2p: P2POptions = field(default_factory=P2POptions)
    draft_dir_root: str | None = None  # drafts /v1/speculative/evaluate may read; None: it reads none
    generation: GenerationOptions = field(default_factory=GenerationOptions)

    @property
    def p2p_requires_auth(self) -> bool:
        """A server with a token forms p2p groups only with a proven peer, unless told otherwise."""
        return bool(self.auth_token) and not self.p2p.allow_unauthenticated

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        """The one place flags become options; UsageError names the flag to fix."""
        try:
            p2p = P2POptions.from_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return cls(
            max_body_bytes=args.max_body_bytes,
            max_batch_tokens=args.max_batch_tokens,
            max_image_tokens=args.max_image_tokens,
            session_ttl=args.session_ttl,
            max_sessions=args.max_sessions,
            max_queued_per_session=args.max_queued_per_session,
            max_priority=args.max_priority,
            exit_on_disconnect=args.exit_on_disconnect,
            auth_token=read_token(args.auth_token_file),
            admin_token=read_token(args.admin_token_file, "--admin-token-file"),
            keepalive_timeout=args.keepalive_timeout,
            drain_timeout=args.drain_timeout,
            body_timeout=args.body_timeout,
            write_timeout=args.write_timeout,
            p2p=p2p,
            draft_dir_root=args.draft_dir_root,
            generation=GenerationOptions.from_args(args),
        )


def read_token(path: Path | None, flag: str = "--auth-token-file") -> str | None:
    try:
        return None if path is None else read_token_file(path)
    except TokenFileError as exc:
        raise UsageError(f"{flag} {exc}") from None
