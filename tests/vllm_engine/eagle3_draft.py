"""An EAGLE-3 draft checkpoint laid out as NeMo's recipe writes one (decode_eval's snapshot: the `model.` wrapper
on every weight but lm_head, one decoder layer, norms in bfloat16, a config that keeps the target's
`num_hidden_layers`), built without NeMo, which vLLM's environment lacks. tests/speculative checks this layout
key for key and shape for shape against NeMo's own export.

``copying=True`` makes a draft that proposes the target's own last token again: its fc passes the last aux
layer (the target's final state before its norm) through, its layer adds nothing (o_proj and down_proj are
zero), and its norm and lm_head are the target's, so its logits are the target's at the position before. A
target that repeats itself accepts its proposals: acceptance above 1, with the other weights random.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def write_eagle3_draft(target: Path, checkpoint: Path, *, seed: int = 0, copying: bool = False) -> Path:
    """A draft for ``target`` at ``checkpoint``/model/consolidated (an epoch_E_step_S folder)."""
    config = json.loads((target / "config.json").read_text())
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(seed)
    shapes = {
        "lm_head.weight": (vocab, hidden),
        "model.embed_tokens.weight": (vocab, hidden),
        "model.fc.weight": (hidden, 3 * hidden),
        "model.layers.0.mlp.down_proj.weight": (hidden, inter),
        "model.layers.0.mlp.gate_proj.weight": (inter, hidden),
        "model.layers.0.mlp.up_proj.weight": (inter, hidden),
        "model.layers.0.self_attn.k_proj.weight": (kv, 2 * hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, q),
        "model.layers.0.self_attn.q_proj.weight": (q, 2 * hidden),
        "model.layers.0.self_attn.v_proj.weight": (kv, 2 * hidden),
    }
    tensors = {name: torch.randn(shape, generator=gen) * 0.05 for name, shape in shapes.items()}
    for norm in (
        "layers.0.hidden_norm",
        "layers.0.input_layernorm",
        "layers.0.post_attention_layernorm",
        "norm",
    ):
        tensors[f"model.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    if copying:
        weights = load_file(target / "model.safetensors")
        tensors["model.fc.weight"] = torch.cat([torch.zeros(hidden, 2 * hidden), torch.eye(hidden)], dim=1)
        tensors["model.layers.0.self_attn.o_proj.weight"].zero_()
        tensors["model.layers.0.mlp.down_proj.weight"].zero_()
        tensors["model.norm.weight"] = weights["model.norm.weight"].to(torch.bfloat16)
        tensors["lm_head.weight"] = weights["lm_head.weight"].clone()
    folder = checkpoint / "model" / "consolidated"
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    draft_fields = {
        "architectures": ["LlamaEagle3DraftModel"],
        "draft_vocab_size": vocab,
        "target_hidden_size": hidden,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps({**config, **draft_fields}, indent=2))
    return checkpoint
