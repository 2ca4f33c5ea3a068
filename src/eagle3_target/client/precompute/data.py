"""The dataset, through NeMo's own chat dataset and draft-vocabulary scan (so the samples, their order
and the vocabulary are NeMo's), cut into the batches of the shards this worker owns."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Subset

from ..nemo._imports import nemo_module

SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


@dataclass
class Dataset:
    loader: DataLoader  # NeMo's, unshuffled: sample i lives in shard i // shard_size
    selected_token_ids: torch.Tensor | None = None  # EAGLE-3's draft vocabulary
    selected_token_mask: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        return len(self.loader.dataset)


def nemo_modules():
    """NeMo's tokenizer and EAGLE-3 dataset modules; without NeMo an ImportError naming the install."""
    return nemo_module("_transformers.auto_tokenizer"), nemo_module("components.datasets.llm.eagle3")


def load(args: argparse.Namespace, target_vocab_size: int) -> Dataset:
    """Tokenize as NeMo's precompute does and scan the whole dataset once for the draft vocabulary."""
    tokenizer_module, eagle3 = nemo_modules()
    tokenizer = tokenizer_module.NeMoAutoTokenizer.from_pretrained(
        args.target_model, trust_remote_code=args.trust_remote_code
    )
    loader = nemo_loader(args, tokenizer)
    ids, mask = eagle3.build_eagle3_token_mapping(
        loader,
        target_vocab_size=target_vocab_size,
        draft_vocab_size=args.draft_vocab_size,
        special_token_ids=[getattr(tokenizer, name, None) for name in SPECIAL_TOKENS],
    )
    return Dataset(loader, ids, mask)


def nemo_loader(args: argparse.Namespace, tokenizer) -> DataLoader:
    """NeMo's chat dataloader as its precompute scripts build it: unshuffled, in NeMo's order."""
    _, eagle3 = nemo_modules()
    return eagle3.build_eagle3_dataloader(
        data_path=args.input_data,
        tokenizer=tokenizer,
        seq_length=args.seq_length,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.num_workers,
        split=args.split,
        distributed=False,
        shuffle_seed=args.shuffle_seed,
        mask_reasoning_content=args.mask_reasoning_content,
        mask_generation_prompt=args.mask_generation_prompt,
    )


def owned_shards(num_samples: int, shard_size: int, worker_index: int, worker_count: int) -> list[int]:
    """Shard s belongs to worker s mod count: no shard has two writers, and the workers' loads differ by
    at most one shard."""
    total = -(-num_samples // shard_size)
    return list(range(worker_index, total, worker_count))


def batches(dataset: Dataset, shards: list[int], shard_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """The batches of ``shards`` in order, as NeMo's sequential loader cuts them (shards hold whole
    batches), loaded by NeMo's --num-workers dataloader workers."""
    n = dataset.num_samples
    indices = [i for s in shards for i in range(s * shard_size, min((s + 1) * shard_size, n))]
    source = dataset.loader
    loader = DataLoader(
        Subset(source.dataset, indices),
        batch_size=source.batch_size,
        shuffle=False,
        num_workers=source.num_workers,
        collate_fn=source.collate_fn,
        drop_last=False,
    )
    return iter(loader)
