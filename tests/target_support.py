"""Helpers for tests that run real target servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import aiohttp
import torch
from aiohttp import web

from eagle3_target.protocol import wire
from eagle3_target.server.app import TargetServer
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.synthetic import SyntheticRunner


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
                assert not self.server.service.stopped.is_set(), "model load failed"
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


class WatchedRunner(SyntheticRunner):
    """A synthetic runner that tells a test when a forward has begun: once ``armed`` (so the warm-up's forward
    does not count), each forward sets ``forwarding`` before it runs."""

    def __init__(self, **options):
        super().__init__(**options)
        self.armed, self.forwarding = False, threading.Event()

    def forward(self, input_ids, attention_mask):
        if self.armed:
            self.forwarding.set()
        return super().forward(input_ids, attention_mask)


def served(server: TargetServer, endpoint: str, code: str) -> float:
    """How many requests an in-process server answered on ``endpoint`` with ``code``, from its registry."""
    labels = {"endpoint": endpoint, "code": code}
    return server.metrics.registry.get_sample_value("eagle3_target_requests_total", labels) or 0.0


def samples(url: str, prefix: str) -> dict[str, float]:
    """A server's /metrics samples whose names start with ``prefix``, each by the rest of its name and its
    labels as written there (``_created`` timestamps aside)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/metrics", timeout=30) as resp:
        lines = resp.read().decode().splitlines()
    found = (line.rsplit(" ", 1) for line in lines if line.startswith(prefix))
    return {name.removeprefix(prefix): float(value) for name, value in found if "_created" not in name}


PORT_TAKEN = "Address already in use"  # how `serve` ends when its --port was taken


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TargetProcess:
    """`eagle3-target serve` in a process of its own (a pod that SIGKILL can take), one torch thread."""

    def __init__(self, host: str, *serve_args: str):
        # free_port() only finds a port free now: another process may take it before the server binds it.
        # So wait for the server to say it listens, and start it again on another port if it found it taken.
        for _ in range(5):
            port = free_port(host)
            self.url = f"http://{host}:{port}"
            self.log = tempfile.TemporaryFile()  # noqa: SIM115 - the server's stderr, kept until kill()
            cmd = [sys.executable, "-m", "eagle3_target.cli", "serve", "--host", host, "--port", str(port)]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            self.process = subprocess.Popen(
                [*cmd, *serve_args], stdout=subprocess.DEVNULL, stderr=self.log, env=env
            )
            if self._bound(f"listening on {self.url}"):
                break
            self.log.close()
        else:
            raise RuntimeError(f"five ports in a row were taken before `serve` on {host} could bind one")
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _logs(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def _bound(self, listening: str, timeout: float = 120.0) -> bool:
        """True once the log says ``listening``; False if the server exited because the port was taken."""
        deadline = time.monotonic() + timeout
        while listening not in self._logs():
            if self.process.poll() is not None:
                if PORT_TAKEN in self._logs():
                    return False
                raise RuntimeError(f"server exited {self.process.returncode}: {self._logs()[-2000:]!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}: never listening")
            time.sleep(0.05)
        return True

    def _get(self, path: str) -> tuple[int, str]:
        with self._http.open(self.url + path, timeout=5) as resp:
            return resp.status, resp.read().decode()

    def wait_ready(self, timeout: float = 120.0) -> TargetProcess:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited {self.process.returncode}: {self.log.read()[-2000:]!r}")
            try:
                if self._get("/health")[0] == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url} did not become ready")
            time.sleep(0.1)

    def generated(self) -> float:
        """How many /generate requests this server answered with 200 (from its /metrics)."""
        text = self._get("/metrics")[1]
        found = re.search(
            r'^eagle3_target_requests_total\{code="200",endpoint="generate"\} (\S+)$', text, re.M
        )
        return float(found.group(1)) if found else 0.0

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.log.close()


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
