"""NeMo's DSpark recipe (TrainDSparkRecipe) with the fleet as its target.

NeMo's co-located HFDSparkTargetModel gives the trainer the configured target layers concatenated (-1 the
embedding output, the last layer id the post-norm hidden state, any other id that decoder layer's output)
and the post-norm last hidden state [B,S,H], unshifted; the draft copies the target's embeddings and
lm_head once at setup. The fleet captures the layers and the post-norm hidden state; the two weights are
fetched once. Targets NeMo loads with NeMoAutoModelForCausalLM only (Qwen3-style, Gemma4): its DeepSeek V4, GLM-5.2,
Kimi K3 and MiniMax M3 targets come from expert-parallel builders the fleet does not replace.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig

from ._imports import nemo_module
from .features import FeatureTarget, PrefetchingLoader, open_backend
from .remote_section import RemoteSection
from .takeover import fleet_target

_nemo_dspark = nemo_module("recipes.llm.train_dspark")
DSparkTargetBatch = nemo_module("components.speculative.dspark.target").DSparkTargetBatch
_validate_layer_ids = nemo_module("components.speculative.dspark.common").validate_target_layer_ids
_target_utils = nemo_module("components.speculative.dspark.target_utils")
BUILDER_MODEL_TYPES = frozenset(
    {_target_utils.DEEPSEEK_V4_MODEL_TYPE, _target_utils.DEEPSEEK_V41_MODEL_TYPE, _target_utils.GLM_5_2_MODEL_TYPE}
    | set(_target_utils.MINIMAX_M3_MODEL_TYPES)
    | set(_target_utils.KIMI_K3_MODEL_TYPES)
)


class RemoteDSparkTarget(FeatureTarget):
    """Duck-typed as NeMo's HFDSparkTargetModel."""

    def __init__(self, remote, device: torch.device, *, target_layer_ids: list[int], num_layers: int):
        super().__init__(remote, device)
        self.target_layer_ids = _validate_layer_ids(list(target_layer_ids), num_layers)
        self.last = num_layers - 1

    @staticmethod
    def request(*, target_layer_ids: list[int], num_layers: int) -> dict[str, Any]:
        # The last layer's feature is the post-norm hidden state, captured once as final_hidden.
        return dict(layers=tuple(i for i in target_layer_ids if i != num_layers - 1), final_hidden=True)

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]):
        final = captured["final_hidden"]
        layers = captured.get("hidden_states")
        width = final.shape[-1]
        pieces, start = [], 0
        for layer_id in self.target_layer_ids:
            if layer_id == self.last:
                pieces.append(final)
            else:
                pieces.append(layers[..., start : start + width])
                start += width
        return DSparkTargetBatch(
            target_hidden_states=torch.cat(pieces, dim=-1),
            target_last_hidden_states=final,
            input_ids=inputs["input_ids"],
            loss_mask=inputs["loss_mask"],
            position_ids=inputs.get("position_ids"),
            seq_lens=inputs.get("seq_lens"),
            doc_remaining=inputs.get("doc_remaining"),
        )


class TrainDSparkRecipe(_nemo_dspark.TrainDSparkRecipe):
    """NeMo's DSpark recipe, unchanged but for where the target runs: the eagle3-target fleet.

    ``remote_target:`` as for TrainEagle3Recipe, plus ``prefetch_depth`` (batches captured ahead of the
    training step; default: one per healthy server).
    """

    def __init__(self, cfg):
        recipe_cfg = cfg.recipe_args
        for key, why in (
            ("cached_target_path", "trains offline, without a target: use NeMo's own TrainDSparkRecipe"),
            ("multimodal", "loads a MiniMax M3 VL target through NeMo's own builder"),
        ):
            if recipe_cfg.get(key, None):
                raise ValueError(f"recipe_args.{key} {why}")
        config = AutoConfig.from_pretrained(
            recipe_cfg.target_model_name_or_path, trust_remote_code=bool(recipe_cfg.get("trust_remote_code", False))
        )
        if config.model_type in BUILDER_MODEL_TYPES:
            raise ValueError(
                f"a {config.model_type} target is loaded by NeMo's own expert-parallel builder; "
                "the fleet serves DSpark's dense (Qwen3-style) targets"
            )
        self.remote = RemoteSection.from_config(cfg, family_options=("prefetch_depth",))
        super().__init__(cfg)

    def setup(self):
        self.remote.seed_torch()
        with fleet_target(_nemo_dspark, "HFDSparkTargetModel", self._fleet_wrapper):
            super().setup()
        self.train_dataloader = PrefetchingLoader(
            self.train_dataloader, self.target_wrapper, self.remote.prefetch_depth(self.target_wrapper)
        )

    def _fleet_wrapper(self, config_only_target, *, target_layer_ids, cp_mesh=None) -> RemoteDSparkTarget:
        config = config_only_target.config
        num_layers = int((getattr(config, "text_config", None) or config).num_hidden_layers)
        request = RemoteDSparkTarget.request(target_layer_ids=target_layer_ids, num_layers=num_layers)
        remote = open_backend(request, self.device, self.remote.backend)
        target = RemoteDSparkTarget(remote, self.device, target_layer_ids=target_layer_ids, num_layers=num_layers)
        target.wait_for_servers(self.remote.wait_timeout)
        return target
