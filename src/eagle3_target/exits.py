"""What a command's failure means, as one exit code shared by every `eagle3-target` command (docs/cli.md)."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0
    FAILED = 1  # the work itself failed (a batch, a training step) or the fleet is not all ready
    USAGE = 2  # bad arguments, config file or endpoint spec: argparse's own code
    UNAUTHORIZED = 3  # a server refused the auth token
    UNREACHABLE = 4  # no target server answered (or the name did not resolve)
    NOT_INSTALLED = 5  # the command's extra is not installed


class CommandError(Exception):
    """An expected failure: the CLI prints its message as one line and exits with its code."""

    def __init__(self, message: str, code: Exit = Exit.FAILED):
        super().__init__(message)
        self.code = code
