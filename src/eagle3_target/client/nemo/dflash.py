"""NeMo's DFlash-family recipes (DFlash, Domino, DFlash 2; JetSpec in jetspec.py) with the fleet as their target.

Each is NeMo's own recipe with two hooks replaced: ``_build_target_model`` reads only the target's config
(the trainer pod downloads no weights) and ``_build_target_wrapper`` returns the family's FleetTarget, which
the recipe calls as it calls NeMo's HFDFlashTargetModel. The input embeddings and the lm_head, which the
draft's trainer uses live every step, come from the fleet once, onto the trainer's device. YAML: NeMo's own
for the recipe, plus the ``remote_target:`` section (remote.py).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from ._imports import nemo_module
from .fleet_recipe import FleetRecipe
from .fleet_target import FleetTarget
from .interface import BatchInputs

_target = nemo_module("components.speculative.dflash.target")
_dist_utils = nemo_module("recipes._dist_utils")
_dflash = nemo_module("recipes.llm.train_dflash")
_domino = nemo_module("recipes.llm.train_domino")
_dflash2 = nemo_module("recipes.llm.train_dflash2")


class RemoteTargetModel(torch.nn.Module):
    """What a DFlash recipe reads of its target model besides the forward: the config, the input embeddings
    and the lm_head (the FleetTarget's, frozen as NeMo freezes them)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens: torch.nn.Embedding | None = None
        self.lm_head: torch.nn.Linear | None = None

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


class RemoteDFlashTarget(FleetTarget):
    """NeMo's HFDFlashTargetModel as the recipe calls it, with the forward on the fleet."""

    def __init__(self, *args, model: RemoteTargetModel):
        super().__init__(*args)
        self.model = model
        model.embed_tokens, model.lm_head = self.get_input_embeddings(), self.get_output_embeddings()
        model.requires_grad_(False)

    def to_batch(self, captured: dict[str, torch.Tensor], inputs: BatchInputs):
        return _target.DFlashTargetBatch(
            hidden_states=captured["hidden_states"],
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            loss_mask=inputs.loss_mask,
            # what the target's forward does after its final norm: with compact, the same product, here
            logits=self.logits(captured) if self.compact or "logits" in captured else None,
            position_ids=inputs.position_ids,
            seq_lens=inputs.seq_lens,
            doc_remaining=inputs.doc_remaining,
        )


class RemoteDFlashRecipe(FleetRecipe):
    """Mixed in before one of NeMo's DFlash-family recipes: the target is the fleet."""

    fleet_target = RemoteDFlashTarget

    sharded_axes = ("tp_size", "cp_size", "pp_size", "ep_size")

    def _build_target_model(self, recipe_cfg, target_path: str, draft_spec) -> RemoteTargetModel:
        self._setup_draft_meshes()
        config = AutoConfig.from_pretrained(
            target_path, trust_remote_code=recipe_cfg.get("trust_remote_code", False)
        )
        return RemoteTargetModel(config)

    def _setup_draft_meshes(self) -> None:
        """NeMo's meshes for the draft's data parallelism; the fleet, not the trainer, shards the target."""
        self.dist_setup = self.device_mesh = self.dp_mesh = self.cp_mesh = None
        if self.cfg.get("distributed", None) is None:
            return
        self.dist_setup = _dist_utils.create_distributed_setup_from_config(
            self.cfg, world_size=self.dist_env.world_size
        )
        self.device_mesh = self.dist_setup.mesh_context.device_mesh
        self.dp_mesh = _dflash._submesh_or_none(self.device_mesh, "dp")

    def _build_target_wrapper(self, target_layer_ids: list[int]) -> RemoteDFlashTarget:
        config = _target.resolve_text_config(self.target_model.config.get_text_config())
        return self.open_fleet_target(
            target_layer_ids, int(config.num_hidden_layers), model=self.target_model
        )


class TrainDFlashRecipe(RemoteDFlashRecipe, _dflash.TrainDFlashRecipe):
    """NeMo's TrainDFlashRecipe, unchanged but for where the target runs: the eagle3-target fleet."""


class TrainDominoRecipe(RemoteDFlashRecipe, _domino.TrainDominoRecipe):
    """NeMo's TrainDominoRecipe, unchanged but for where the target runs: the eagle3-target fleet."""


class TrainDFlash2Recipe(RemoteDFlashRecipe, _dflash2.TrainDFlash2Recipe):
    """NeMo's TrainDFlash2Recipe, unchanged but for where the target runs: the eagle3-target fleet."""
