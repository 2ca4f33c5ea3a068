"""`eagle3-target precompute --endpoints SPEC --target-model M --input-data D --output-dir DIR [...]`:
NeMo's offline EAGLE-3 cache, written by the target fleet (docs/precompute.md)."""

from __future__ import annotations

import argparse
import sys

from eagle3_target.protocol.encodings import EncodingError

from ..connection import ServerError
from ..dispatch import BatchFailedError, ModelMismatchError
from ..endpoints import EndpointError
from ..probe import read_token
from .options import UsageError, add_arguments, check

__all__ = ["add_arguments", "run"]

# The fleet could not be used at all: said in one line, like bad input, before any shard.
FLEET_ERRORS = (EndpointError, EncodingError, ModelMismatchError, ServerError, BatchFailedError)


def fail(message: str) -> int:
    print(f"eagle3-target precompute: error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    try:
        check(args)
        token = read_token(args.auth_token_file)
    except (UsageError, OSError, EndpointError) as exc:
        return fail(str(exc))
    try:
        from .runner import precompute  # NeMo's dataset code: imported once the arguments are known good

        summary = precompute(args, token)
    except (UsageError, ImportError, *FLEET_ERRORS) as exc:
        return fail(str(exc))
    print(summary)
    return 0
