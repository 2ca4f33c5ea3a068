"""Helpers for tests that run real target servers on loopback."""

import asyncio
import contextlib

import aiohttp
import torch
from aiohttp import web

from eagle3_target.protocol import wire
from eagle3_target.server.app import ServerOptions, TargetServer


class RunningServer:
    def __init__(self, server: TargetServer, url: str, http: aiohttp.ClientSession):
        self.server, self.url, self.http = server, url, http

    async def post(self, endpoint: str, body: bytes = b"", **kwargs) -> aiohttp.ClientResponse:
        async with self.http.post(f"{self.url}/{endpoint}", data=body, **kwargs) as resp:
            await resp.read()
            return resp

    async def get(self, endpoint: str, **kwargs) -> aiohttp.ClientResponse:
        async with self.http.get(f"{self.url}/{endpoint}", **kwargs) as resp:
            await resp.read()
            return resp

    async def wait_ready(self, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while (await self.get("health")).status != 200:
                assert not self.server.stopped.is_set(), "model load failed"
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def serve(loader, options: ServerOptions | None = None, host: str = "127.0.0.1", wait: bool = True):
    server = TargetServer(loader, options or ServerOptions())
    runner = server.app_runner()
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as http:
        running = RunningServer(server, f"http://{host}:{port}", http)
        if wait:
            await running.wait_ready()
        try:
            yield running
        finally:
            await runner.cleanup()


def generate_body(input_ids, attention_mask=None, loss_mask=None) -> bytes:
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    loss_mask = torch.ones_like(input_ids) if loss_mask is None else loss_mask
    return wire.encode({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask})


def vocab_body(ids, mask) -> bytes:
    return wire.encode({"selected_token_ids": ids, "selected_token_mask": mask})


def spec_reference(logits, aux, input_ids, loss_mask, ids, mask):
    """NeMo's supervision written literally from the spec: shift the full logits, then project."""
    shifted = torch.cat([logits[:, 1:], torch.zeros_like(logits[:, :1])], dim=1)
    top = shifted.argmax(-1)
    shifted_loss = torch.cat([loss_mask[:, 1:], torch.zeros_like(loss_mask[:, :1])], dim=1)
    return {
        "aux_hidden_states": aux,
        "target_probs": torch.softmax(shifted[..., ids].float(), dim=-1),
        "position_mask": (mask[top] & shifted_loss.bool()).unsqueeze(-1),
        "input_ids": torch.cat([input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])], dim=1),
        "loss_mask": shifted_loss,
    }
