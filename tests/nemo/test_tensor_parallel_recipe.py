"""NeMo's TrainEagle3Recipe, remote, against an hf server split over 2 ranks (tensor parallel) trains as it does
against one device: 16 micro-batches, every loss within 1e-4 relative (all-reduce reorders additions, so not
bit for bit; docs/parallel.md)."""

import torch
from parallel_support import TOLERANCE

from .exactness import Family, make_target, run_remote, start_fleet

EAGLE3 = Family(
    "TrainEagle3Recipe", "nemo_automodel.recipes.llm.train_eagle3", {"ttt_steps": 2, "draft_vocab_size": 128}
)


def test_a_tensor_parallel_target_trains_the_draft_as_one_device_does(tmp_path):
    target = make_target(tmp_path / "target", "llama", chats=32)  # 32 chats, 2 a micro-batch: 16 steps
    (one,) = start_fleet(target.model, ["127.0.0.2"])
    (split,) = start_fleet(target.model, ["127.0.0.3"], "--tensor-parallel-size", "2")
    try:
        reference = run_remote(EAGLE3, target, [one.url], tmp_path / "one")
        ours = run_remote(EAGLE3, target, [split.url], tmp_path / "split")
    finally:
        one.kill()
        split.kill()
    assert len(reference.losses) == 16
    # rtol alone: a micro-batch with no assistant token has loss 0 in both runs
    assert torch.allclose(ours.losses, reference.losses, rtol=TOLERANCE, atol=0), (
        ours.losses,
        reference.losses,
    )
    nonzero = reference.losses != 0
    gap = ((ours.losses - reference.losses)[nonzero].abs() / reference.losses[nonzero]).max().item()
    print(f"16 losses, largest relative gap {gap:.2e}")
