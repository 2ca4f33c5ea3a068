"""Errors the pool raises to the trainer, and the one class that means "this server is wrong".

A server fault is anything a reply can do that a correct server never does: a body past its
limit, framing or JSON that does not parse, a tensor of the wrong shape, a reply to another
request. Faults fail over like a dropped connection; only BatchFailedError (no server answered)
and RequestRejected (every server refused the caller's own request) reach the trainer.
"""


class BatchFailedError(RuntimeError):
    """A request found no server that answered it before its deadline (or none became ready at start)."""


class ServerFault(Exception):
    """A reply no correct server sends: the server (or what is between us) is wrong, not the request."""


class ReplyTooLarge(ServerFault):
    """A reply whose declared or actual size passes the limit agreed for it."""
