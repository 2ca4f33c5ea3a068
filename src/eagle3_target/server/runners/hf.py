"""HF transformers runner: one AutoModelForCausalLM forward, aux states captured by forward hooks."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from eagle3_target.protocol.encodings import ENCODINGS, EXACT_ENCODINGS
from eagle3_target.protocol.model_info import defining_config

from ..options import EMBEDDED_MODEL
from .base import FinalHiddenRunner, Packing, RunnerInfo, resolve_dtype
from .packing import block_causal_mask

log = logging.getLogger(__name__)

# Where decoder layers live, by architecture family (Llama, Qwen, Mistral: model.layers).
_LAYER_PATHS = ("model.layers", "model.language_model.layers", "transformer.h", "gpt_neox.layers")
# Config keys of logit post-processing after the lm_head (Gemma 2/3, Cohere, Granite): logits are then
# not lm_head(hidden), so the "hidden" encoding is never offered.
LOGIT_POST_PROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    for path in _LAYER_PATHS:
        module: Any = model
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, nn.ModuleList):
            return module
    raise ValueError(
        f"cannot find the decoder layers of {type(model).__name__} (looked at {', '.join(_LAYER_PATHS)})"
    )


def plain_lm_head(model: nn.Module) -> bool:
    """Whether logits are exactly a bias-free linear lm_head of the final hidden states."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return False
    configs = (model.config, model.config.get_text_config())
    return not any(
        getattr(c, key, None) not in (None, 1, 1.0) for c in configs for key in LOGIT_POST_PROCESSING
    )


class HFRunner(FinalHiddenRunner):
    def __init__(self, model: nn.Module, *, name: str, aux_layer_ids: list[int] | None = None):
        self.model = model.eval().requires_grad_(False)
        config = model.config
        layers = decoder_layers(model)
        param = next(model.parameters())
        self.info = RunnerInfo.build(
            model=name,
            engine="hf",
            num_hidden_layers=len(layers),
            hidden_size=int(getattr(config, "hidden_size", 0) or 0),
            vocab_size=int(getattr(config, "vocab_size", 0) or 0),
            aux_layer_ids=aux_layer_ids,
            encodings=ENCODINGS if plain_lm_head(model) else EXACT_ENCODINGS,
            dtype=param.dtype,
            device=str(param.device),
            config=defining_config(config.to_diff_dict()),
            # FlashAttention takes no 4D mask (NeMo packs it from position_ids at batch size 1 only)
            packing="flash" not in (getattr(config, "_attn_implementation", None) or ""),
        )
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = [layers[i].register_forward_hook(self._capture(i)) for i in self.info.aux_layer_ids]
        self._head = model.get_output_embeddings()
        self._hooks.append(self._head.register_forward_pre_hook(self._capture_head_input))

    def _capture_head_input(self, _module, args):
        self._captured["head"] = args[0]  # the final normed hidden states

    def _capture(self, layer_id: int):
        def hook(_module, _args, output):
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        aux_layer_ids: list[int] | None = None,
        trust_remote_code: bool = False,
    ) -> HFRunner:
        """Load from a local directory or hub id; with no model, build the embedded tiny Llama."""
        torch_dtype = resolve_dtype(dtype, device)
        if model is None:
            from .tiny import build_tiny_llama

            module, name = build_tiny_llama().to(torch_dtype), EMBEDDED_MODEL
        else:
            from transformers import AutoModelForCausalLM

            module = AutoModelForCausalLM.from_pretrained(
                model, dtype=torch_dtype, trust_remote_code=trust_remote_code
            )
            name = model
        log.info("loaded %s (%s) on %s", name, torch_dtype, device)
        return cls(module.to(device), name=name, aux_layer_ids=aux_layer_ids)

    @torch.inference_mode()
    def forward_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: Packing | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        extra = {}
        if packing is not None:
            # As NeMo's co-located target: the block-causal mask replaces the 2D one, positions per document.
            seq_length = input_ids.shape[1]
            attention_mask = block_causal_mask(
                packing.seq_lens, seq_length, self.info.dtype, input_ids.device
            )
            extra["position_ids"] = packing.position_ids.to(input_ids.device)
        self._captured.clear()
        try:
            logits = self.model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra
            ).logits
            aux = torch.cat([self._captured[i] for i in self.info.aux_layer_ids], dim=-1)
            hidden = self._captured["head"]
        finally:
            self._captured.clear()
        return logits, aux, hidden

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._head.weight.detach().index_select(0, ids)

    def input_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach()

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
