"""Co-located NeMo references for the draft families other than EAGLE-3 (DSpark, EAGLE-1/2, P-EAGLE), and
the CPU shims both runs share (tests' support only, never the product):

- NeMo's loader calls torch.cuda.current_device(): the co-located target loads with transformers instead;
- flex attention has no CPU backward in torch 2.13: DSpark's Qwen3 draft switches to sdpa after setup(),
  P-EAGLE's flex attention is computed as dense SDPA under the same mask.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from nemo_automodel.components.config._arg_parser import parse_args_and_load_config
from nemo_automodel.components.speculative.eagle import peagle_draft
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from .nemo_support import make_data

SEED = 42


class CpuAutoModel:
    """NeMo's co-located loader assumes CUDA (torch.cuda.current_device)."""

    @staticmethod
    def from_pretrained(path, torch_dtype=torch.float32, **_):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)


def dense_peagle_attention(q, k, v, *, block_mask, scale):
    """P-EAGLE's flex attention as SDPA under the same mask (evaluated densely from its mask_mod)."""
    idx = torch.arange(q.shape[-2], device=q.device)
    mask = block_mask.mask_mod(0, 0, idx[:, None], idx[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@contextlib.contextmanager
def cpu_shims(recipe_module=None):
    with pytest.MonkeyPatch.context() as mp:
        if recipe_module is not None:
            mp.setattr(recipe_module, "NeMoAutoModelForCausalLM", CpuAutoModel)
        mp.setattr(peagle_draft, "_peagle_flex_attention", dense_peagle_attention)
        yield


# -- targets -------------------------------------------------------------------------------

TINY_QWEN3 = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def build_qwen3_target(path: Path, sharpen: float = 30.0) -> Path:
    """A tiny random Qwen3 (tied head, sharpened) with the example's tokenizer and chat template."""
    make_data.write_target(path)  # the tokenizer files; the Llama weights are replaced below
    for stale in path.glob("*.safetensors"):
        stale.unlink()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        model = Qwen3ForCausalLM(Qwen3Config(**TINY_QWEN3))
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(sharpen / 10)
    model.save_pretrained(path)
    return path


def weight_files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf")]


# -- recipes -------------------------------------------------------------------------------


def recipe_yaml(out: Path, model: Path, chats: Path, recipe_args: dict, **sections) -> Path:
    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {
            "target_model_name_or_path": str(model),
            "train_data_path": str(chats),
            "seq_length": 32,
            "micro_batch_size": 2,
            "num_epochs": 1,
            "output_dir": str(out),
            "log_every_steps": 4,
            **recipe_args,
        },
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"checkpoint_dir": str(out / "checkpoints")},
        **sections,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def load_config(path: Path, *overrides: str):
    return parse_args_and_load_config(argv=["--config", str(path), *overrides])


def final_weights(checkpoints: Path) -> dict[str, torch.Tensor]:
    files = list(checkpoints.glob("epoch_*_step_*/model/consolidated/*.safetensors"))
    assert len(files) == 1, files
    return load_file(files[0])


def train(recipe, after_setup=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Seed torch, set up, train; every micro-batch loss (the trainer module's outputs) and the saved draft."""
    torch.manual_seed(SEED)
    recipe.setup()
    if after_setup is not None:
        after_setup(recipe)
    losses = []
    module = recipe._module() if hasattr(recipe, "_module") else recipe.trainer_module
    handle = module.register_forward_hook(lambda _m, _a, out: losses.append(out.loss.detach().clone()))
    try:
        recipe.run_train_validation_loop()
    finally:
        handle.remove()
    return torch.stack(losses), final_weights(Path(recipe.cfg.checkpoint.checkpoint_dir))


def assert_identical(got, reference) -> None:
    losses, weights = got
    ref_losses, ref_weights = reference
    assert ref_losses.numel() >= 4 and torch.isfinite(ref_losses).all(), ref_losses
    assert losses.shape == ref_losses.shape, (losses, ref_losses)
    bits, ref_bits = losses.float().view(torch.int32), ref_losses.float().view(torch.int32)
    assert torch.equal(bits, ref_bits), (losses.tolist(), ref_losses.tolist())
    assert weights.keys() == ref_weights.keys()
    for name, value in ref_weights.items():
        assert torch.equal(weights[name], value), name


def summary(got) -> str:
    losses, weights = got
    return json.dumps({"losses": losses.tolist(), "tensors": len(weights)})
