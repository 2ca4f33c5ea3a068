"""OpenAI's /v1/completions and /v1/chat/completions bodies, parsed and checked, engine-neutral (no torch, no
HTTP): a GenerationAsk the generation service runs, or a ServiceError naming the field (OpenAI's ``param``).

Fields this server cannot honour (n > 1, logprobs, echo, penalties) are refused rather than ignored, so a
client never gets a different answer than it asked for; fields that change nothing are ignored, as vLLM does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInput, NotFound
from .sampling import SamplingParams

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the server's cap
MAX_STOP_STRINGS = 16
# Set to anything but these defaults, they would change the answer in a way this server does not compute.
_UNSUPPORTED = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "top_logprobs": None}
_UNSUPPORTED.update(presence_penalty=0, frequency_penalty=0, logit_bias=None, suffix=None)


@dataclass(frozen=True)
class GenerationAsk:
    """One generation request: a prompt (text, token ids, or chat messages) and how to sample."""

    model: str
    params: SamplingParams
    chat: bool
    prompt: str | list[int] | None = None  # /v1/completions
    messages: list[dict[str, Any]] = field(default_factory=list)  # /v1/chat/completions
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs (enable_thinking...)
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage before [DONE]
    # max_tokens (or max_completion_tokens) was asked: one past the model's context is refused, not cut
    max_tokens_given: bool = True


def parse_ask(body: bytes, *, chat: bool, served: str, max_tokens_cap: int) -> GenerationAsk:
    """The checked request; InvalidInput (400) or NotFound (404: another model)."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput("invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput("invalid_json", "the body must be a JSON object")
    model = _typed(data, "model", str, required=True)
    if model != served:
        raise NotFound(
            "model_not_found", f"the model {model!r} does not exist; this server serves {served!r}", "model"
        )
    for name, default in _UNSUPPORTED.items():
        if data.get(name, default) not in (default, None):
            raise InvalidInput("unsupported_parameter", f"{name}={data[name]!r} is not supported here", name)
    stream = _typed(data, "stream", bool) or False
    options = _typed(data, "stream_options", dict) or {}
    default_tokens = max_tokens_cap if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
    params = _sampling(data, min(default_tokens, max_tokens_cap), max_tokens_cap, chat)
    common = dict(model=model, params=params, chat=chat, stream=stream)
    common["include_usage"] = bool(options.get("include_usage")) and stream
    asked = ("max_tokens", "max_completion_tokens") if chat else ("max_tokens",)
    common["max_tokens_given"] = any(data.get(name) is not None for name in asked)
    if chat:
        kwargs = _typed(data, "chat_template_kwargs", dict) or {}
        return GenerationAsk(messages=_messages(data), template_kwargs=kwargs, **common)
    return GenerationAsk(prompt=_prompt(data), **common)


def _sampling(data: dict, default_tokens: int, cap: int, chat: bool) -> SamplingParams:
    name = "max_completion_tokens" if chat and data.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _typed(data, name, int)
    max_tokens = default_tokens if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise InvalidInput("invalid_value", f"{name} must be at least 1, got {max_tokens}", name)
    if max_tokens > cap:
        raise InvalidInput(
            "max_tokens_too_large",
            f"{name}={max_tokens} is over this server's cap of {cap} (--max-generation-tokens)",
            name,
        )
    temperature = _number(data, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise InvalidInput("invalid_value", "top_p must be in (0, 1], got 0", "top_p")
    top_k = _typed(data, "top_k", int)
    if top_k is not None and top_k < -1:
        raise InvalidInput(
            "invalid_value", f"top_k must be -1 (off), 0 (off) or positive, got {top_k}", "top_k"
        )
    seed = _typed(data, "seed", int)
    return SamplingParams(max_tokens, temperature, top_p, max(top_k or 0, 0), seed, _stop(data))


def _stop(data: dict) -> tuple[str, ...]:
    stop = data.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidInput("invalid_type", "stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidInput(
            "invalid_value", f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop"
        )
    return tuple(stops)


def _prompt(data: dict) -> str | list[int]:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return prompt
    raise InvalidInput(
        "invalid_type",
        "prompt must be a non-empty string or list of token ids (one prompt per request)",
        "prompt",
    )


def _messages(data: dict) -> list[dict[str, Any]]:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("invalid_type", "messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidInput(
                "invalid_type", f"messages[{i}] must be an object with a string role", "messages"
            )
        out.append({**message, "content": _content(message.get("content"), i)})
    return out


def _content(content: Any, i: int) -> str:
    """A message's text: a string, or OpenAI's list of text parts joined (other parts are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = content if isinstance(content, list) else [None]
    if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts):
        return "".join(p["text"] for p in parts)
    raise InvalidInput(
        "invalid_type", f"messages[{i}].content must be a string or a list of text parts", "messages"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _typed(data: dict, name: str, kind: type, required: bool = False) -> Any:
    value = data.get(name)
    if value is None:
        if required:
            raise InvalidInput("missing_field", f"{name} is required", name)
        return None
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise InvalidInput(
            "invalid_type", f"{name} must be {kind.__name__}, got {type(value).__name__}", name
        )
    return value


def _number(data: dict, name: str, default: float, low: float, high: float) -> float:
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput("invalid_type", f"{name} must be a number, got {value!r}", name)
    if not low <= value <= high:
        raise InvalidInput("invalid_value", f"{name} must be in [{low:g}, {high:g}], got {value}", name)
    return float(value)
