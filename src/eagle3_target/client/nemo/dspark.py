"""NeMo's DSpark recipe (TrainDSparkRecipe) with the fleet as its target.

NeMo's co-located HFDSparkTargetModel gives the trainer the configured target layers concatenated (-1 the
embedding output, the last layer id the post-norm hidden state, any other id that decoder layer's output)
and the post-norm last hidden state [B,S,H], unshifted; the draft copies the target's embeddings and
lm_head once at setup. The fleet captures the layers and the post-norm hidden state; the two weights come
once. Targets NeMo loads with NeMoAutoModelForCausalLM (Qwen3-style, Gemma4) and, with
``recipe_args.multimodal: true``, MiniMax M3 VL (NeMo's DSpark-VLM): the fleet serves the image-text checkpoint
and each request carries its batch's images as NeMo's pipeline made them, so NeMo's expert-parallel loader and
its target mesh are not built on the trainer. Its DeepSeek V4, GLM-5.2 and Kimi K3 targets come from
expert-parallel builders the fleet does not replace. On an image-text target NeMo's layer -1 is the token
embedding before the image features are merged in (the fleet's -1 has them merged): the trainer looks it up.
NeMo loads and wraps the target inside one setup(), so the fleet stands in there (takeover.py). Its
offline cache: `eagle3-target precompute --family dspark` (client/precompute/dspark.py).
YAML: NeMo's own for the recipe, plus ``remote_target:`` (remote.py).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from ._imports import nemo_module
from .captures import dspark_context
from .fleet_recipe import FleetRecipe
from .fleet_target import FleetTarget
from .interface import BatchInputs
from .takeover import ConfigOnlyLoader, fleet_target

_dspark = nemo_module("recipes.llm.train_dspark")
_target = nemo_module("components.speculative.dspark.target")
_common = nemo_module("components.speculative.dspark.common")
_types = nemo_module("components.speculative.dspark.target_utils")
BUILDER_MODEL_TYPES = frozenset(
    (_types.DEEPSEEK_V4_MODEL_TYPE, _types.DEEPSEEK_V41_MODEL_TYPE, _types.GLM_5_2_MODEL_TYPE)
    + tuple(_types.MINIMAX_M3_MODEL_TYPES)
    + tuple(_types.KIMI_K3_MODEL_TYPES)
)


class RemoteDSparkTarget(FleetTarget):
    """Duck-typed as NeMo's HFDSparkTargetModel."""

    # NeMo's layer -1 on an image-text target (multimodal): the token embedding before the image features are
    # merged in, which the fleet does not capture; the trainer looks it up in the embedding it holds (exact)
    token_embedding = False

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs):
        if self.token_embedding:  # -1 comes first: NeMo's ids are strictly increasing
            served = dspark_context(captured, self.target_layer_ids[1:], self.num_layers)
            embedded = self.get_input_embeddings()(inputs.input_ids.to(served.device))
            context = torch.cat((embedded, served), dim=-1)
        else:
            context = dspark_context(captured, self.target_layer_ids, self.num_layers)
        return _target.DSparkTargetBatch(
            target_hidden_states=context,
            target_last_hidden_states=captured["final_hidden"],
            input_ids=inputs.input_ids,
            loss_mask=inputs.loss_mask,
            position_ids=inputs.position_ids,
            seq_lens=inputs.seq_lens,
            doc_remaining=inputs.doc_remaining,
        )


def refuse_local_only(cfg) -> None:
    """One line, before anything slow, for what only NeMo's own recipe (with the target here) can do."""
    recipe_cfg = cfg.recipe_args
    if recipe_cfg.get("cached_target_path", None):
        raise ValueError("recipe_args.cached_target_path trains offline, without a target: use NeMo's recipe")
    config = AutoConfig.from_pretrained(
        recipe_cfg.target_model_name_or_path,
        trust_remote_code=bool(recipe_cfg.get("trust_remote_code", False)),
    )
    if recipe_cfg.get("multimodal", False):
        if config.model_type not in _types.MINIMAX_M3_MODEL_TYPES:
            raise ValueError(f"recipe_args.multimodal takes a MiniMax M3 VL target, not {config.model_type}")
        if recipe_cfg.get("target_num_hidden_layers", None):
            raise ValueError(
                "recipe_args.target_num_hidden_layers cuts NeMo's co-located target; the fleet serves the whole "
                "checkpoint: serve one with that many layers instead"
            )
        return
    if config.model_type in BUILDER_MODEL_TYPES:
        raise ValueError(
            f"a {config.model_type} target is loaded by NeMo's expert-parallel builder, which the fleet does "
            "not replace; it serves DSpark's NeMoAutoModelForCausalLM targets (Qwen3-style, Gemma4) and "
            "MiniMax M3 VL with recipe_args.multimodal: true"
        )


class TrainDSparkRecipe(FleetRecipe, _dspark.TrainDSparkRecipe):
    """NeMo's TrainDSparkRecipe, unchanged but for where the target runs: the eagle3-target fleet."""

    fleet_target = RemoteDSparkTarget

    sharded_axes = ("cp_size",)

    def __init__(self, cfg):
        refuse_local_only(cfg)
        super().__init__(cfg)

    def fleet_setup(self):
        # NeMoAutoModelForImageTextToText: a MiniMax M3 VL target (multimodal), whose device mesh NeMo builds
        # for the target alone (the draft's is its own): neither on the trainer
        return fleet_target(
            _dspark,
            "HFDSparkTargetModel",
            self._fleet_wrapper,
            NeMoAutoModelForImageTextToText=ConfigOnlyLoader,
            create_distributed_setup_from_config=lambda *_args, **_kwargs: None,
        )

    def _fleet_wrapper(self, config_only, *, target_layer_ids, cp_mesh=None) -> RemoteDSparkTarget:
        config = config_only.config
        num_layers = int((getattr(config, "text_config", None) or config).num_hidden_layers)
        layer_ids = _common.validate_target_layer_ids(list(target_layer_ids), num_layers)
        if not (self.cfg.recipe_args.get("multimodal", False) and layer_ids[0] == -1):
            return self.open_fleet_target(layer_ids, num_layers)
        target = self.open_fleet_target(layer_ids[1:], num_layers)  # the fleet's -1 has the images merged in
        target.target_layer_ids, target.token_embedding = layer_ids, True
        return target
