"""Fair share on a real server: the per-session queue cap's 429 + Retry-After, priority classes, the queue
metrics; and a reply's projection and copy to host memory overlapped with the next forward, through a fake
side stream."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import capture, contract, encodings
from eagle3_target.protocol.features import LOGITS_FULL, Features
from eagle3_target.server.host_copy import HostCopier
from eagle3_target.server.metrics import ServerMetrics
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.pipeline import GenerateRequest
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.service import TargetService

V = 64
MAPPING = vocab_body(torch.arange(8), torch.arange(V) < 8)


class LoggedRunner(SyntheticRunner):
    """Logs each forward (or feature capture) by its first token id; one after warm-up waits until ``go``
    is set, and the second one sets ``second``."""

    def __init__(self, log: list, go: threading.Event | None = None, second: threading.Event | None = None):
        super().__init__(vocab_size=V, dtype="float32")
        self.log, self.go, self.second = log, go, second

    def forward(self, input_ids, attention_mask):
        self._logged(input_ids)
        return super().forward(input_ids, attention_mask)

    def capture(self, inputs, want):
        self._logged(inputs.input_ids)
        return super().capture(inputs, want)

    def _logged(self, input_ids) -> None:
        if input_ids.shape[1] > 8:  # warm-up forwards have 8 tokens
            self.log.append(("forward", int(input_ids[0, 0])))
            if self.second is not None and len(self.log) == 2:
                self.second.set()
            if self.go is not None:
                self.go.wait(30)


def ids(first: int) -> torch.Tensor:
    return (torch.arange(32).view(2, 16) + first) % V


async def until(condition, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_session_past_its_queue_cap_gets_429_with_retry_after_and_others_are_served():
    go, log = threading.Event(), []
    options = ServerOptions(max_queued_per_session=1)
    async with serve(lambda: LoggedRunner(log, go), options) as target:
        headers = {contract.SESSION_HEADER: "greedy"}
        polite = {contract.SESSION_HEADER: "polite"}
        for h in (headers, polite):
            assert (await target.post("set_vocab_mapping", MAPPING, headers=h)).status == 200
        turns = target.server.service.pipeline.turns
        first = asyncio.create_task(target.post("generate", generate_body(ids(1)), headers=headers))
        await until(lambda: log)  # computing: holds the turn
        queued = asyncio.create_task(target.post("generate", generate_body(ids(2)), headers=headers))
        await until(lambda: turns.queued("greedy") == 1)
        refused = await target.post("generate", generate_body(ids(3)), headers=headers)
        assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
        assert (await refused.json())["error"] == "too_many_queued"
        other = asyncio.create_task(target.post("generate", generate_body(ids(4)), headers=polite))
        await until(lambda: turns.queued("polite") == 1)
        metrics = await target.get(contract.METRICS)
        assert 'eagle3_target_generate_queued{priority="normal"} 2.0' in await metrics.text()
        go.set()
        assert [(await t).status for t in (first, queued, other)] == [200, 200, 200]
        assert log == [("forward", 1), ("forward", 4), ("forward", 2)]  # polite's turn before greedy's second
        metrics = await (await target.get(contract.METRICS)).text()
        assert 'eagle3_target_generate_queue_wait_seconds_count{priority="normal"} 3.0' in metrics


async def test_priority_classes_are_checked_against_the_servers_bound():
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(max_priority="normal")) as target:
        await target.post("set_vocab_mapping", MAPPING)
        body = generate_body(ids(0))
        ok = await target.post("generate", body, headers={contract.PRIORITY_HEADER: "low"})
        assert ok.status == 200
        high = await target.post("generate", body, headers={contract.PRIORITY_HEADER: "high"})
        assert high.status == 403 and (await high.json())["error"] == "priority_not_allowed"
        bad = await target.post("generate", body, headers={contract.PRIORITY_HEADER: "urgent"})
        assert bad.status == 400 and "not one of low, normal, high" in (await bad.json())["detail"]


class FakeStreams:
    """A side stream on the CPU, as host_copy.Streams: each reply's projection and copy run in the order
    they were asked for, when a result covering them is waited for, and not before ``gate`` opens (or 5 s
    pass, so work kept inside the turn shows up as the wrong order in the log instead of a hang)."""

    def __init__(self, log: list, gate: threading.Event):
        self.log, self.gate = log, gate
        self.pending: list = []
        self.results: list[dict[str, torch.Tensor]] = []
        self.lock = threading.Lock()

    def run(self, project, device):
        assert torch.device(device).type == "cpu"
        self.pending.append(project)
        return FakeDone(self, len(self.pending))


class FakeDone:
    def __init__(self, streams: FakeStreams, number: int):
        self.streams, self.number = streams, number

    def result(self) -> dict[str, torch.Tensor]:
        s = self.streams
        s.gate.wait(5)
        with s.lock:
            while len(s.results) < self.number:
                reply = s.pending[len(s.results)]()
                s.results.append({k: v.clone() for k, v in reply.items()})
                s.log.append(("copied", len(s.results)))
        return s.results[self.number - 1]


def logging_projections(monkeypatch, log: list) -> None:
    """Log each projection (an encoding, a feature reply's assembly) by its batch's first token id."""
    for module, name in ((encodings, "encode"), (capture, "reply")):
        original = getattr(module, name)

        def logged(*args, original=original, **kwargs):
            input_ids = next(a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.long)
            log.append(("projected", int(input_ids[0, 0])))
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, logged)


async def two_requests(overlap: bool, features: str | None, monkeypatch) -> tuple[list, list]:
    log, gate = [], threading.Event()
    svc = TargetService(
        lambda: LoggedRunner(log, second=gate), ServerOptions(overlap_host_copy=overlap), ServerMetrics()
    )
    svc.pipeline.copier = HostCopier(FakeStreams(log, gate))
    answers = []

    async def one(session: str, first: int) -> None:
        request = GenerateRequest(session, bytearray(generate_body(ids(first))), features=features)
        async with svc.pipeline.generate(request) as answer:
            answers.append((first, answer.supervision, answer.timings))

    async with svc.running():
        await until(lambda: svc.model.status() == "ok")
        logging_projections(monkeypatch, log)  # after the warm-up's
        for session in ("a", "b"):
            await svc.clients.set_vocab_mapping(session, bytearray(MAPPING))
        first = asyncio.create_task(one("a", 1))
        await until(lambda: log)  # a holds the turn before b asks: the order under test is the copy's alone
        await asyncio.gather(first, one("b", 2))
    return log, answers


FEATURES = Features(layers=(0, 1), final_hidden=True, logits=LOGITS_FULL, shift=True).to_header()


@pytest.mark.parametrize("features", [None, FEATURES], ids=["encoding", "features"])
@pytest.mark.parametrize("overlap", [True, False])
async def test_the_projection_and_copy_run_beside_the_next_forward_in_order_and_exact(
    overlap, features, monkeypatch
):
    log, answers = await two_requests(overlap, features, monkeypatch)
    if overlap:  # the second forward starts before the first reply is projected, let alone copied
        assert log == [
            ("forward", 1),
            ("forward", 2),
            ("projected", 1),
            ("copied", 1),
            ("projected", 2),
            ("copied", 2),
        ]
    else:  # the baseline waits for the projection and the copy inside the turn
        assert log == [
            ("forward", 1),
            ("projected", 1),
            ("copied", 1),
            ("forward", 2),
            ("projected", 2),
            ("copied", 2),
        ]
    monkeypatch.undo()
    reference = TargetService(
        lambda: SyntheticRunner(vocab_size=V, dtype="float32"), ServerOptions(), ServerMetrics()
    )
    async with reference.running():
        await until(lambda: reference.model.status() == "ok")
        await reference.clients.set_vocab_mapping("r", bytearray(MAPPING))
        for first, supervision, timings in answers:
            body = bytearray(generate_body(ids(first)))
            async with reference.pipeline.generate(GenerateRequest("r", body, features=features)) as want:
                assert supervision.keys() == want.supervision.keys()
                for key, value in want.supervision.items():
                    assert torch.equal(supervision[key], value), (first, key)
            assert {"forward", "projection", "copy"} <= timings.keys()


def test_the_serve_flags_reach_the_scheduler():
    import argparse

    from eagle3_target.server import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    options = ServerOptions.from_args(
        parser.parse_args(["--max-queued-per-session", "4", "--max-priority", "high"])
    )
    assert options.max_queued_per_session == 4 and options.max_priority == "high"
    service = TargetService(lambda: SyntheticRunner(), options, ServerMetrics())
    assert service.pipeline.turns.max_queued_per_session == 4
    defaults = ServerOptions.from_args(parser.parse_args([]))
    assert (defaults.max_queued_per_session, defaults.max_priority) == (32, "normal")
