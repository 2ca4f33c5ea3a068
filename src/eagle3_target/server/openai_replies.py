"""OpenAI's reply shapes, engine-neutral (no torch, no HTTP): completion and chat bodies, their streamed
chunks as server-sent events ending in ``data: [DONE]``, the model list, and the error object."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"
OWNER = "eagle3-target"
# OpenAI's error.type by status; codes not named here are an invalid request below 500, a server error above.
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload``."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def models_body(model: str, created: int, max_model_len: int | None) -> dict[str, Any]:
    card = {"id": model, "object": "model", "created": created, "owned_by": OWNER, "root": model}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return {"object": "list", "data": [card]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


@dataclass(frozen=True)
class Reply:
    """The shapes of one request's answer: a completion or a chat completion, whole or in chunks."""

    model: str
    chat: bool
    id: str = ""
    created: int = 0

    @classmethod
    def start(cls, model: str, chat: bool) -> Reply:
        prefix = "chatcmpl-" if chat else "cmpl-"
        return cls(model, chat, prefix + uuid.uuid4().hex, int(time.time()))

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, finish: str, used: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": used}

    def chunk(self, text: str, finish: str | None = None, first: bool = False) -> bytes:
        """One streamed piece: new text, and on the last one the finish reason."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        return sse({**self._head(True), "choices": [choice]})

    def usage_chunk(self, used: dict[str, int]) -> bytes:
        """stream_options.include_usage: the usage, in a chunk of no choices, before [DONE]."""
        return sse({**self._head(True), "choices": [], "usage": used})
