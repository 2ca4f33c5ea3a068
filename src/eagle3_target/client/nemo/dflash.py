"""NeMo's DFlash-family recipes (DFlash, JetSpec, Domino, DFlash 2) with the fleet as their target.

Each is NeMo's own recipe with two hooks replaced: ``_build_target_model`` reads only the target's config
(the trainer pod downloads no weights) and ``_build_target_wrapper`` returns `RemoteDFlashTarget`, which the
recipe calls as it calls NeMo's HFDFlashTargetModel. The input embeddings and the lm_head, which the draft's
trainer uses live every step, come from the fleet once, onto the trainer's device. YAML: NeMo's own for the
recipe, plus the ``remote_target:`` section (remote.py).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig

from eagle3_target.protocol.families import Family, by_recipe
from eagle3_target.protocol.features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD

from ..backend import RemoteTargetBackend
from ._imports import nemo_module
from .features import open_backend
from .prefetch import PrefetchedBatches, depth_setting
from .remote import RemoteTargetSection

_target = nemo_module("components.speculative.dflash.target")
_dist_utils = nemo_module("recipes._dist_utils")
_dflash = nemo_module("recipes.llm.train_dflash")
_jetspec = nemo_module("recipes.llm.train_jetspec")
_domino = nemo_module("recipes.llm.train_domino")
_dflash2 = nemo_module("recipes.llm.train_dflash2")


class RemoteTargetModel(torch.nn.Module):
    """What a DFlash recipe reads of its target model besides the forward: the config, the input embeddings
    and the lm_head (`frozen_weights` fills them from the fleet)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens: torch.nn.Embedding | None = None
        self.lm_head: torch.nn.Linear | None = None

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


class RemoteDFlashTarget:
    """NeMo's HFDFlashTargetModel as the recipe calls it, with the forward on the fleet."""

    def __init__(
        self,
        backend: RemoteTargetBackend,
        target_layer_ids: list[int],
        prefetched: PrefetchedBatches,
        model: RemoteTargetModel,
        compact: bool = False,
    ):
        self.backend = backend
        self.model = model
        self.target_layer_ids = list(target_layer_ids)  # NeMo saves them in dflash_meta.pt
        self.prefetched = prefetched
        self.compact = compact  # the reply has the final hidden state; the logits are computed here

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.get_input_embeddings()

    @torch.no_grad()
    def generate_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
    ):
        captured = self.prefetched.take(input_ids, attention_mask, loss_mask, position_ids, seq_lens)
        if self.compact:
            # What the target's forward does after its final norm: the same product, on the trainer.
            captured["logits"] = self.model.get_output_embeddings()(captured.pop("final_hidden"))
        return _target.DFlashTargetBatch(
            hidden_states=captured["hidden_states"],
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            logits=captured.get("logits"),
            position_ids=position_ids,
            seq_lens=seq_lens,
            doc_remaining=doc_remaining,
        )

    def close(self) -> None:
        self.prefetched.cancel()
        self.backend.close()


def frozen_weights(model: RemoteTargetModel, weights: dict[str, torch.Tensor], device: torch.device) -> None:
    """The embeddings and the lm_head (open_backend's, fetched once per job onto the trainer's device),
    frozen as NeMo freezes them."""
    embed, head = weights[WEIGHT_INPUT_EMBEDDINGS], weights[WEIGHT_LM_HEAD]
    model.embed_tokens = torch.nn.Embedding.from_pretrained(embed, freeze=True)
    # skip_init: a Linear's own init would draw from torch's global RNG, which NeMo's recipe draws the draft's
    # initial weights from next; the co-located recipe draws nothing here.
    model.lm_head = torch.nn.utils.skip_init(
        torch.nn.Linear, head.shape[1], head.shape[0], bias=False, device=device, dtype=head.dtype
    )
    with torch.no_grad():
        model.lm_head.weight.copy_(head)
    model.requires_grad_(False)


class RemoteDFlashRecipe(RemoteTargetSection):
    """Mixed in before one of NeMo's DFlash-family recipes: the target is the fleet."""

    family: Family
    recipe_keys = ("prefetch_depth", "compact")

    def _build_target_model(self, recipe_cfg, target_path: str, draft_spec) -> RemoteTargetModel:
        self._setup_draft_meshes()
        config = AutoConfig.from_pretrained(
            target_path, trust_remote_code=recipe_cfg.get("trust_remote_code", False)
        )
        return RemoteTargetModel(config)

    def __init__(self, cfg):
        for axis in ("tp_size", "cp_size", "pp_size", "ep_size"):
            if int(cfg.get(f"distributed.{axis}", 1) or 1) > 1:
                raise ValueError(
                    f"distributed.{axis}>1 shards a co-located target; with remote_target the fleet holds the "
                    "target, so the trainer takes only data parallelism (leave it at 1)"
                )
        super().__init__(cfg)
        self.prefetch_depth = depth_setting(self.recipe_settings.get("prefetch_depth"))
        self.compact = self.recipe_settings.get("compact", False)
        if not isinstance(self.compact, bool):
            raise ValueError(f"remote_target.compact={self.compact!r}: true or false")
        if self.compact and self.family.compact is None:
            raise ValueError(
                f"remote_target.compact: {type(self).__name__} has no compact request; its exact one is small"
            )

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

    def num_target_layers(self) -> int:
        return int(_target.resolve_text_config(self.target_model.config.get_text_config()).num_hidden_layers)

    def _build_target_wrapper(self, target_layer_ids: list[int]) -> RemoteDFlashTarget:
        backend, weights = open_backend(
            self.family,
            self.device,
            self.remote_target,
            target_layer_ids,
            self.num_target_layers(),
            self.compact,
        )
        frozen_weights(self.target_model, weights, self.device)
        prefetched = PrefetchedBatches(backend, self.prefetch_depth)
        return RemoteDFlashTarget(backend, target_layer_ids, prefetched, self.target_model, self.compact)

    def run_train_validation_loop(self):
        try:
            super().run_train_validation_loop()
        finally:
            self.target_wrapper.close()  # ends our sessions on the servers, as NeMo's EAGLE-3 recipe does

    def setup(self):
        super().setup()
        self.target_wrapper.prefetched.wrap_loaders(self)


class TrainDFlashRecipe(RemoteDFlashRecipe, _dflash.TrainDFlashRecipe):
    """NeMo's TrainDFlashRecipe, unchanged but for where the target runs: the eagle3-target fleet."""

    family = by_recipe("TrainDFlashRecipe")


class TrainJetSpecRecipe(RemoteDFlashRecipe, _jetspec.TrainJetSpecRecipe):
    """NeMo's TrainJetSpecRecipe on the fleet, which sends the full-vocabulary logits too."""

    family = by_recipe("TrainJetSpecRecipe")


class TrainDominoRecipe(RemoteDFlashRecipe, _domino.TrainDominoRecipe):
    """NeMo's TrainDominoRecipe, unchanged but for where the target runs: the eagle3-target fleet."""

    family = by_recipe("TrainDominoRecipe")


class TrainDFlash2Recipe(RemoteDFlashRecipe, _dflash2.TrainDFlash2Recipe):
    """NeMo's TrainDFlash2Recipe, unchanged but for where the target runs: the eagle3-target fleet."""

    family = by_recipe("TrainDFlash2Recipe")
