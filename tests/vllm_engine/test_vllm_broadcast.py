"""A trainer's weights broadcast live to a vllm replica over gloo on loopback: an announcement of other shapes
is refused with weights A serving bit for bit under their label, and weights B broadcast go into vLLM's own
reload and serve bit for bit as a refresh of B from its checkpoint does."""

import asyncio

import torch
from p2p.p2p_support import port_range
from safetensors.torch import load_file
from target_support import serve, vocab_body

from eagle3_target.client.broadcast import broadcast_refresh
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.p2p.options import P2POptions, PortRange
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.tiny import build_tiny_llama

from .vllm_support import ADMIN, AUX_LAYER_IDS, VLLM_TINY, batch, draft_vocab, refresh, served

IDS, MASK, LOSS = batch(3, 20, [20, 11, 16], seed=8)
VOCAB = draft_vocab(64, seed=8)


def options() -> ServerOptions:
    start, end = port_range()
    p2p = P2POptions(port=start, port_range=PortRange(start, end), timeout=60.0, rendezvous_timeout=60.0)
    return ServerOptions(admin_token=ADMIN, p2p=p2p)


async def broadcast(srv, tensors, version):
    return await asyncio.to_thread(broadcast_refresh, [srv.url], tensors, version, ADMIN, timeout=120)


async def test_weights_broadcast_to_a_vllm_replica_serve_as_a_refresh_from_their_checkpoint(
    vllm_model_dir, tmp_path
):
    weights_b, other = tmp_path / "b", tmp_path / "other-shapes"
    build_tiny_llama(seed=5, **VLLM_TINY).save_pretrained(weights_b)
    build_tiny_llama(seed=5, hidden_size=32, **VLLM_TINY).save_pretrained(other)
    tensors_b = load_file(weights_b / "model.safetensors")
    runner = dict(model=vllm_model_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    async with serve(lambda: load_runner("vllm", **runner), options(), wait=False) as srv:
        await srv.wait_ready(timeout=240)
        mapping = vocab_body(VOCAB.selected_token_ids, VOCAB.selected_token_mask)
        assert (await srv.post("set_vocab_mapping", mapping)).status == 200
        started, before = await served(srv, IDS, MASK, LOSS)

        outcome = await broadcast(srv, load_file(other / "model.safetensors"), "v-other")
        assert list(outcome.refused) == [srv.url] and not outcome.served, outcome
        version, kept = await served(srv, IDS, MASK, LOSS)
        assert version == started and all(torch.equal(kept[k], v) for k, v in before.items()), "unchanged"

        outcome = await broadcast(srv, tensors_b, "v-b-live")
        assert outcome.served == {srv.url: "v-b-live"} and not outcome.refused, outcome
        version, live = await served(srv, IDS, MASK, LOSS)
        assert version == "v-b-live"
        assert not torch.allclose(live["aux_hidden_states"], before["aux_hidden_states"], atol=1e-2)

        assert await refresh(srv, weights_b, "v-b-file") == (200, {"version": "v-b-file"})
        version, from_file = await served(srv, IDS, MASK, LOSS)
        assert version == "v-b-file"
        for key, value in from_file.items():
            assert torch.equal(live[key], value), key
