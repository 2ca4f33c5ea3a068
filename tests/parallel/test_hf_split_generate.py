"""POST /v1/completions on split hf replicas (tensor parallel 2, pipeline parallel 2; gloo on loopback, CPU
float32): every rank runs each decode step and the rank holding the whole logits picks the token. At
temperature 0 the tokens equal transformers' generate(do_sample=False) on the unsplit model, token for token
(tensor parallel too: its logits are within parallel_support's 1e-4 of one device's, and no step of these
prompts has two tokens that close); a seeded sampled request gives one device's tokens for that seed, again
and again; a streamed request gives the same text; and a client that leaves mid-stream does not wedge the
ranks: its sequence is aborted and the next request answers as before. One server per layout."""

from __future__ import annotations

import functools
import json
import socket
import time
import urllib.parse

import pytest
import torch
from parallel_support import OPENER, post, write_split_llama
from target_support import TargetProcess, samples
from transformers import AutoModelForCausalLM

from eagle3_target.server.runners.hf_generate import HFDecoding, eos_token_ids
from eagle3_target.server.runners.tiny import build_tiny_tokenizer
from eagle3_target.server.sampling import SamplingParams

PROMPTS = [[5, 6, 7], [40, 300, 9, 11], [100]]
MAX_TOKENS = 20
SAMPLED = dict(temperature=1.0, top_p=0.9, top_k=100, seed=7)
GENERATIONS, ABORTED = "eagle3_target_generation_requests_total", '{finish="abort"}'


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(the folder: the split-test Llama with the tiny word tokenizer, its 512 words; the unsplit model)."""
    path = write_split_llama(tmp_path_factory.mktemp("split-generate"))
    build_tiny_tokenizer().save_pretrained(path)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["tp2", "pp2"])
def url(request, checkpoint):
    flag = {"tp2": "--tensor-parallel-size", "pp2": "--pipeline-parallel-size"}[request.param]
    server = TargetProcess(
        "127.0.0.1", "--model", str(checkpoint[0]), flag, "2", "--generation-chunk-tokens", "4"
    )
    try:
        yield server.wait_ready(300).url
    finally:
        server.kill()


def completion(url: str, prompt: list[int], **params) -> bytes:
    body = {"model": served_name(url), "prompt": prompt, "max_tokens": MAX_TOKENS, **params}
    return json.dumps(body).encode()


def complete(url: str, prompt: list[int], **params) -> dict:
    return json.loads(post(url, "v1/completions", completion(url, prompt, **params)))


@functools.cache
def served_name(url: str) -> str:
    with OPENER.open(f"{url}/v1/models", timeout=30) as resp:
        return json.loads(resp.read())["data"][0]["id"]


def tokens_of(reply: dict) -> list[int]:
    """The reply's tokens: its text re-encoded (a word per token), the skipped special tokens aside."""
    return build_tiny_tokenizer()(reply["choices"][0]["text"], add_special_tokens=False)["input_ids"]


def visible(ids: list[int]) -> list[int]:
    special = set(build_tiny_tokenizer().all_special_ids)
    return [t for t in ids if t not in special]


def one_device(model, prompt: list[int], params: SamplingParams) -> list[int]:
    """The one-device hf engine's tokens (hf_generate.py, on the unsplit model)."""
    return HFDecoding(model, prompt, params, eos_token_ids(model)).advance(params.max_tokens)


def assert_tokens(reply: dict, expected: list[int]) -> None:
    assert tokens_of(reply) == visible(expected)
    assert reply["usage"]["completion_tokens"] == len(expected)


def test_greedy_equals_transformers_generate_on_the_unsplit_model_token_for_token(url, checkpoint):
    _, model = checkpoint
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_TOKENS
        )
        expected = out[0, len(prompt) :].tolist()
        reply = complete(url, prompt, temperature=0)
        assert_tokens(reply, expected)
        assert reply["choices"][0]["finish_reason"] == ("stop" if expected[-1] == 2 else "length")


def test_a_seeded_sampled_request_gives_one_devices_tokens_again_and_again(url, checkpoint):
    _, model = checkpoint
    for prompt in PROMPTS[:2]:
        expected = one_device(model, prompt, SamplingParams(MAX_TOKENS, **SAMPLED))
        first, again = complete(url, prompt, **SAMPLED), complete(url, prompt, **SAMPLED)
        assert_tokens(first, expected)
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
    other = one_device(model, PROMPTS[0], SamplingParams(MAX_TOKENS, **{**SAMPLED, "seed": 8}))
    assert_tokens(complete(url, PROMPTS[0], **{**SAMPLED, "seed": 8}), other)


def test_a_streamed_request_gives_the_same_text(url):
    for params in (dict(temperature=0), SAMPLED):
        whole = complete(url, PROMPTS[1], **params)
        raw = post(url, "v1/completions", completion(url, PROMPTS[1], **params, stream=True)).decode()
        events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        assert text == whole["choices"][0]["text"]


def leave_mid_stream(url: str, prompt: list[int]) -> None:
    """Start a long streamed completion, read its first event, and hang up."""
    address = urllib.parse.urlsplit(url)
    body = completion(url, prompt, max_tokens=400, temperature=0, stream=True)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((address.hostname, address.port), timeout=60) as sock:
        sock.sendall(head + body)
        seen = b""
        while b"data: " not in seen:
            chunk = sock.recv(4096)
            assert chunk, seen
            seen += chunk


def test_a_client_that_leaves_mid_stream_does_not_wedge_the_ranks(url, checkpoint):
    _, model = checkpoint
    for prompt in PROMPTS[:2]:
        aborted = samples(url, GENERATIONS)[ABORTED]
        leave_mid_stream(url, prompt)
        deadline = time.monotonic() + 3  # at once (well under a second), not when the collector finds it
        while samples(url, GENERATIONS)[ABORTED] == aborted:  # the server saw it leave and ended its sequence
            assert time.monotonic() < deadline, "the abandoned generation did not end when its client left"
            time.sleep(0.1)
    expected = model.generate(torch.tensor([PROMPTS[2]]), do_sample=False, max_new_tokens=MAX_TOKENS)
    assert_tokens(complete(url, PROMPTS[2], temperature=0), expected[0, 1:].tolist())
    sampled = one_device(model, PROMPTS[0], SamplingParams(MAX_TOKENS, **SAMPLED))
    assert_tokens(complete(url, PROMPTS[0], **SAMPLED), sampled)
