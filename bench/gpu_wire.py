"""gpu_check.py's server part: our server on loopback, each encoding's round trip over the wire into
supervision on the device, two requests in flight over the wire and inside the service. Imported by
gpu_check.py from beside it."""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp
import gpu_features  # beside this script: the feature-request checks
import torch
from aiohttp import web
from gpu_features import synchronize

ENCODINGS = ("nemo", "logits", "hidden")
PHASES = ("decode", "forward", "projection", "copy", "encode")  # the server's compute, from Server-Timing
COPY_MODES = {"copy_in_turn": False, "copy_overlapped": True}  # ServerOptions.overlap_host_copy


async def start_server(runner, tokens: int):
    from eagle3_target.server.app import ServerOptions, TargetServer

    server = TargetServer(lambda: runner, ServerOptions(max_batch_tokens=max(8192, tokens)))
    app_runner = web.AppRunner(server.app(), access_log=None)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    return app_runner, f"http://127.0.0.1:{app_runner.addresses[0][1]}", server.service


async def service_two_in_flight(service, inputs: dict, vocab: dict, repeats: int) -> dict:
    """Per encoding and copy mode: seconds per batch with two requests always in the service (no wire)."""
    import dataclasses

    from eagle3_target.protocol import wire
    from eagle3_target.server.pipeline import GenerateRequest

    request, options = wire.encode(inputs), service.pipeline.options
    await service.clients.set_vocab_mapping("gpu-check", bytearray(wire.encode(vocab)))

    async def lane(name: str, count: int) -> None:
        for _ in range(count):
            async with service.pipeline.generate(GenerateRequest("gpu-check", bytearray(request), name)):
                pass  # the reply is in host memory, ready to send

    results = {}
    try:
        for name in ENCODINGS:
            for mode, overlap in COPY_MODES.items():
                service.pipeline.options = dataclasses.replace(options, overlap_host_copy=overlap)
                await asyncio.gather(lane(name, 1), lane(name, 1))  # warm-up
                count = max(2, 2 * repeats)  # the last reply's copy overlaps nothing: make it a small share
                start = time.perf_counter()
                await asyncio.gather(lane(name, count), lane(name, count))
                results.setdefault(name, {})[mode] = (time.perf_counter() - start) / (2 * count)
    finally:
        service.pipeline.options = options
    return results


async def over_the_wire(url: str, runner, inputs: dict, vocab: dict, repeats: int) -> dict:
    """Per encoding: reply bytes, server compute phases, round trip into supervision on the device."""
    from eagle3_target.client.body import read_tensors
    from eagle3_target.client.connection import parse_server_timing
    from eagle3_target.protocol import contract, encodings, wire

    device = runner.info.device
    request = wire.encode(inputs)
    results, supervision = {}, {}
    async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=600)) as http:
        while True:
            async with http.get(f"{url}/health") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.2)
        async with http.post(f"{url}/set_vocab_mapping", data=wire.encode(vocab)) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(f"{url}/lm_head") as resp:
            # our own server on loopback: its Content-Length is the read's limit
            head_rows = (await read_tensors(resp, resp.content_length))["weight"].to(device)
        for name in ENCODINGS:
            rounds, compute, peaks = [], [], []
            for _ in range(repeats + 1):
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                async with http.post(
                    f"{url}/generate", data=request, headers={contract.ENCODING_HEADER: name}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    tensors = await read_tensors(
                        resp, resp.content_length, pin_memory=device.startswith("cuda")
                    )
                    timing = parse_server_timing(resp.headers["Server-Timing"])
                on_device = {k: v.to(device, non_blocking=True) for k, v in tensors.items()}
                ids, loss = (inputs[k].to(device) for k in ("input_ids", "loss_mask"))
                out = encodings.decode(name, on_device, ids, loss, head_rows)
                synchronize(device)
                rounds.append(time.perf_counter() - start)
                compute.append({p: timing.get(p, 0.0) for p in PHASES})
                if device.startswith("cuda"):
                    peaks.append(torch.cuda.max_memory_allocated())
            nbytes = int(resp.content_length)
            phases = {p: statistics.median(c[p] for c in compute[1:]) for p in PHASES}
            results[name] = dict(
                bytes=nbytes,
                round_trip_s=statistics.median(rounds[1:]),
                server_compute_s=statistics.median(sum(c.values()) for c in compute[1:]),
                server_phases_s=phases,
                peak_gpu_bytes=max(peaks) if peaks else None,
                two_in_flight_s=await two_in_flight(http, url, request, name, repeats),
            )
            supervision[name] = {k: v.float().cpu() for k, v in out.items()}
        results["features"] = await gpu_features.round_trips(http, url, request, runner, repeats, PHASES)
    return results, supervision


async def two_in_flight(
    http: aiohttp.ClientSession, url: str, request: bytes, name: str, repeats: int
) -> float:
    """Seconds per batch with two requests always in flight (each reply read into tensors)."""
    from eagle3_target.client.body import read_tensors
    from eagle3_target.protocol import contract

    async def one() -> None:
        async with http.post(
            f"{url}/generate", data=request, headers={contract.ENCODING_HEADER: name}
        ) as resp:
            assert resp.status == 200, await resp.text()
            await read_tensors(resp, resp.content_length)

    async def lane(count: int) -> None:
        for _ in range(count):
            await one()

    await asyncio.gather(lane(1), lane(1))  # warm-up
    count = max(2, repeats)
    start = time.perf_counter()
    await asyncio.gather(lane(count), lane(count))
    return (time.perf_counter() - start) / (2 * count)
