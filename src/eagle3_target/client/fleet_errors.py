"""The fleet's failures as one line and an exit code, for every command that works against a fleet
(`train-draft`, `precompute`, and any later one that trains or evaluates with it): no server ready within
the wait, a name that did not resolve, a refused token, a fleet serving another target (docs/cli.md).

Imports nothing heavy until a failure is mapped, so a command's arguments still answer before torch loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from eagle3_target.exits import CommandError, Exit


@contextmanager
def fleet_errors() -> Iterator[None]:
    """Run the body; a fleet failure leaves as CommandError with the code every command gives it."""
    from eagle3_target.protocol.encodings import EncodingError

    from .connection import ServerError
    from .endpoints import EndpointError
    from .errors import BatchFailedError
    from .identity import ModelMismatchError

    try:
        yield
    except (EndpointError, BatchFailedError) as exc:  # the wait (start_timeout / wait_timeout) ran out
        raise CommandError(str(exc), Exit.UNREACHABLE) from None
    except ServerError as exc:
        unauthorized = exc.status in (401, 403)
        raise CommandError(str(exc), Exit.UNAUTHORIZED if unauthorized else Exit.FAILED) from None
    except (ModelMismatchError, EncodingError) as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
