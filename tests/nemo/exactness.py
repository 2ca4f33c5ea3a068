"""Co-located against remote, for any NeMo recipe: run NeMo's own recipe with the target in-process (CPU shims
below) and our remote subclass against a fleet, from the same YAML, and compare every micro-batch loss (float32
bits) and every tensor of the saved draft.

A family is a `Family` (which NeMo recipe, its recipe_args, any CPU shim); a test module is then

    target = target_fixture("qwen3")                    # module-scoped fixtures: make_target, start_fleet
    fleet = fleet_fixture("127.0.0.2", "127.0.0.3")
    references = references_fixture({family.recipe: family})

and a test, given target and fleet,

    reference = run_colocated(family, target, tmp_path / "nemo")  # or references(family.recipe)
    ours = run_remote(family, target, [s.url for s in fleet], tmp_path / "ours")
    assert_exact(ours, reference)

The shims live here, never in the product: NeMo's loader calls torch.cuda.current_device(), so the co-located
target is loaded with transformers' AutoModelForCausalLM; `after_setup` is where a family switches a draft to
sdpa after setup() (flex attention has no CPU backward in torch 2.13).
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from nemo_automodel.components.config._arg_parser import parse_args_and_load_config
from safetensors.torch import load_file
from target_support import TargetProcess
from transformers import AutoModelForCausalLM

import eagle3_target.client.nemo as ours_module
from eagle3_target.client import RemoteTargetBackend

from .nemo_support import make_data

SEED = 42  # the caller's seed, given to torch before setup() in both runs
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class Target:
    """A target as the fleet holds it (`model`, with weights) and as a trainer pod sees it (`config_only`)."""

    model: Path
    chats: Path
    config_only: Path


@dataclass(frozen=True)
class Family:
    recipe: str  # NeMo's class name, which eagle3_target.client.nemo exports too
    nemo_module: str  # where NeMo defines it, e.g. "nemo_automodel.recipes.llm.train_dflash"
    recipe_args: dict[str, Any] = field(default_factory=dict)  # on top of common_recipe_args()
    after_setup: Callable[[Any], None] | None = None  # a CPU shim applied to both runs after setup()
    # the module whose NeMoAutoModelForCausalLM loads the target (a subclass's base recipe's; default: nemo_module)
    loader_module: str | None = None

    def nemo_class(self):
        return getattr(importlib.import_module(self.nemo_module), self.recipe)

    def our_class(self):
        return getattr(ours_module, self.recipe)


@dataclass
class Run:
    losses: torch.Tensor  # every micro-batch loss the trainer module returned, in order
    tensors: dict[str, torch.Tensor]  # the saved draft (consolidated safetensors)
    initial: dict[str, torch.Tensor]  # the draft right after setup()


class CpuAutoModel:
    """NeMo's co-located loader assumes CUDA; load the same checkpoint with transformers instead."""

    @staticmethod
    def from_pretrained(path, torch_dtype=torch.float32, trust_remote_code=False, **_):
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )


def make_target(root: Path, architecture: str, chats: int = 16) -> Target:
    """examples/nemo/make_data.py's tiny target (sharpened head, word-level tokenizer, chat template) and chats."""
    words = make_data.write_target(root / "model", architecture=architecture)
    make_data.write_conversations(root / "chats.jsonl", words, chats, seed=3)
    return Target(root / "model", root / "chats.jsonl", config_only_copy(root / "model", root / "trainer"))


def start_fleet(model: Path, hosts: list[str], *serve_args: str) -> list[TargetProcess]:
    """`eagle3-target serve --engine hf` processes on loopback addresses, ready."""
    servers = [TargetProcess(host, "--engine", "hf", "--model", str(model), *serve_args) for host in hosts]
    try:
        return [server.wait_ready() for server in servers]
    except BaseException:
        for server in servers:
            server.kill()
        raise


