"""The ``remote_target:`` section every fleet recipe takes, beside NeMo's own YAML for that recipe, read once
into `RemoteTargetSettings`.

remote_target:
  endpoints: srv://_http._tcp.llama-targets.default.svc.cluster.local  # default: $EAGLE3_TARGET_SERVICE
  auth_token_file: /var/run/eagle3-target/token  # default: $EAGLE3_TARGET_AUTH_TOKEN_FILE
  wait_timeout: 300  # the one wait for the fleet: the first ready server, then the rest found by then
  max_in_flight: 1  # ... and any other client option (PoolOptions fields, nameserver, device)
  seed: 42  # optional: seed torch before setup (NeMo's recipe, and ours without it, keep the caller's seed)
  prefetch_depth: 2  # the recipes whose loops ask per batch: how far ahead the loaders submit
  compact: true  # the families with a compact request: ask it instead of full-vocabulary logits
  draft_root: /shared/drafts  # decode_eval: the servers' --draft-dir-root as mounted here (fleet_cycles.py)
  allow_target_mismatch: false  # true: train against a fleet serving another target than the recipe's, on purpose
  target_version: newest  # or a label: every batch from that target version (docs/versions.md)
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from dataclasses import dataclass
from typing import Any

from ..backend import RemoteTargetBackend
from ..endpoints import EndpointError, default_spec, parse_specs, read_auth_token
from ..options import PoolOptions

DEFAULT_WAIT_TIMEOUT = 300.0  # a large target takes minutes to load (PoolOptions.start_timeout's default)
POOL_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(PoolOptions))
BACKEND_OPTION_NAMES = frozenset(inspect.signature(RemoteTargetBackend).parameters) - {
    "endpoints",
    "auth_token",
    "options",
}


def split_options(options: dict[str, Any]) -> tuple[PoolOptions, dict[str, Any]]:
    """One flat set of client options -> (PoolOptions, RemoteTargetBackend keyword arguments)."""
    unknown = set(options) - POOL_OPTION_NAMES - BACKEND_OPTION_NAMES
    if unknown:
        known = ", ".join(sorted(POOL_OPTION_NAMES | BACKEND_OPTION_NAMES))
        raise ValueError(f"unknown client option(s) {', '.join(sorted(unknown))}; known: {known}")
    pool = PoolOptions(**{k: v for k, v in options.items() if k in POOL_OPTION_NAMES})
    return pool, {k: v for k, v in options.items() if k not in POOL_OPTION_NAMES}


def seed_setting(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(
            f"remote_target.seed={value!r}: an integer, or leave it out to keep the caller's seed"
        )
    return value


def depth_setting(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"remote_target.prefetch_depth={value!r}: a positive integer, or leave it out")
    return value


def wait_setting(options: dict[str, Any]) -> float:
    """remote_target.wait_timeout: the recipes' one wait for the fleet, so the client's start_timeout is
    set from it, never beside it."""
    if "start_timeout" in options:
        raise ValueError(
            "remote_target.start_timeout: the recipes wait for the fleet by remote_target.wait_timeout "
            "alone (the first ready server, then the rest); set that instead"
        )
    value = options.pop("wait_timeout", DEFAULT_WAIT_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"remote_target.wait_timeout={value!r}: a positive number of seconds")
    return float(value)


def flag_setting(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"remote_target.{name}={value!r}: true or false")
    return value


def draft_root_setting(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"remote_target.draft_root={value!r}: a folder path, or leave it out")
    return value


@dataclass(frozen=True)
class RemoteTargetSettings:
    endpoints: str | list[str]
    auth_token: str | None
    # PoolOptions fields and RemoteTargetBackend's keyword arguments, in one flat set (split_options)
    client_options: dict[str, Any]
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    seed: int | None = None
    prefetch_depth: int | None = None  # None: the fleet's capacity (servers x max_in_flight)
    compact: bool = False
    draft_root: str | None = None
    allow_target_mismatch: bool = False  # target_check.py: a fleet serving another target trains, warned

    @classmethod
    def parse(cls, section: dict[str, Any] | None) -> RemoteTargetSettings:
        """The section, checked: a bad value, a misspelt option or an unreadable token file fails here,
        before NeMo loads anything."""
        options = dict(section or {})
        endpoints = options.pop("endpoints", None) or default_spec()
        parse_specs(endpoints if isinstance(endpoints, str) else ",".join(endpoints))
        token_file = options.pop("auth_token_file", None)
        try:
            token = read_auth_token(token_file)
        except EndpointError as exc:
            raise EndpointError(f"remote_target.auth_token_file={exc}" if token_file else str(exc)) from None
        wait = wait_setting(options)
        options["start_timeout"] = wait
        own = dict(
            wait_timeout=wait,
            seed=seed_setting(options.pop("seed", None)),
            prefetch_depth=depth_setting(options.pop("prefetch_depth", None)),
            compact=flag_setting("compact", options.pop("compact", False)),
            draft_root=draft_root_setting(options.pop("draft_root", None)),
            allow_target_mismatch=flag_setting(
                "allow_target_mismatch", options.pop("allow_target_mismatch", False)
            ),
        )
        split_options(options)  # a misspelt option fails here too
        return cls(endpoints=endpoints, auth_token=token, client_options=options, **own)

    def wait_left(self, started: float) -> float:
        """What is left at ``time.monotonic()`` of the one wait begun at ``started``: the servers found
        after the first ready one get the rest of it, not a second wait_timeout."""
        return max(0.0, self.wait_timeout - (time.monotonic() - started))
