"""Packed rows from the client: negotiated at join, the metadata sent, doc_remaining handed back untouched."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagle3_target.client import EncodingError, PoolOptions, RemoteTargetBackend
from eagle3_target.protocol.features import CAN_PACKING
from eagle3_target.server.runners.hf import HFRunner

from .client_support import draft_vocab

pytestmark = pytest.mark.timeout(120)

FAST = PoolOptions(deadline=10.0, start_timeout=10.0, backoff_base=0.01, backoff_max=0.2)
PACKING = dataclasses.replace(FAST, packing=True)


def without_packing() -> HFRunner:
    """The same target on an engine that cannot honour packed rows (as vLLM's or SGLang's)."""
    runner = HFRunner.load(dtype="float32")
    features = tuple(f for f in runner.info.features if f != CAN_PACKING)
    runner.info = dataclasses.replace(runner.info, features=features)
    return runner


def packed_batch():
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(1))
    ones = torch.ones_like(ids)
    lengths = torch.tensor([[5, 7, 0], [4, 4, 4]])
    positions = torch.stack([torch.cat([torch.arange(n) for n in row if n]) for row in lengths.tolist()])
    remaining = torch.stack(
        [torch.cat([torch.arange(n, 0, -1) for n in row if n]) for row in lengths.tolist()]
    )
    return ids, ones, ones, positions, lengths, remaining


def test_packed_rows_go_to_servers_that_honour_them_and_come_back_with_their_metadata(farm):
    hf = farm.start("127.0.0.2", loader=lambda: HFRunner.load(dtype="float32"))
    other = farm.start("127.0.0.3", loader=without_packing)
    vocab = draft_vocab()
    ids, mask, loss, positions, lengths, remaining = batch = packed_batch()
    with RemoteTargetBackend([hf, other], options=PACKING) as backend:
        backend.wait_for_servers(10)
        assert backend.healthy_servers == 1
        assert f"{other} cannot compute packed rows" in backend.pool.describe_members()
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        packed = backend.generate_batch(*batch)
        unpacked = backend.generate_batch(ids, mask, loss)
    assert (
        packed.seq_lens is lengths and packed.position_ids is positions and packed.doc_remaining is remaining
    )
    assert unpacked.seq_lens is None and "seq_lens" not in unpacked.as_dict()
    # the first document computes alike either way; the second attends only to itself when packed
    assert torch.allclose(packed.aux_hidden_states[0, :4], unpacked.aux_hidden_states[0, :4], atol=1e-5)
    assert not torch.allclose(packed.aux_hidden_states[0, 5:], unpacked.aux_hidden_states[0, 5:], atol=1e-3)


def test_packed_rows_without_the_option_are_refused_before_any_request(farm):
    url = farm.start("127.0.0.2", loader=lambda: HFRunner.load(dtype="float32"))
    with RemoteTargetBackend(url, options=FAST) as backend, pytest.raises(ValueError, match="packing=True"):
        backend.generate_batch_async(*packed_batch())
    with pytest.raises(EncodingError, match="cannot compute packed rows"):
        RemoteTargetBackend(farm.start("127.0.0.3", dtype="float32"), options=PACKING)
