"""Fair share on a real server: the per-session queue cap's 429 + Retry-After, priority classes, the queue
metrics; and the copy to host memory overlapped with the next forward, through a fake copy stream."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import contract
from eagle3_target.server.host_copy import HostCopier
from eagle3_target.server.metrics import ServerMetrics
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.service import GenerateRequest, TargetService

V = 64
MAPPING = vocab_body(torch.arange(8), torch.arange(V) < 8)


class LoggedRunner(SyntheticRunner):
    """Logs each forward by its first token id; a forward after warm-up waits until ``go`` is set, and
    the second one sets ``second``."""

    def __init__(self, log: list, go: threading.Event | None = None, second: threading.Event | None = None):
        super().__init__(vocab_size=V, dtype="float32")
        self.log, self.go, self.second = log, go, second

    def forward(self, input_ids, attention_mask):
        if input_ids.shape[1] > 8:  # warm-up forwards have 8 tokens
            self.log.append(("forward", int(input_ids[0, 0])))
            if self.second is not None and len(self.log) == 2:
                self.second.set()
            if self.go is not None:
                self.go.wait(30)
        return super().forward(input_ids, attention_mask)


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
        turns = target.server.service.turns
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
    """A copy stream on the CPU, as host_copy.Streams: copies run in the order enqueued, when an event
    covering them is waited for, and not before ``gate`` opens (or 5 s pass, so a copy kept inside
    the turn shows up as the wrong order in the log instead of a hang)."""

    def __init__(self, log: list, gate: threading.Event):
        self.log, self.gate = log, gate
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.done = self.events = 0
        self.lock = threading.Lock()

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        host = torch.full_like(tensor, 7)  # garbage until the copy runs
        self.pending.append((host, tensor))
        return host

    def record(self):
        self.events += 1
        return FakeEvent(self, len(self.pending), self.events)


class FakeEvent:
    def __init__(self, streams: FakeStreams, mark: int, number: int):
        self.streams, self.mark, self.number = streams, mark, number

    def synchronize(self) -> None:
        s = self.streams
        s.gate.wait(5)
        with s.lock:
            for host, source in s.pending[s.done : self.mark]:
                host.copy_(source)
            s.done = max(s.done, self.mark)
            s.log.append(("copied", self.number))


async def two_requests(overlap: bool) -> tuple[list, list]:
    log, gate = [], threading.Event()
    svc = TargetService(
        lambda: LoggedRunner(log, second=gate), ServerOptions(overlap_host_copy=overlap), ServerMetrics()
    )
    svc.copier = HostCopier(FakeStreams(log, gate))
    answers = []

    async def one(session: str, first: int) -> None:
        request = GenerateRequest(session, bytearray(generate_body(ids(first))))
        async with svc.generate(request) as answer:
            answers.append((first, answer.supervision, answer.timings))

    async with svc.running():
        await until(lambda: svc.status() == "ok")
        for session in ("a", "b"):
            await svc.set_vocab_mapping(session, bytearray(MAPPING))
        first = asyncio.create_task(one("a", 1))
        await until(lambda: log)  # a holds the turn before b asks: the order under test is the copy's alone
        await asyncio.gather(first, one("b", 2))
    return log, answers


@pytest.mark.parametrize("overlap", [True, False])
async def test_the_copy_to_host_runs_beside_the_next_forward_in_order_and_exact(overlap):
    log, answers = await two_requests(overlap)
    if overlap:  # the second forward starts while the first reply is still being copied
        assert log == [("forward", 1), ("forward", 2), ("copied", 1), ("copied", 2)]
    else:  # the baseline waits for the copy inside the turn
        assert log == [("forward", 1), ("copied", 1), ("forward", 2), ("copied", 2)]
    reference = TargetService(
        lambda: SyntheticRunner(vocab_size=V, dtype="float32"), ServerOptions(), ServerMetrics()
    )
    async with reference.running():
        await until(lambda: reference.status() == "ok")
        await reference.set_vocab_mapping("r", bytearray(MAPPING))
        for first, supervision, timings in answers:
            async with reference.generate(GenerateRequest("r", bytearray(generate_body(ids(first))))) as want:
                assert supervision.keys() == want.supervision.keys()
                for key, value in want.supervision.items():
                    assert torch.equal(supervision[key], value), (first, key)
            assert "copy" in timings


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
    assert service.turns.max_queued_per_session == 4
    defaults = ServerOptions.from_args(parser.parse_args([]))
    assert (defaults.max_queued_per_session, defaults.max_priority) == (32, "normal")
