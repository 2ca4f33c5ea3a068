"""What a request in flight keeps while other requests change the session around it."""

import asyncio
import threading

import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server.runners.synthetic import SyntheticRunner

V = 512


class GatedRunner(SyntheticRunner):
    """Once armed, each forward says it has started and then waits for the test to let it finish."""

    def __init__(self):
        super().__init__(vocab_size=V, dtype="float32")
        self.armed = False
        self.started = threading.Event()
        self.go = threading.Event()

    def forward(self, input_ids, attention_mask):
        if self.armed:
            self.started.set()
            assert self.go.wait(30), "the test never let the forward finish"
        return super().forward(input_ids, attention_mask)


def mapping(n: int, seed: int) -> VocabMapping:
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n]
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    return VocabMapping(ids, mask)


async def test_a_vocab_mapping_sent_during_a_forward_leaves_that_forward_the_whole_old_one():
    """The forward was handed the session's mapping whole: the new one (another size, other ids, another
    mask) applies from the next request on, never half of it to the running one."""
    runner = GatedRunner()
    old, new = mapping(10, seed=1), mapping(30, seed=2)
    ids = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    body = generate_body(ids)
    reference = SyntheticRunner(vocab_size=V, dtype="float32")

    def expect(vocab: VocabMapping) -> dict[str, torch.Tensor]:
        logits, aux = reference.forward(ids, torch.ones_like(ids))
        return build_supervision(logits, aux, ids, torch.ones_like(ids), vocab)

    async with serve(lambda: runner) as srv:
        assert (
            await srv.post("set_vocab_mapping", vocab_body(old.selected_token_ids, old.selected_token_mask))
        ).status == 200
        runner.armed = True
        running = asyncio.create_task(srv.http.post(f"{srv.url}/generate", data=body))
        assert await asyncio.to_thread(runner.started.wait, 30), "the forward never started"
        assert (
            await srv.post("set_vocab_mapping", vocab_body(new.selected_token_ids, new.selected_token_mask))
        ).status == 200
        runner.armed = False
        runner.go.set()
        async with await running as resp:
            assert resp.status == 200
            during = wire.decode(bytearray(await resp.read()))
        async with srv.http.post(f"{srv.url}/generate", data=body) as resp:
            after = wire.decode(bytearray(await resp.read()))
    for got, vocab in ((during, old), (after, new)):
        for key, value in expect(vocab).items():
            assert torch.equal(got[key], value), key
