"""HF transformers runner: one forward of a causal LM (or an image-text model, hf_vlm.py), aux states
captured by forward hooks."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from eagle3_target.protocol.encodings import ENCODINGS, EXACT_ENCODINGS
from eagle3_target.protocol.features import (
    CAN_IMAGE_MASK,
    CAN_PACKING,
    WEIGHT_FINAL_NORM,
    WEIGHT_LM_HEAD,
    WEIGHT_NAMES,
)
from eagle3_target.protocol.model_info import defining_config

from ..options import EMBEDDED_MODEL
from ..sampling import SamplingParams
from .base import (
    Capture,
    Captured,
    FinalHiddenRunner,
    ForwardInputs,
    RunnerInfo,
    resolve_dtype,
)
from .hf_generate import HFDecoding, eos_token_ids
from .hf_vlm import embedding_output_point, image_spec, load_pretrained, modalities
from .hf_weights import checkpoint_tensors, swap_in
from .hooks import Stop, keep, keep_input
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


def final_norm(model: nn.Module) -> nn.Module | None:
    """The norm whose output the lm_head reads (the decoder's ``norm``), where it has a weight."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    norm = getattr(decoder, "norm", None)
    return norm if isinstance(getattr(norm, "weight", None), torch.Tensor) else None


def load_tokenizer(model: str, trust_remote_code: bool) -> Any:
    """The target's tokenizer, for generation; None (generation refused, supervision served) where it has none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as exc:
        log.warning("no tokenizer for %s (%s): the /v1 generation endpoints answer 400", model, exc)
        return None


class HFRunner(FinalHiddenRunner):
    def __init__(
        self, model: nn.Module, *, name: str, aux_layer_ids: list[int] | None = None, tokenizer: Any = None
    ):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer  # for the /v1 generation endpoints; None: they refuse (generation.py)
        config = model.config
        layers = decoder_layers(model)
        param = next(model.parameters())
        text_config = config.get_text_config()  # an image-text model's sizes are its language model's
        takes, images = modalities(model), image_spec(config)
        self.info = RunnerInfo.build(
            model=name,
            engine="hf",
            num_hidden_layers=len(layers),
            hidden_size=int(getattr(text_config, "hidden_size", 0) or 0),
            vocab_size=int(getattr(text_config, "vocab_size", 0) or 0),
            aux_layer_ids=aux_layer_ids,
            encodings=ENCODINGS if plain_lm_head(model) else EXACT_ENCODINGS,
            dtype=param.dtype,
            device=str(param.device),
            config=defining_config(config.to_diff_dict()),
            features=self.FEATURES
            + ((CAN_IMAGE_MASK,) if images else ())
            # FlashAttention takes no 4D mask (NeMo packs it from position_ids at batch size 1 only); an
            # image-text model's multimodal RoPE has no per-document positions (NeMo refuses packing too)
            + (
                ()
                if takes or "flash" in (getattr(config, "_attn_implementation", None) or "")
                else (CAN_PACKING,)
            ),
            weights=tuple(n for n in WEIGHT_NAMES if n != WEIGHT_FINAL_NORM or final_norm(model) is not None),
            modalities=takes,
            image_spec=images,
        )
        # the context: prompt and generated tokens together (generation.py refuses requests past it)
        self.max_model_len = getattr(text_config, "max_position_embeddings", None)
        self._layers = layers
        self._eos = eos_token_ids(model)
        self._head = model.get_output_embeddings()
        self._norm = final_norm(model)

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
        """Load from a local directory or hub id, on one device; with no model, build the embedded tiny
        Llama (a split replica: hf_parallel.load)."""
        torch_dtype = resolve_dtype(dtype, device)
        if model is None:
            from .tiny import build_tiny_llama, build_tiny_tokenizer

            module, name, tokenizer = (
                build_tiny_llama().to(torch_dtype),
                EMBEDDED_MODEL,
                build_tiny_tokenizer(),
            )
        else:
            module, name = load_pretrained(model, torch_dtype, trust_remote_code), model
            tokenizer = load_tokenizer(model, trust_remote_code)
        log.info("loaded %s (%s) on %s", name, torch_dtype, device)
        return cls(module.to(device), name=name, aux_layer_ids=aux_layer_ids, tokenizer=tokenizer)

    def start_generation(self, prompt_ids: list[int], params: SamplingParams) -> HFDecoding:
        return HFDecoding(self.model, prompt_ids, params, self._eos)

    @torch.inference_mode()
    def forward_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        want = Capture(tuple(self.info.aux_layer_ids), final_hidden=True, logits=True)
        got = self.capture(ForwardInputs(input_ids, attention_mask, position_ids, seq_lens), want)
        return got.logits, got.hidden_states, got.final_hidden

    @torch.inference_mode()
    def capture(self, inputs: ForwardInputs, want: Capture) -> Captured:
        """One forward with hooks where ``want`` reads (NeMo's target wrappers' own), stopped after the
        last of them: nothing past the last asked layer is computed unless the logits are asked."""
        mask, packed = inputs.attention_mask, {}
        if inputs.packed:
            # As NeMo's co-located targets: the block-causal mask replaces the 2D one, positions per document.
            mask = block_causal_mask(inputs.seq_lens, inputs.input_ids.shape[1], self.info.dtype, mask.device)
            packed["position_ids"] = inputs.position_ids
        captured: dict[object, torch.Tensor] = {}
        last = max(want.layers, default=None) if not (want.final_hidden or want.logits) else None
        hooks = [
            self._layers[i].register_forward_hook(keep(captured, i, i == last))
            if i >= 0
            else embedding_output_point(self.model, keep(captured, i, i == last))
            for i in want.layers
        ]
        if want.final_hidden:
            hooks.append(self._head.register_forward_pre_hook(keep_input(captured, stop=not want.logits)))
        try:
            output = self.model(
                input_ids=inputs.input_ids, attention_mask=mask, use_cache=False, **packed, **inputs.images
            )
        except Stop:
            output = None
        finally:
            for hook in hooks:
                hook.remove()
        return Captured(
            hidden_states=torch.cat([captured[i] for i in want.layers], dim=-1) if want.layers else None,
            final_hidden=captured.get("final"),
            logits=output.logits if want.logits else None,
        )

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self._head.weight.detach().index_select(0, ids)

    def input_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach()

    def weight(self, name: str) -> torch.Tensor:
        if name == WEIGHT_LM_HEAD:
            return self._head.weight.detach()
        if name == WEIGHT_FINAL_NORM:
            return self._norm.weight.detach()
        return self.input_embeddings()

    def named_weights(self) -> dict[str, torch.Tensor]:
        """The served weights by checkpoint name (views, not copies): what a refresh replaces."""
        return checkpoint_tensors(self.model)

    def replace_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """On the model thread between forwards: ``tensors`` are checked against named_weights."""
        swap_in(self.model, tensors)

    def served_parts(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """A split replica's refresh on this rank (rank_refresh.py): the whole model's layout, which a source
        must match, and the tensors this rank serves by checkpoint name (sharded ones as DTensors)."""
        named = self.named_weights()
        return named, named

    def close(self) -> None:
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
