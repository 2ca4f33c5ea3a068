"""The temporary directory a trainer-side command needs before it imports anything heavy.

torch, NeMo and Python's own tempfile stop with a traceback (`No usable temporary directory found`) when none
of $TMPDIR, /tmp, /var/tmp, /usr/tmp and the working directory is writable: in a pod with a read-only root
filesystem and no volume at /tmp, which a Job then retries with no hint. The commands check first and say it
in one line instead."""

from __future__ import annotations

import tempfile

from eagle3_target.exits import CommandError, Exit


def require_temp_dir() -> str:
    """The writable temporary directory tempfile will use; CommandError (USAGE) when there is none."""
    try:
        return tempfile.gettempdir()
    except FileNotFoundError:
        raise CommandError(
            "no writable temporary directory ($TMPDIR, /tmp, /var/tmp, /usr/tmp and the working directory are "
            "all read-only or missing): mount a writable volume at /tmp (an emptyDir in a pod) or set TMPDIR",
            Exit.USAGE,
        ) from None
