"""The private parts of NeMo AutoModel 0.7.0 that the adapters override or call, each with its parameters
there, and the module names their takeovers swap for the length of ``setup()`` (takeover.py, vispec.py).

NeMo promises nothing about them. tests/nemo/test_nemo_hooks.py checks each against the installed NeMo
(``inspect.signature``, annotations aside) and that every private method an adapter overrides is listed,
so an upgrade that moves one fails in that one test, naming it, and not mid-run. Keys are
``"module under nemo_automodel:qualified name"``. Names only: nothing here imports NeMo.
"""

from __future__ import annotations

PRIVATE_HOOKS = {
    # EAGLE-3 and P-EAGLE (eagle3.py): where the recipe builds its target, and the gates it keeps
    "recipes.llm.train_eagle3:TrainEagle3Recipe._setup_online_target": "(self, recipe_cfg, target_path, draft_base_config)",
    "recipes.llm.train_eagle3:TrainEagle3Recipe._setup_remote_target": "(self, recipe_cfg)",
    "recipes.llm.train_eagle3:TrainEagle3Recipe._setup_colocated_target": "(self, recipe_cfg, target_path, draft_base_config)",
    "recipes.llm.train_eagle3:TrainEagle3Recipe._prefetched_batches": "(self, dataloader)",
    "recipes.llm.train_eagle3:_validate_cp_gates": (
        "(cp_size, backend, packed_sequence_size, target_force_hf=False, target_attn_implementation=None, "
        "seq_length=None, cp_zigzag=False, cp_mode='ring')"
    ),
    "recipes.llm.train_eagle3:_validate_tp_gates": "(tp_size, backend, cp_size)",
    # regen: and decode_eval: on the fleet (fleet_cycles.py): the runners' setup and the end of training
    "recipes.llm.train_eagle3:TrainEagle3Recipe._setup_regen": "(self, recipe_cfg, target_path)",
    "recipes.llm.train_eagle3:TrainEagle3Recipe._train_epochs": "(self, start_epoch, is_ddp, pbar=None)",
    "recipes.llm.train_eagle3:TrainEagle3Recipe._finalize_training": "(self)",
    # the DFlash family (dflash.py, jetspec.py): the target model, its wrapper and the draft's mesh
    "recipes.llm.train_dflash:_submesh_or_none": "(device_mesh, name)",
    "recipes.llm.train_dflash:TrainDFlashRecipe._build_target_model": "(self, recipe_cfg, target_path, draft_spec)",
    "recipes.llm.train_dflash:TrainDFlashRecipe._build_target_wrapper": "(self, target_layer_ids)",
    "recipes.llm.train_domino:TrainDominoRecipe._build_target_model": "(self, recipe_cfg, target_path, draft_spec)",
    "recipes.llm.train_domino:TrainDominoRecipe._build_target_wrapper": "(self, target_layer_ids)",
    "recipes.llm.train_dflash2:TrainDFlash2Recipe._build_target_model": "(self, recipe_cfg, target_path, draft_spec)",
    "recipes.llm.train_dflash2:TrainDFlash2Recipe._build_target_wrapper": "(self, target_layer_ids)",
    "recipes.llm.train_jetspec:TrainJetSpecRecipe._build_target_model": "(self, recipe_cfg, target_path, draft_spec)",
    "recipes.llm.train_jetspec:TrainJetSpecRecipe._build_target_wrapper": "(self, target_layer_ids)",
}

SWAPPED_NAMES = {
    "recipes.llm.train_eagle1": ("NeMoAutoModelForCausalLM", "HFEagleTargetModel"),
    "recipes.llm.train_dspark": (
        "NeMoAutoModelForCausalLM",
        "NeMoAutoModelForImageTextToText",
        "HFDSparkTargetModel",
        "create_distributed_setup_from_config",
    ),
    "recipes.llm.train_vispec": (
        "AutoModelForImageTextToText",
        "raise_if_target_not_materialized",
        "HFVispecTargetModel",
        "HFEagleTargetModel",
    ),
}
