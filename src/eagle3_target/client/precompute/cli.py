"""`eagle3-target precompute --endpoints SPEC --target-model M --input-data D --output-dir DIR [...]`:
NeMo's offline EAGLE-3 cache, written by the target fleet (docs/precompute.md).

This module imports only the standard library until run(), so help and bad arguments answer at once."""

from __future__ import annotations

import argparse

from eagle3_target.exits import CommandError, Exit

from ..fleet_errors import fleet_errors
from .options import add_arguments, check, check_family_flags

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    check(args)
    from ..probe import endpoint_specs, read_token

    token = read_token(args.auth_token_file)
    endpoint_specs(args.endpoints)  # a bad spec, or none and no $EAGLE3_TARGET_SERVICE: a usage error
    with fleet_errors():
        try:
            # a missing package: the CLI's one line names it and the extra
            from ..nemo.loading import offline_cache_writer
            from ..nemo.registry import offline_caches

            caches = {name: found.offline_cache for name, found in offline_caches().items()}
            check_family_flags(args, caches)
            print(offline_cache_writer(args.family)(args, token).summary())
        except ImportError as exc:
            if isinstance(exc, ModuleNotFoundError):
                raise
            raise CommandError(str(exc), Exit.NOT_INSTALLED) from None  # NeMo's: it names the install
    return 0
