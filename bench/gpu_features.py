"""gpu_check.py's feature-request part: a DFlash capture over the wire, the bare capture, and EAGLE-1's
compact logits on the device. Imported by gpu_check.py from beside it."""

from __future__ import annotations

import statistics
import time

import torch


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def dflash_features(num_layers: int):
    """DFlash's five target layers, spread as NeMo's build_target_layer_ids spreads them."""
    from eagle3_target.protocol.features import Features

    span = num_layers - 4
    return Features(layers=tuple(sorted({round(1 + i * span / 4) for i in range(5)})))


async def round_trips(http, url: str, request: bytes, runner, repeats: int, phases) -> dict:
    """A DFlash capture over the wire: bytes, server compute phases, round trip into tensors."""
    from eagle3_target.client.body import read_tensors
    from eagle3_target.client.connection import parse_server_timing
    from eagle3_target.protocol import contract

    features = dflash_features(runner.info.num_hidden_layers)
    rounds, compute = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        headers = {contract.FEATURES_HEADER: features.to_header()}
        async with http.post(f"{url}/generate", data=request, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            # our own server on loopback: its Content-Length is the read's limit
            tensors = await read_tensors(
                resp, resp.content_length, pin_memory=runner.info.device.startswith("cuda")
            )
            timing = parse_server_timing(resp.headers["Server-Timing"])
        on_device = [v.to(runner.info.device, non_blocking=True) for v in tensors.values()]
        synchronize(runner.info.device)
        del on_device
        rounds.append(time.perf_counter() - start)
        compute.append(sum(timing.get(p, 0.0) for p in phases))
    return dict(
        request=features.to_header(),
        bytes=int(resp.content_length),
        round_trip_s=statistics.median(rounds[1:]),
        server_compute_s=statistics.median(compute[1:]),
    )


def bare_capture_seconds(runner, input_ids, attention_mask, repeats: int) -> float:
    from eagle3_target.server.runners.base import Capture, ForwardInputs

    want = Capture.of(dflash_features(runner.info.num_hidden_layers))
    times = []
    for _ in range(repeats + 1):
        synchronize(runner.info.device)
        start = time.perf_counter()
        runner.capture(ForwardInputs(input_ids, attention_mask), want)
        synchronize(runner.info.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def compact_logits(runner, input_ids, attention_mask) -> dict:
    """EAGLE-1's compact option on this device: lm_head applied to the shipped final hidden state."""
    from eagle3_target.server.runners.base import Capture, ForwardInputs

    got = runner.capture(ForwardInputs(input_ids, attention_mask), Capture(final_hidden=True, logits=True))
    trainer = torch.nn.functional.linear(got.final_hidden.clone(), runner.weight("lm_head").clone())
    diff = float((trainer.float() - got.logits.float()).abs().max())
    return dict(max_abs=diff, identical=bool(torch.equal(trainer, got.logits)))
