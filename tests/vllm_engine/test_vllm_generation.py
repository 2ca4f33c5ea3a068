"""The /v1 endpoints on a vllm replica: vLLM's own sampler a chunk at a time gives the greedy text the hf engine
gives, the same seed gives the same text, and supervision still serves between generations."""

import json

import pytest
from target_support import generate_body, serve, vocab_body

from eagle3_target.server.generation_options import GenerationOptions
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.tiny import build_tiny_llama, build_tiny_tokenizer

from .vllm_support import AUX_LAYER_IDS, VLLM_TINY, batch, draft_vocab

PROMPTS = ["w1 w2 w3", "w40 w7", "w300 w301 w302 w303 w9"]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """The vLLM-sized tiny Llama with the embedded target's tokenizer and chat template beside it."""
    path = tmp_path_factory.mktemp("tiny-llama-chat")
    build_tiny_llama(seed=3, **VLLM_TINY).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


async def completion(srv, prompt: str, **params) -> dict:
    body = {
        "model": srv.server.service.model.runner.info.model,
        "messages": [{"role": "user", "content": prompt}],
    }
    async with srv.http.post(srv.url + CHAT, data=json.dumps({**body, **params})) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def answers(engine: str, model_dir: str) -> tuple[list[dict], list[str]]:
    """Greedy replies to PROMPTS and three sampled ones (seeds 7, 7, 8), from one server of ``engine``."""
    options = dict(model=model_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    server = ServerOptions(generation=GenerationOptions(chunk_tokens=5))
    async with serve(lambda: load_runner(engine, **options), server, wait=False) as srv:
        await srv.wait_ready(timeout=240)
        greedy = [await completion(srv, p, max_tokens=16, temperature=0) for p in PROMPTS]
        sampled = [
            (await completion(srv, "w5 w6", max_tokens=16, temperature=1.0, top_p=0.9, seed=s))["choices"][0]
            for s in (7, 7, 8)
        ]
        vocab = draft_vocab(64, seed=1)
        assert (
            await srv.post(
                "set_vocab_mapping", vocab_body(vocab.selected_token_ids, vocab.selected_token_mask)
            )
        ).status == 200
        ids, mask, loss = batch(2, 12, [12, 7], seed=1)
        assert (
            await srv.post("generate", generate_body(ids, mask, loss))
        ).status == 200  # capture still serves
    return greedy, [c["message"]["content"] for c in sampled]


async def test_a_vllm_replica_generates_the_greedy_text_the_hf_engine_does_and_repeats_a_seed(chat_model_dir):
    vllm_greedy, vllm_sampled = await answers("vllm", chat_model_dir)
    hf_greedy, _ = await answers("hf", chat_model_dir)
    for got, want in zip(vllm_greedy, hf_greedy, strict=True):
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
        assert got["usage"] == want["usage"]
    assert vllm_sampled[0] == vllm_sampled[1] != vllm_sampled[2]
