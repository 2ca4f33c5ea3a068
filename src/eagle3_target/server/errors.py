"""What can go wrong with a request, in the service's own words; the HTTP layer picks the status code.

Each error carries a short machine-readable name (``error``) and a sentence for the user (``detail``).
Runners, request parsing, sessions and the p2p path raise these; nothing below the HTTP layer knows
about status codes (middlewares.STATUS maps each class to one).
"""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service cannot serve as asked; the process keeps serving."""

    def __init__(self, error: str, detail: str, param: str | None = None):
        super().__init__(detail)
        self.error, self.detail = error, detail
        self.param = param  # the request field at fault, where there is one (OpenAI's error.param)


class InvalidInput(ServiceError):
    """Malformed input: a bad blob, dtype, shape, header or JSON body."""


class NotFound(ServiceError):
    """Something the request names that this server does not have (an OpenAI request's model)."""


class OutOfRange(ServiceError):
    """Well-formed input that does not fit this model: token ids past its vocabulary, a mask of the wrong length."""


class TooLarge(ServiceError):
    """More than this server takes at once (--max-batch-tokens, an engine's capacity, a body limit)."""


class BodyTimeout(ServiceError):
    """A request body that did not arrive within --body-timeout: a stalled or lying client."""


class NotReady(ServiceError):
    """The model is still loading, or the server is draining: ask another server."""


class NoVocabMapping(ServiceError):
    """The session needs /set_vocab_mapping before this request."""

    def __init__(self) -> None:
        super().__init__(
            "no_vocab_mapping", "this session has no vocab mapping: call /set_vocab_mapping first"
        )


class Forbidden(ServiceError):
    """A request this server's security settings refuse (NeMo's unauthenticated p2p mode, say)."""


class Unauthorized(ServiceError):
    """A request without the credentials its endpoint needs (the admin token of /weights/refresh)."""


class TooManySessions(ServiceError):
    """A new session past --max-sessions; live sessions keep working, a new one should retry later."""


class QueueFull(ServiceError):
    """A session past --max-queued-per-session: backpressure, retry after ``retry_after`` seconds."""

    def __init__(self, error: str, detail: str, retry_after: int):
        super().__init__(error, detail)
        self.retry_after = retry_after
