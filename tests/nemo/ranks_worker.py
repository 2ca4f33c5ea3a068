"""One rank of a torchrun job: NeMo's co-located recipe or our remote one, from the exactness harness's YAML.

    python -m torch.distributed.run --nproc-per-node 2 tests/nemo/ranks_worker.py FAMILY MODE TARGET OUT \
        [--packed N] [--endpoints URL,URL]

Writes OUT/rank<R>.pt: every micro-batch loss of this rank, its draft after training, and how long setup() took.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tests.nemo import exactness  # noqa: E402
from tests.nemo.test_dspark_family import DSPARK  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

FAMILIES = {
    "eagle3": exactness.Family(
        "TrainEagle3Recipe",
        "nemo_automodel.recipes.llm.train_eagle3",
        {"ttt_steps": 2, "draft_vocab_size": 128},
    ),
    "dflash": exactness.Family(
        "TrainDFlashRecipe",
        "nemo_automodel.recipes.llm.train_dflash",
        dict(
            draft_num_hidden_layers=1, block_size=4, num_anchors=8, mask_token_id=3, attention_backend="sdpa"
        ),
    ),
    # the embeddings and the lm_head, copied into the draft at setup; sdpa after setup() (test_dspark_family)
    "dspark": DSPARK,
}


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("mode", choices=("colocated", "remote"))
    parser.add_argument("target", type=Path)  # make_target's root: model/, trainer/ (no weights), chats.jsonl
    parser.add_argument("out", type=Path)
    parser.add_argument("--packed", type=int, default=0)
    parser.add_argument("--endpoints", default="")
    args = parser.parse_args()
    family = FAMILIES[args.family]
    if args.packed:
        family = dataclasses.replace(
            family, recipe_args={**family.recipe_args, "packed_sequence_size": args.packed}
        )
    root = args.target
    if args.mode == "colocated":
        path = exactness.recipe_yaml(family, root / "model", root / "chats.jsonl", args.out)
        loader = __import__(family.nemo_module, fromlist=["x"])
        loader.NeMoAutoModelForCausalLM = exactness.CpuAutoModel
        recipe = family.nemo_class()(exactness.load_config(path))
    else:
        section = {"endpoints": args.endpoints, "wait_timeout": 60}
        path = exactness.recipe_yaml(
            family, root / "trainer", root / "chats.jsonl", args.out, remote_target=section
        )
        recipe = family.our_class()(exactness.load_config(path))
    losses: list[torch.Tensor] = []
    torch.manual_seed(exactness.SEED)
    start = time.perf_counter()
    recipe.setup()
    setup_seconds = time.perf_counter() - start
    if family.after_setup is not None:
        family.after_setup(recipe)
    recipe.trainer_module.register_forward_hook(
        lambda _m, _i, out: losses.append(out.loss.detach().float().clone())
    )
    recipe.run_train_validation_loop()
    # FSDP2 (DSpark) shards the draft as DTensors: gathered whole on every rank, in the same order
    draft = {k: full(v).detach().clone() for k, v in recipe.draft_model.state_dict().items()}
    result = {"losses": torch.stack(losses), "draft": draft, "setup_seconds": setup_seconds}
    torch.save(result, args.out / f"rank{dist.get_rank()}.pt")


if __name__ == "__main__":
    main()
