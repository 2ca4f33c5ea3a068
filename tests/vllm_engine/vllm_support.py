"""Shared by the vLLM tests: whether vLLM is here, the tiny Llama shape its CPU backend runs, the batches, and a
replica's refresh and /generate as its refresh tests ask for them."""

import importlib.util
import json

import torch
from target_support import generate_body

from eagle3_target.protocol import contract, wire
from eagle3_target.protocol.supervision import VocabMapping, build_supervision

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
# vLLM's CPU attention needs head_dim >= 32: the embedded tiny Llama's is 16.
VLLM_TINY = dict(num_attention_heads=2, num_key_value_heads=1)
AUX_LAYER_IDS = [1, 3, 7]  # the last layer too: vLLM's deferred residual add must be undone there as well
VOCAB = 512
ADMIN = "fleet-admin"  # the refresh tests' --admin-token-file


def draft_vocab(size: int, seed: int) -> VocabMapping:
    """A trainer's draft vocabulary: ids in its own (unsorted) order, and the mask over the target's."""
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:size]
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[ids] = True
    return VocabMapping(ids, mask)


def batch(rows: int, seq: int, lengths: list[int], seed: int):
    """Right-padded rows of the given lengths, loss masked on a prompt prefix and on the padding."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (rows, seq), generator=gen)
    attention_mask = (torch.arange(seq) < torch.tensor(lengths)[:, None]).long()
    loss_mask = attention_mask.clone()
    loss_mask[:, : seq // 4] = 0
    return input_ids * attention_mask, attention_mask, loss_mask


BATCHES = {
    "full rows, identity vocab": (batch(2, 24, [24, 24], seed=1), None),
    "padding and loss masks": (batch(4, 40, [40, 17, 1, 33], seed=2), draft_vocab(96, seed=2)),
    "one long row": (batch(1, 300, [300], seed=3), draft_vocab(200, seed=3)),
    "an empty row among others": (batch(3, 16, [16, 0, 9], seed=4), draft_vocab(32, seed=4)),
}


def supervision(runner, input_ids, attention_mask, loss_mask, vocab):
    logits, aux = runner.forward(input_ids, attention_mask)
    return build_supervision(logits, aux, input_ids, loss_mask, vocab or VocabMapping.identity(VOCAB))


async def refresh(srv, source, version) -> tuple[int, dict]:
    """POST /weights/refresh with the admin token: (status, JSON reply)."""
    body = json.dumps({"source": str(source), "version": version})
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with srv.http.post(f"{srv.url}/weights/refresh", data=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def served(srv, input_ids, attention_mask, loss_mask) -> tuple[str, dict[str, torch.Tensor]]:
    """(version header, decoded tensors) of one /generate."""
    body = generate_body(input_ids, attention_mask, loss_mask)
    async with srv.http.post(f"{srv.url}/generate", data=body) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers[contract.TARGET_VERSION_HEADER], wire.decode(bytearray(await resp.read()))
