"""Helpers shared by the client tests: ports and the deterministic reference supervision."""

from __future__ import annotations

import time

import torch

from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server.runners.synthetic import SyntheticRunner

VOCAB = 512


def wait_until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# -- reference supervision -------------------------------------------------------------------


def make_batch(seed: int, batch: int = 2, seq: int = 16, vocab: int = VOCAB):
    """Distinct, deterministic inputs per seed, so every result can be matched to its batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[:, -(seed % 4) - 1 :] = 0
    loss = mask.clone()
    loss[:, : seq // 4] = 0
    return ids, mask, loss


def draft_vocab(vocab: int = VOCAB, size: int = 96, seed: int = 7) -> VocabMapping:
    """An unsorted draft vocabulary, as NeMo builds it."""
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size]
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    return VocabMapping(ids, mask)


def expected(runner: SyntheticRunner, vocab: VocabMapping, ids, mask, loss) -> dict[str, torch.Tensor]:
    logits, aux = runner.forward(ids, mask)
    return build_supervision(logits, aux, ids, loss, vocab)


def assert_batch_matches(batch, reference: dict[str, torch.Tensor], attention_mask) -> None:
    for key, value in reference.items():
        got = getattr(batch, key)
        assert got.dtype == value.dtype, key
        assert torch.equal(got, value), key
    assert torch.equal(batch.attention_mask, attention_mask)
