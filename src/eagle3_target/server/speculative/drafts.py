"""A draft checkpoint, found under --draft-dir-root and built with NeMo's own draft class.

A path names either a checkpoint folder `train-draft` (NeMo's recipe) writes, epoch_E_step_S/ with its
model/consolidated/{config.json, model.safetensors.index.json and its shards}, or the checkpoint dir holding such folders (the newest is
taken), or the consolidated folder itself, as NeMo's serve_vllm.resolve_draft_artifacts accepts. The draft is
built by NeMo's LlamaEagle3DraftModel from its config, so it has the one decoder layer its weights hold, whatever
`num_hidden_layers` the config keeps from the target (docs/evaluate.md).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import Forbidden, InvalidInput, OutOfRange
from ..runners import RunnerInfo

log = logging.getLogger(__name__)

EAGLE3_ARCHITECTURE = "LlamaEagle3DraftModel"  # what NeMo's EAGLE-3 recipe writes for its dense drafts
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"  # NeMo's consolidated checkpoint: shards named by this index
_CHECKPOINT = re.compile(r"epoch_(\d+)_step_(\d+)")
_SUBDIRS = (".", "model", "model/consolidated", "consolidated")


@dataclass
class Draft:
    """A loaded EAGLE-3 draft, on the target's device and in its dtype."""

    model: nn.Module  # NeMo's LlamaEagle3DraftModel
    path: Path  # the consolidated folder it was read from
    d2t: torch.Tensor | None  # draft id -> target id offset; None: the draft's vocabulary is the target's

    @torch.inference_mode()
    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]


def resolve(root: Path | None, asked: object) -> Path:
    """The consolidated folder ``asked`` names under ``root``; Forbidden without a root, InvalidInput otherwise."""
    if root is None:
        raise Forbidden(
            "speculative_disabled", "this server reads no drafts: start it with --draft-dir-root DIR"
        )
    if not isinstance(asked, str) or not asked:
        raise InvalidInput("invalid_draft", "'draft' must be a path under the server's --draft-dir-root")
    base = root.resolve()
    path = (base / asked).resolve()
    if not path.is_relative_to(base):
        raise Forbidden("draft_outside_root", f"draft {asked!r} is not under the server's --draft-dir-root")
    if not path.is_dir():
        raise InvalidInput(
            "draft_not_found", f"no draft folder {asked!r} under the server's --draft-dir-root"
        )
    checkpoints = [
        (tuple(map(int, m.groups())), p) for p in path.iterdir() if (m := _CHECKPOINT.fullmatch(p.name))
    ]
    if checkpoints:
        path = max(checkpoints)[1]  # a checkpoint dir: its newest checkpoint
    for sub in _SUBDIRS:
        folder = path / sub
        if (folder / "config.json").is_file() and weight_files(folder):
            return folder
    raise InvalidInput(
        "draft_not_found",
        f"draft {asked!r} holds no config.json with {WEIGHTS} or {INDEX} (looked in {', '.join(_SUBDIRS)})",
    )


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a draft: the one file, or the shards its index names (all present)."""
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    try:
        names = json.loads((folder / INDEX).read_text())["weight_map"].values()
        shards = sorted({folder / name for name in names})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return shards if shards and all(f.is_file() and f.parent == folder for f in shards) else []


def load(folder: Path, info: RunnerInfo) -> Draft:
    """Build the draft in ``folder`` for the target ``info`` describes; a draft for another target is refused."""
    from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    check_architecture(getattr(config, "architectures", None), getattr(config, "parallel_drafting", False))
    check_fits(int(config.vocab_size), int(getattr(config, "target_hidden_size", config.hidden_size)), info)
    model = LlamaEagle3DraftModel(config)
    try:
        model.load_state_dict(
            {k: v for f in weight_files(folder) for k, v in load_file(f).items()}, strict=True
        )
    except RuntimeError as exc:
        raise InvalidInput("draft_weights_mismatch", str(exc).splitlines()[0][:300]) from None
    model = model.to(device=info.device, dtype=info.dtype).eval().requires_grad_(False)
    d2t = model.d2t if model.has_vocab_compression else None
    log.info("draft %s loaded (vocab %d of %d)", folder, model.draft_vocab_size, info.vocab_size)
    return Draft(model, folder, d2t)


def check_architecture(architectures: list[str] | None, parallel_drafting: bool) -> None:
    """An EAGLE-3 draft of NeMo's dense class, or InvalidInput naming what it is instead."""
    if (architectures or []) != [EAGLE3_ARCHITECTURE] or parallel_drafting:
        raise InvalidInput(
            "draft_not_supported",
            f"the draft's architectures {architectures or []} are not an EAGLE-3 draft ({EAGLE3_ARCHITECTURE}, "
            "no parallel drafting); see docs/evaluate.md for the families evaluated",
        )


def check_fits(vocab_size: int, target_hidden_size: int, info: RunnerInfo) -> None:
    """The draft was trained for this target: its vocabulary, its hidden size, three aux layers."""
    wants = {
        "vocab_size": (vocab_size, info.vocab_size),
        "hidden_size": (target_hidden_size, info.hidden_size),
    }
    for name, (draft, target) in wants.items():
        if draft != target:
            raise OutOfRange(
                "draft_mismatch", f"the draft was trained for a target {name} {draft}, not {target}"
            )
    if len(info.aux_layer_ids) != 3:
        raise OutOfRange(
            "draft_mismatch", f"an EAGLE-3 draft reads 3 aux layers; this server has {info.aux_layer_ids}"
        )


class DraftCache:
    """The last draft loaded, kept while its weights file is unchanged (an evaluation sends many requests)."""

    def __init__(self):
        self._key: tuple | None = None
        self._draft: Draft | None = None
        self._lock = threading.Lock()

    def get(self, folder: Path, info: RunnerInfo) -> Draft:
        key = (folder, *((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in weight_files(folder)))
        with self._lock:
            if key != self._key:
                self._draft, self._key = None, None
                self._draft, self._key = load(folder, info), key
            return self._draft
