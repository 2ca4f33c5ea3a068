"""EAGLE-3 draft checkpoints as NeMo's recipe writes them, built with NeMo's own draft class and snapshot export
(random weights: acceptance is low, but speculative decoding must stay lossless), and the target's own greedy
tokens to compare with."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from nemo_automodel.components.speculative.decode_eval import export_draft_snapshot
from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def write_draft(target: Path, checkpoint: Path, seed: int = 0, sharded: bool = False, **overrides) -> Path:
    """A draft for ``target`` at ``checkpoint`` (an epoch_E_step_S folder), configured as NeMo's EAGLE-3 recipe
    configures one: the target's config plus the draft's fields; ``overrides`` change any of them. Saved as
    decode_eval's snapshot (one model.safetensors) or, ``sharded``, as the recipe's final checkpoint (an index
    and its shard files)."""
    base = AutoConfig.from_pretrained(target)
    config = base.to_dict()
    nemo = {
        "draft_vocab_size": base.vocab_size,
        "target_hidden_size": base.hidden_size,
        "architectures": ["LlamaEagle3DraftModel"],
        "tie_word_embeddings": False,
        "attn_implementation": "eager",
    }
    config.update({**nemo, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = LlamaEagle3DraftModel(type(base).from_dict(config))
    folder = Path(export_draft_snapshot(draft, str(checkpoint)))
    if sharded:
        tensors = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        names = sorted(tensors)
        shards = {
            "model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2],
        }
        for shard, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, folder / shard)
        index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return checkpoint


def chat_ids(target: Path, messages: list[dict]) -> list[int]:
    """The chat prompt as vLLM's chat endpoint builds it: the template with the generation prompt."""
    tokenizer = AutoTokenizer.from_pretrained(target)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def greedy(model: AutoModelForCausalLM, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' own greedy decoding: the tokens speculative decoding must give."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens)
    return out[0, len(prompt) :].tolist()