def target_fixture(architecture: str, **make):
    """A module's `target` fixture: make_target's tiny ``architecture`` target, built once per module."""

    @pytest.fixture(scope="module", name="target")
    def target(tmp_path_factory) -> Target:
        return make_target(tmp_path_factory.mktemp(architecture), architecture, **make)

    return target


def fleet_fixture(*hosts: str):
    """A module's `fleet` fixture: servers of its `target` on ``hosts``, killed after the module."""

    @pytest.fixture(scope="module", name="fleet")
    def fleet(target: Target):
        servers = start_fleet(target.model, list(hosts))
        yield servers
        for server in servers:
            server.kill()

    return fleet


def references_fixture(families: dict[str, Family]):
    """A module's `references` fixture: ``references(recipe)`` is NeMo's co-located run of that family,
    run once per module when first asked for."""

    @pytest.fixture(scope="module", name="references")
    def references(target: Target, tmp_path_factory):
        runs = {}

        def reference(recipe: str) -> Run:
            if recipe not in runs:
                runs[recipe] = run_colocated(
                    families[recipe], target, tmp_path_factory.mktemp(f"nemo-{recipe}")
                )
            return runs[recipe]

        return reference

    return references


def no_synchronous_capture(*_args, **_kwargs):
    """Patched over RemoteTargetBackend.capture: every batch's features must have been prefetched."""
    raise AssertionError("a batch's features were asked for when the loop reached it, not prefetched")


def config_only_copy(model: Path, dest: Path) -> Path:
    """What a trainer pod keeps of the target: config, tokenizer, chat template; no weight file."""
    shutil.copytree(model, dest, ignore=shutil.ignore_patterns(*(f"*{s}" for s in WEIGHT_SUFFIXES)))
    return dest


def weight_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES)]


def common_recipe_args(target_path: Path, chats: Path, out: Path) -> dict[str, Any]:
    return {
        "target_model_name_or_path": str(target_path),
        "train_data_path": str(chats),
        "seq_length": 32,
        "micro_batch_size": 2,
        "num_epochs": 1,
        "output_dir": str(out),
        "log_every_steps": 4,
    }


def recipe_yaml(family: Family, target_path: Path, chats: Path, out: Path, **sections) -> Path:
    """NeMo's YAML for the family; `sections` adds whole sections (remote_target=...)."""
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {**common_recipe_args(target_path, chats, out), **family.recipe_args},
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"checkpoint_dir": str(out / "checkpoints")},
        **sections,
    }
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def load_config(path: Path, *overrides: str):
    return parse_args_and_load_config(argv=["--config", str(path), *overrides])


def saved_draft(checkpoints: Path) -> dict[str, torch.Tensor]:
    """The consolidated (HF safetensors) draft of the one checkpoint a run wrote."""
    files = sorted(checkpoints.glob("epoch_*_step_*/model/consolidated/*.safetensors"))
    assert files, f"no consolidated draft under {checkpoints}"
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(f))
    return tensors


def train(
    recipe, family: Family, checkpoints: Path, on_micro_batch: Callable[[int], None] | None = None
) -> Run:
    """Seed, setup(), train; the losses as the trainer module returns them, the draft as the checkpoint has it.
    ``on_micro_batch(n)`` runs after the n-th micro-batch's forward (a test kills a server there)."""
    torch.manual_seed(SEED)
    recipe.setup()
    if family.after_setup is not None:
        family.after_setup(recipe)
    initial = {k: v.detach().clone() for k, v in recipe.draft_model.state_dict().items()}
    losses: list[torch.Tensor] = []

    def record(_module, _inputs, out) -> None:
        losses.append(out.loss.detach().float().clone())
        if on_micro_batch is not None:
            on_micro_batch(len(losses))

    hook = recipe.trainer_module.register_forward_hook(record)
    try:
        recipe.run_train_validation_loop()
    finally:
        hook.remove()
    assert losses, "the recipe ran no micro-batch"
    return Run(torch.stack(losses), saved_draft(checkpoints), initial)


