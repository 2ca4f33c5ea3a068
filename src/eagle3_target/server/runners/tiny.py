"""The embedded default target: a small Llama built deterministically, so nothing is downloaded."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TINY_LLAMA = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def build_tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    """Same seed, same torch build: same weights, on any machine."""
    config = LlamaConfig(**{**TINY_LLAMA, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()
