"""NeMo's DSpark recipe (TrainDSparkRecipe) with the fleet as its target.

NeMo's co-located HFDSparkTargetModel gives the trainer the configured target layers concatenated (-1 the
embedding output, the last layer id the post-norm hidden state, any other id that decoder layer's output)
and the post-norm last hidden state [B,S,H], unshifted; the draft copies the target's embeddings and
lm_head once at setup. The fleet captures the layers and the post-norm hidden state; the two weights come
once. Targets NeMo loads with NeMoAutoModelForCausalLM only (Qwen3-style, Gemma4): its DeepSeek V4,
GLM-5.2, Kimi K3 and MiniMax M3 targets come from expert-parallel builders the fleet does not replace.
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py) with ``prefetch_depth``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoConfig

from eagle3_target.protocol.families import by_recipe

from ._imports import nemo_module
from .features import FeatureTarget, dspark_context, open_backend
from .prefetch import depth_setting
from .remote import RemoteTargetSection
from .takeover import fleet_target

_dspark = nemo_module("recipes.llm.train_dspark")
_target = nemo_module("components.speculative.dspark.target")
_common = nemo_module("components.speculative.dspark.common")
_types = nemo_module("components.speculative.dspark.target_utils")
BUILDER_MODEL_TYPES = frozenset(
    (_types.DEEPSEEK_V4_MODEL_TYPE, _types.DEEPSEEK_V41_MODEL_TYPE, _types.GLM_5_2_MODEL_TYPE)
    + tuple(_types.MINIMAX_M3_MODEL_TYPES)
    + tuple(_types.KIMI_K3_MODEL_TYPES)
)


class RemoteDSparkTarget(FeatureTarget):
    """Duck-typed as NeMo's HFDSparkTargetModel."""

    def __init__(
        self, backend, weights, device: torch.device, prefetch_depth, *, target_layer_ids, num_layers
    ):
        super().__init__(backend, weights, device, prefetch_depth)
        self.target_layer_ids = list(target_layer_ids)
        self.num_layers = num_layers

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: dict[str, Any]):
        return _target.DSparkTargetBatch(
            target_hidden_states=dspark_context(captured, self.target_layer_ids, self.num_layers),
            target_last_hidden_states=captured["final_hidden"],
            input_ids=inputs["input_ids"],
            loss_mask=inputs["loss_mask"],
            position_ids=inputs.get("position_ids"),
            seq_lens=inputs.get("seq_lens"),
            doc_remaining=inputs.get("doc_remaining"),
        )


def refuse_local_only(cfg) -> None:
    """One line, before anything slow, for what only NeMo's own recipe (with the target here) can do."""
    recipe_cfg = cfg.recipe_args
    if recipe_cfg.get("cached_target_path", None):
        raise ValueError("recipe_args.cached_target_path trains offline, without a target: use NeMo's recipe")
    if recipe_cfg.get("multimodal", False):
        raise ValueError("recipe_args.multimodal loads a MiniMax M3 VL target through NeMo's own builder")
    if int(cfg.get("distributed.cp_size", 1) or 1) > 1:
        raise ValueError("distributed.cp_size>1 shards a co-located target; the fleet runs it whole")
    config = AutoConfig.from_pretrained(
        recipe_cfg.target_model_name_or_path,
        trust_remote_code=bool(recipe_cfg.get("trust_remote_code", False)),
    )
    if config.model_type in BUILDER_MODEL_TYPES:
        raise ValueError(
            f"a {config.model_type} target is loaded by NeMo's expert-parallel builder, which the fleet does "
            "not replace; it serves DSpark's NeMoAutoModelForCausalLM targets (Qwen3-style, Gemma4)"
        )


class TrainDSparkRecipe(RemoteTargetSection, _dspark.TrainDSparkRecipe):
    """NeMo's TrainDSparkRecipe, unchanged but for where the target runs: the eagle3-target fleet."""

    recipe_keys = ("prefetch_depth",)

    def __init__(self, cfg):
        refuse_local_only(cfg)
        super().__init__(cfg)
        self.prefetch_depth = depth_setting(self.recipe_settings.get("prefetch_depth"))

    def setup(self):
        with fleet_target(_dspark, "HFDSparkTargetModel", self._fleet_wrapper):
            super().setup()
        self.target_wrapper.prefetched.wrap_loaders(self)

    def _fleet_wrapper(self, config_only, *, target_layer_ids, cp_mesh=None) -> RemoteDSparkTarget:
        config = config_only.config
        num_layers = int((getattr(config, "text_config", None) or config).num_hidden_layers)
        layer_ids = _common.validate_target_layer_ids(list(target_layer_ids), num_layers)
        family = by_recipe("TrainDSparkRecipe")
        backend, weights = open_backend(family, self.device, self.remote_target, layer_ids, num_layers)
        return RemoteDSparkTarget(
            backend,
            weights,
            self.device,
            self.prefetch_depth,
            target_layer_ids=layer_ids,
            num_layers=num_layers,
        )

    def run_train_validation_loop(self):
        try:
            super().run_train_validation_loop()
        finally:
            self.target_wrapper.close()  # ends our sessions on the servers
