"""A NeMo EAGLE-3 training loop over any Eagle3TargetBackend, with NeMo's own modules (the draft, its trainer
module, AdamW), and the check that two runs of it are bit-identical."""

from __future__ import annotations

import collections
import itertools
from pathlib import Path

import torch
from nemo_automodel.components.datasets.llm.eagle3 import (
    build_eagle3_dataloader,
    load_or_build_eagle3_token_mapping,
)
from nemo_automodel.components.speculative.eagle import Eagle3TrainerModule, LlamaEagle3DraftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from .exactness import SEED


def nemo_batches(model: Path, chats: Path):
    """NeMo's EAGLE-3 dataloader over ``chats`` (2 rows of 32 tokens a batch, in order) and its draft vocabulary:
    (batches, selected ids, selected mask)."""
    loader = build_eagle3_dataloader(
        data_path=str(chats),
        tokenizer=AutoTokenizer.from_pretrained(model),
        seq_length=32,
        batch_size=2,
        shuffle=False,
    )
    ids, mask = load_or_build_eagle3_token_mapping(loader, target_vocab_size=512, draft_vocab_size=128)
    batches = [(b["input_ids"], b["attention_mask"], b["loss_mask"]) for b in loader]
    return batches, ids, mask


def prefetched(backend, batches):
    """NeMo's prefetch pattern: up to num_remote_servers requests in flight, results in order."""
    it = iter(batches)
    pending = collections.deque(
        backend.generate_batch_async(*b) for b in itertools.islice(it, backend.num_remote_servers)
    )
    while pending:
        result = pending.popleft().result(timeout=120)
        pending.extend(backend.generate_batch_async(*b) for b in itertools.islice(it, 1))
        yield result


def train(backend, data, model: Path, *, prefetch: bool, after_step=None):
    """Per-step losses and final draft weights of EAGLE-3 training with NeMo's own modules."""
    batches, ids, mask = data
    backend.set_vocab_mapping(ids, mask)
    config = AutoModelForCausalLM.from_pretrained(model).config.to_dict()
    config.update(
        draft_vocab_size=ids.numel(),
        target_hidden_size=config["hidden_size"],
        architectures=["LlamaEagle3DraftModel"],
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(SEED)
    draft = LlamaEagle3DraftModel(LlamaConfig.from_dict(config))
    draft.copy_embeddings_from_target(backend.get_input_embeddings())
    draft.set_vocab_mapping(ids)
    draft.freeze_embeddings()
    trainer = Eagle3TrainerModule(draft, selected_token_ids=ids, selected_token_mask=mask, ttt_steps=2)
    optimizer = torch.optim.AdamW([p for p in trainer.parameters() if p.requires_grad], lr=1e-3)
    supervision = prefetched(backend, batches) if prefetch else (backend.generate_batch(*b) for b in batches)
    losses = []
    for step, target_batch in enumerate(supervision):
        metrics = trainer(**target_batch.to_trainer_inputs())
        metrics.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(metrics.loss.detach())
        if after_step is not None:
            after_step(step)
    return torch.stack(losses), {k: v.clone() for k, v in draft.state_dict().items()}


def assert_identical(got, reference):
    losses, weights = got
    ref_losses, ref_weights = reference
    assert ref_losses[-1] < ref_losses[0] - 0.1, "the reference loss must move, or equality proves little"
    assert torch.equal(losses, ref_losses), (losses, ref_losses)
    assert weights.keys() == ref_weights.keys()
    for name, value in ref_weights.items():
        assert torch.equal(weights[name], value), name
