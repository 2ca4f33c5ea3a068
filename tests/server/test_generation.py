"""OpenAI-compatible generation on a real server over the embedded target (hf engine, CPU float32): greedy
tokens equal transformers' own generate, seeds repeat, streams end in [DONE], stop strings cut, errors are
OpenAI's shape, auth applies, metrics move, and a generation yields the model to /generate between chunks."""

from __future__ import annotations

import argparse
import asyncio
import json

import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.server import cli
from eagle3_target.server.generation_options import GenerationOptions
from eagle3_target.server.options import EMBEDDED_MODEL, ServerOptions
from eagle3_target.server.runners.hf import HFRunner

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPTS = ["w1 w2 w3", "w40 w7", "w300 w301 w302 w303 w9"]


def chat(content: str, **params) -> dict:
    return {"model": EMBEDDED_MODEL, "messages": [{"role": "user", "content": content}], **params}


async def post(srv, path: str, body, **kwargs):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with srv.http.post(srv.url + path, data=data, **kwargs) as resp:
        return resp.status, await resp.read()


async def streamed(srv, path: str, body: dict) -> list:
    """The events of a streamed reply, parsed; the last is the literal [DONE]."""
    status, raw = await post(srv, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = [line.removeprefix("data: ") for line in raw.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def greedy(runner: HFRunner, ids: list[int], n: int) -> list[int]:
    out = runner.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n)
    return out[0, len(ids) :].tolist()


def assert_same_tokens(tokenizer, reply: dict, text: str, expected: list[int]) -> None:
    """The reply is ``expected`` token for token: its text re-encodes to them (an end-of-sequence token, which
    decoding skips, aside), it counts as many, and it finished as they end."""
    eos = tokenizer.eos_token_id
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == [t for t in expected if t != eos]
    assert reply["usage"]["completion_tokens"] == len(expected)
    assert reply["choices"][0]["finish_reason"] == ("stop" if expected[-1] == eos else "length")


async def test_greedy_chat_and_completions_equal_transformers_generate_whole_and_streamed():
    async with serve(HFRunner.load) as srv:
        runner = srv.server.service.model.runner
        tokenizer = runner.tokenizer
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            expected = greedy(runner, ids, 24)
            status, raw = await post(srv, CHAT, chat(prompt, max_tokens=24, temperature=0))
            assert status == 200
            reply = json.loads(raw)
            content = reply["choices"][0]["message"]["content"]
            assert_same_tokens(tokenizer, reply, content, expected)
            assert reply["usage"]["prompt_tokens"] == len(ids) and reply["object"] == "chat.completion"
            events = await streamed(srv, CHAT, chat(prompt, max_tokens=24, temperature=0))
            assert events[0]["choices"][0]["delta"]["role"] == "assistant"
            assert "".join(e["choices"][0]["delta"]["content"] for e in events if e["choices"]) == content
            assert events[-1]["usage"] == reply["usage"]

            plain = tokenizer(prompt)["input_ids"]
            body = {"model": EMBEDDED_MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
            status, raw = await post(srv, COMPLETIONS, body)
            text = json.loads(raw)["choices"][0]["text"]
            assert_same_tokens(tokenizer, json.loads(raw), text, greedy(runner, plain, 12))
            events = await streamed(srv, COMPLETIONS, body)
            assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == text
            status, raw = await post(srv, COMPLETIONS, {**body, "prompt": plain})  # token ids as the prompt
            assert json.loads(raw)["choices"][0]["text"] == text


async def test_the_same_seed_gives_the_same_text_and_stop_strings_cut_the_text():
    async with serve(HFRunner.load, ServerOptions(generation=GenerationOptions(chunk_tokens=3))) as srv:
        sampled = chat("w5 w6", max_tokens=32, temperature=1.0, top_p=0.9, top_k=100)
        texts = []
        for seed in (7, 7, 8):
            status, raw = await post(srv, CHAT, {**sampled, "seed": seed})
            texts.append(json.loads(raw)["choices"][0]["message"]["content"])
        assert texts[0] == texts[1] != texts[2]
        status, raw = await post(srv, CHAT, chat("w5 w6", max_tokens=32, temperature=0))
        words = json.loads(raw)["choices"][0]["message"]["content"].split()
        stop = words[9]  # its first occurrence ends the text, which leaves it out
        cut = " ".join(words[: words.index(stop)])
        body = chat("w5 w6", max_tokens=32, temperature=0, stop=[stop, "never"])
        status, raw = await post(srv, CHAT, body)
        choice = json.loads(raw)["choices"][0]
        assert choice["message"]["content"].strip() == cut and choice["finish_reason"] == "stop"
        events = await streamed(srv, CHAT, body)
        assert "".join(e["choices"][0]["delta"]["content"] for e in events if e["choices"]).strip() == cut
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "stop"


BAD = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (chat("w1", model="gpt-4"), 404, "model"),
    (chat("w1", max_tokens=100_000), 400, "max_tokens"),
    (chat("w1", max_tokens=0), 400, "max_tokens"),
    (chat("w1", max_tokens="8"), 400, "max_tokens"),
    (chat("w1", temperature=-1), 400, "temperature"),
    (chat("w1", temperature="hot"), 400, "temperature"),
    (chat("w1", top_p=1.5), 400, "top_p"),
    (chat("w1", top_k=-5), 400, "top_k"),
    (chat("w1", seed=1.5), 400, "seed"),
    (chat("w1", stop=[""]), 400, "stop"),
    (chat("w1", n=2), 400, "n"),
    (chat("w1", stream="yes"), 400, "stream"),
    ({"model": EMBEDDED_MODEL, "messages": []}, 400, "messages"),
    ({"model": EMBEDDED_MODEL, "messages": [{"content": "w1"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "w1"}]}, 400, "model"),
]


async def test_bad_requests_get_openai_shaped_errors_and_the_server_keeps_serving():
    async with serve(HFRunner.load) as srv:
        for body, code, param in BAD:
            status, raw = await post(srv, CHAT, body)
            error = json.loads(raw)["error"]
            assert (status, error["param"]) == (code, param), (body, raw)
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        for prompt in ([], [10**6], "", {"text": "w1"}):
            status, raw = await post(srv, COMPLETIONS, {"model": EMBEDDED_MODEL, "prompt": prompt})
            assert status == 400, (prompt, raw)
        status, raw = await post(srv, "/v1/embeddings", {})
        assert status == 404 and json.loads(raw)["error"]["type"] == "invalid_request_error"
        assert (await post(srv, CHAT, chat("w1", max_tokens=2)))[0] == 200


async def test_auth_applies_as_openai_clients_send_it_and_generation_can_be_switched_off():
    options = ServerOptions(auth_token="s3cret")
    async with serve(HFRunner.load, options) as srv:
        status, raw = await post(srv, CHAT, chat("w1", max_tokens=2))
        assert status == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key"
        bearer = {"Authorization": "Bearer s3cret"}
        assert (await post(srv, CHAT, chat("w1", max_tokens=2), headers=bearer))[0] == 200
        async with srv.http.get(srv.url + "/v1/models", headers=bearer) as resp:
            assert (await resp.json())["data"][0]["id"] == EMBEDDED_MODEL
    async with serve(HFRunner.load, ServerOptions(generation=GenerationOptions(enabled=False))) as srv:
        assert (await post(srv, CHAT, chat("w1", max_tokens=2)))[0] == 404


async def test_metrics_count_generated_tokens_requests_and_time_to_first_token():
    async with serve(HFRunner.load) as srv:
        registry = srv.server.metrics.registry
        await post(srv, CHAT, chat("w1 w2", max_tokens=5, temperature=0))
        await streamed(
            srv, COMPLETIONS, {"model": EMBEDDED_MODEL, "prompt": "w3", "max_tokens": 7, "temperature": 0}
        )
        assert registry.get_sample_value("eagle3_target_generated_tokens_total") == 12
        assert registry.get_sample_value("eagle3_target_generation_requests_total", {"finish": "length"}) == 2
        assert registry.get_sample_value("eagle3_target_time_to_first_token_seconds_count") == 2
        labels = {"endpoint": "v1.chat.completions", "code": "200"}
        assert registry.get_sample_value("eagle3_target_requests_total", labels) == 1


async def test_a_generate_request_waits_for_one_chunk_not_for_the_whole_generation():
    """A long generation takes turns at the model chunk by chunk: /generate runs between two chunks."""
    options = ServerOptions(generation=GenerationOptions(chunk_tokens=1))
    async with serve(HFRunner.load, options) as srv:
        registry = srv.server.metrics.registry
        long = asyncio.create_task(post(srv, CHAT, chat("w1", max_tokens=60, temperature=0)))
        while not registry.get_sample_value("eagle3_target_generated_tokens_total"):
            await asyncio.sleep(0.005)
        await post(srv, "/set_vocab_mapping", vocab_body(torch.arange(8), torch.arange(512) < 8))
        status, _ = await post(srv, "/generate", generate_body(torch.arange(64).view(2, 32)))
        assert status == 200
        made = registry.get_sample_value("eagle3_target_generated_tokens_total")
        assert not long.done() and made < 60
        assert (await long)[0] == 200


async def test_a_request_past_the_model_context_is_refused_before_any_work_and_a_default_is_cut_to_fit():
    """As vLLM: prompt plus max_tokens past max_position_embeddings is a 400 naming the numbers; a chat that
    names no max_tokens gets the room left; a prompt that leaves none is refused; the server keeps serving."""
    from eagle3_target.server.runners.tiny import build_tiny_llama, build_tiny_tokenizer

    def small_context() -> HFRunner:
        model = build_tiny_llama(max_position_embeddings=24)
        return HFRunner(model, name=EMBEDDED_MODEL, tokenizer=build_tiny_tokenizer())

    async with serve(small_context, ServerOptions(generation=GenerationOptions(max_tokens=64))) as srv:
        registry = srv.server.metrics.registry
        async with srv.http.get(srv.url + "/v1/models") as resp:
            assert (await resp.json())["data"][0]["max_model_len"] == 24
        body = {"model": EMBEDDED_MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 21, "temperature": 0}
        for path, asked, param in [
            (COMPLETIONS, body, "max_tokens"),
            (COMPLETIONS, {**body, "stream": True}, "max_tokens"),
            (CHAT, chat("w1", max_tokens=24), "max_tokens"),
            (CHAT, chat(" ".join(["w1"] * 30)), "messages"),  # the prompt alone fills the context
        ]:
            status, raw = await post(srv, path, asked)
            error = json.loads(raw)["error"]
            assert status == 400 and error["code"] == "context_length_exceeded", raw
            assert error["param"] == param and "maximum context length is 24 tokens" in error["message"]
            if asked is body:
                assert "requested 25 tokens (4 in the prompt, 21 in the completion)" in error["message"]
        assert registry.get_sample_value("eagle3_target_generation_prompt_tokens_total") == 0  # nothing ran
        status, raw = await post(srv, COMPLETIONS, {**body, "max_tokens": 20})
        assert status == 200 and json.loads(raw)["usage"]["total_tokens"] <= 24
        status, raw = await post(srv, CHAT, chat("w1", temperature=0))  # no max_tokens: the room left
        used = json.loads(raw)["usage"]
        assert status == 200 and used["total_tokens"] <= 24
        finish = json.loads(raw)["choices"][0]["finish_reason"]
        assert finish == "stop" or used["total_tokens"] == 24


def test_serve_flags_set_the_generation_options():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    defaults = ServerOptions.from_args(parser.parse_args([])).generation
    assert defaults == GenerationOptions() and defaults.enabled and defaults.priority == "low"
    flags = ["--no-generation", "--max-generation-tokens", "8", "--generation-chunk-tokens", "2"]
    options = ServerOptions.from_args(parser.parse_args([*flags, "--generation-priority", "normal"]))
    assert options.generation == GenerationOptions(False, 8, 2, "normal")
