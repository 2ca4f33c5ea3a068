"""Errors the pool raises to the trainer (the rest come from their own modules)."""


class BatchFailedError(RuntimeError):
    """A request found no server that answered it before its deadline (or none became ready at start)."""
