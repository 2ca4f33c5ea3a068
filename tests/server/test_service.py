"""The service on its own, with no HTTP: what each endpoint asks of the model, and its domain errors."""

import asyncio

import pytest
import torch
from target_support import generate_body, spec_reference, vocab_body

from eagle3_target.server import errors
from eagle3_target.server.metrics import ServerMetrics
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.pipeline import GenerateRequest
from eagle3_target.server.runners import HiddenStateRunner
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.service import TargetService

V = 64


def service(**options) -> TargetService:
    return TargetService(lambda: SyntheticRunner(vocab_size=V), ServerOptions(**options), ServerMetrics())


async def ready(svc: TargetService) -> None:
    async with asyncio.timeout(30):
        while svc.model.status() != "ok":
            await asyncio.sleep(0.01)


async def test_generate_gives_nemo_supervision_for_the_sessions_mapping():
    svc = service()
    assert svc.model.status() == "loading"
    ids, mask = torch.tensor([5, 1, 9, 3]), torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    input_ids = torch.arange(12).view(2, 6) % V
    async with svc.running():
        await ready(svc)
        await svc.clients.set_vocab_mapping("s", bytearray(vocab_body(ids, mask)))
        async with svc.pipeline.generate(GenerateRequest("s", bytearray(generate_body(input_ids)))) as answer:
            assert answer.transfer is None and answer.encoding == "nemo" and answer.tokens == 12
            assert set(answer.timings) == {"decode", "forward", "projection", "copy"}
            runner = svc.model.runner
            logits, aux = runner.forward(input_ids, torch.ones_like(input_ids))
            want = spec_reference(logits, aux, input_ids, torch.ones_like(input_ids), ids, mask)
            for key, value in want.items():
                assert torch.allclose(answer.supervision[key].to(value.dtype), value), key
        assert isinstance(runner, HiddenStateRunner)
    assert len(svc.sessions) == 0  # running() ends every session on the way out


async def test_domain_errors_name_what_is_wrong():
    svc = service(max_batch_tokens=8, max_sessions=1)
    with pytest.raises(errors.NotReady):
        svc.clients.model_info("s")
    async with svc.running():
        await ready(svc)
        body = bytearray(generate_body(torch.zeros(1, 4, dtype=torch.long)))
        with pytest.raises(errors.NoVocabMapping):
            async with svc.pipeline.generate(GenerateRequest("s", body)):
                pass
        with pytest.raises(errors.TooManySessions):
            svc.clients.heartbeat("another")
        with pytest.raises(errors.TooLarge):
            async with svc.pipeline.generate(
                GenerateRequest("s", bytearray(generate_body(torch.zeros(1, 9, dtype=torch.long))))
            ):
                pass
        with pytest.raises(errors.InvalidInput, match="not offered"):
            async with svc.pipeline.generate(GenerateRequest("s", body, encoding="zstd")):
                pass
        svc.drain()
        with pytest.raises(errors.NotReady, match="shutting down"):
            svc.clients.model_info("s")