def run_colocated(family: Family, target: Target, out: Path) -> Run:
    """NeMo's own recipe with the target in-process, on CPU."""
    cfg = load_config(recipe_yaml(family, target.model, target.chats, out))
    with pytest.MonkeyPatch.context() as mp:
        loader = importlib.import_module(family.loader_module or family.nemo_module)
        mp.setattr(loader, "NeMoAutoModelForCausalLM", CpuAutoModel)
        return train(family.nemo_class()(cfg), family, out / "checkpoints")


def run_remote(
    family: Family,
    target: Target,
    endpoints: list[str],
    out: Path,
    on_micro_batch: Callable[[int], None] | None = None,
    **remote_target,
) -> Run:
    """Our subclass of the same recipe, from the same YAML plus a remote_target section; the trainer's target
    folder holds no weights."""
    section = {"endpoints": ",".join(endpoints), "wait_timeout": 60, **remote_target}
    path = recipe_yaml(family, target.config_only, target.chats, out, remote_target=section)
    recipe = family.our_class()(load_config(path))
    run = train_closing(recipe, family, out / "checkpoints", on_micro_batch)
    assert not weight_files(target.config_only), "the trainer must not need the target's weights"
    return run


def train_closing(recipe, family: Family, checkpoints: Path, on_micro_batch=None) -> Run:
    """train(), then close the recipe's fleet target, if it has one (NeMo's co-located recipes have none)."""
    try:
        return train(recipe, family, checkpoints, on_micro_batch)
    finally:
        close = getattr(getattr(recipe, "target_wrapper", None), "close", None)
        if close is not None:
            close()


def run_prefetched(
    family: Family, target: Target, fleet: list[TargetProcess], out: Path, monkeypatch, **remote_target
) -> Run:
    """run_remote on the whole fleet, failing if a batch's features are asked for only when the loop reaches
    it (they must be prefetched); every server must have served."""
    before = [s.generated() for s in fleet]
    monkeypatch.setattr(RemoteTargetBackend, "capture", no_synchronous_capture)
    ours = run_remote(family, target, [s.url for s in fleet], out, **remote_target)
    assert all(s.generated() > b for s, b in zip(fleet, before, strict=True)), "every server must serve"
    return ours


def killing_after_third(victim: TargetProcess) -> Callable[[int], None]:
    """An ``on_micro_batch`` that SIGKILLs ``victim`` after the third micro-batch, once it has served."""

    def kill(micro_batch: int) -> None:
        if micro_batch == 3:
            assert victim.generated() > 0, "the victim must have served before it dies"
            victim.kill()

    return kill


def run_losing_a_server(family: Family, target: Target, survivor: TargetProcess, out: Path) -> Run:
    """run_remote on ``survivor`` and a server of its own (127.0.0.4), SIGKILLed mid-run."""
    victim = start_fleet(target.model, ["127.0.0.4"])[0]
    try:
        ours = run_remote(
            family,
            target,
            [survivor.url, victim.url],
            out,
            on_micro_batch=killing_after_third(victim),
            deadline=120,
        )
        assert victim.process.returncode == -9
    finally:
        victim.kill()
    return ours


def assert_trains(run: Run) -> None:
    """Equality proves little unless the reference moved."""
    assert len(run.losses) >= 2
    assert any(not torch.equal(run.tensors[k], v) for k, v in run.initial.items() if k in run.tensors)


def assert_exact(got: Run, reference: Run) -> None:
    assert_trains(reference)
    assert got.losses.shape == reference.losses.shape, (got.losses, reference.losses)
    assert torch.equal(got.losses.view(torch.int32), reference.losses.view(torch.int32)), (
        got.losses,
        reference.losses,
    )
    assert got.tensors.keys() == reference.tensors.keys()
    for name, value in reference.tensors.items():
        assert torch.equal(got.tensors[name], value), name
