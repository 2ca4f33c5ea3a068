"""What a generation request asks of the decoding loop, engine-neutral (no torch, no HTTP): OpenAI's
sampling parameters after validation (openai_request.py), for any engine's runner to honour."""

from __future__ import annotations

from dataclasses import dataclass

FINISH_STOP = "stop"  # an end-of-sequence token or a stop string
FINISH_LENGTH = "length"  # max_tokens reached


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0: greedy (argmax), as vLLM and SGLang read it
    top_p: float = 1.0
    top_k: int = 0  # 0 (or OpenAI-style -1, normalised to 0): no top-k truncation
    seed: int | None = None  # the same seed, prompt and parameters give the same tokens
    stop: tuple[str, ...] = ()  # the text ends before the first of these, which is not returned

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
