"""NeMo's ``regen:`` and ``decode_eval:`` cycles with the fleet as their engine.

NeMo's RegenRunner and DecodeEvalRunner (components/speculative/) launch, on a cadence, a worker process that
boots a vLLM server on a reserved GPU (``cuda_visible_devices``). Here only that launch differs: the worker
(regen_worker.py, eval_worker.py) asks the fleet the trainer already trains against, and sees no GPU. The
cadence, the one-cycle-at-a-time rule, the READY marker, the epoch-boundary swap and the result collection are
NeMo's own code. A cycle still running when training ends is waited for, up to its ``timeout_s``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from eagle3_target.protocol.contract import SERVICE_ENV, TOKEN_FILE_ENV

from ._imports import nemo_module

_regen = nemo_module("components.speculative.regen_loop")
_eval = nemo_module("components.speculative.decode_eval")

log = logging.getLogger(__name__)

BLOCKS = ("regen", "decode_eval")  # recipe_args sections whose worker the fleet replaces
NO_GPU = "none: the fleet runs it"  # what NeMo's resolver is given for the GPU these cycles no longer need


def fleet_blocks(cfg) -> None:
    """Let NeMo's resolvers read each enabled block without a reserved GPU: a ``cuda_visible_devices`` given is
    ignored (one INFO line), an absent one is filled with NO_GPU, which no worker here reads."""
    for name in BLOCKS:
        block = cfg.get(f"recipe_args.{name}", None)
        if block is None or int(block.get("every_steps", 0) or 0) <= 0:
            continue
        given = block.get("cuda_visible_devices", None)
        if given not in (None, "", NO_GPU):
            log.info(
                "%s.cuda_visible_devices=%s is ignored: the eagle3-target fleet runs this cycle", name, given
            )
        cfg.set_by_dotted(f"recipe_args.{name}.cuda_visible_devices", NO_GPU)


@dataclass(frozen=True)
class FleetAccess:
    """How a worker reaches the fleet: the trainer's endpoint spec, DNS server and token file."""

    endpoints: str
    nameserver: str | None = None
    token_file: str | None = None
    draft_root: str = ""  # the servers' --draft-dir-root as the trainer mounts it (decode_eval)

    def argv(self) -> list[str]:
        return ["--nameserver", self.nameserver] if self.nameserver else []

    def env(self) -> dict[str, str]:
        """NeMo's worker environment (no torchrun state), no GPU visible, and the fleet to ask."""
        env = _eval._worker_env("")
        env[SERVICE_ENV] = self.endpoints
        if self.token_file:
            env[TOKEN_FILE_ENV] = self.token_file
        else:
            env.pop(TOKEN_FILE_ENV, None)
        return env


class FleetWorker:
    """What both runners share: the launch of a worker module, and the wait for it once training ends. The
    state fields are NeMo's (both of its runners keep the same ones)."""

    worker_module = ""
    access: FleetAccess

    def _start(self, global_step: int, work_dir: str, args: list[str]) -> None:
        config_json = os.path.join(work_dir, "fleet_config.json")
        with open(config_json, "w") as f:
            json.dump(dataclasses.asdict(self.config), f, indent=2)
        argv = [
            sys.executable,
            "-m",
            self.worker_module,
            "--config-json",
            config_json,
            *args,
        ]
        log_path = os.path.join(work_dir, "worker.log")
        with open(log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, env=self.access.env(), start_new_session=True
            )
        self._last_bucket = global_step // self.config.every_steps
        self._launched_for_step = global_step
        self._worker_log_path = log_path
        log.info(
            "%s: launched for step %d on the fleet (pid %d, log %s)",
            self.name,
            global_step,
            self._proc.pid,
            log_path,
        )

    def _running(self, global_step: int) -> bool:
        self._reap_finished_worker()
        if self._proc is None:
            return False
        log.info(
            "%s: the cycle for step %d still runs; none launched at step %d",
            self.name,
            self._launched_for_step,
            global_step,
        )
        return True

    def wait(self) -> bool:
        """Once training ends: wait for a running cycle up to its timeout_s; whether none is left running."""
        self._reap_finished_worker()  # one that ended during training is reported as NeMo reports it
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout=self.config.timeout_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "%s: the cycle for step %d passed timeout_s=%s; NeMo's shutdown stops it",
                self.name,
                self._launched_for_step,
                self.config.timeout_s,
            )
            return False
        log.info(
            "%s: the cycle for step %d ended after training (exit code %d)",
            self.name,
            self._launched_for_step,
            self._proc.returncode,
        )
        return True


class FleetRegenRunner(FleetWorker, _regen.RegenRunner):
    """NeMo's RegenRunner whose cycle regenerates against the fleet (regen_worker.py)."""

    name = "regen"
    worker_module = "eagle3_target.client.nemo.regen_worker"

    def __init__(self, config, access: FleetAccess):
        super().__init__(config)
        self.access = access

    def maybe_launch(self, global_step: int) -> bool:
        if not self.due(global_step) or self._running(global_step):
            return False
        cycle_dir = os.path.join(self.config.output_dir, f"cycle_{global_step}")
        self._remove_cycle(cycle_dir)  # a crashed cycle's leftovers are never reused (NeMo's rule)
        os.makedirs(cycle_dir)
        self._start(
            global_step,
            cycle_dir,
            ["--cycle-dir", cycle_dir, "--step", str(global_step), *self.access.argv()],
        )
        return True

    def wait(self) -> bool:
        running = self._proc is not None and self._proc.poll() is None  # not one swapped in during training
        done = super().wait()
        ready = os.path.join(self.config.output_dir, f"cycle_{self._launched_for_step}", "READY")
        if running and done and os.path.exists(ready):
            log.info(
                "regen: cycle %d is ready at %s; training has ended, so it is not trained on",
                self._launched_for_step,
                os.path.dirname(ready),
            )
        return done


class FleetDecodeEvalRunner(FleetWorker, _eval.DecodeEvalRunner):
    """NeMo's DecodeEvalRunner whose snapshot the fleet evaluates (eval_worker.py)."""

    name = "decode_eval"
    worker_module = "eagle3_target.client.nemo.eval_worker"

    def __init__(self, config, access: FleetAccess):
        super().__init__(config)
        self.access = access

    def maybe_launch(self, global_step: int, draft_model) -> bool:
        if not self.due(global_step) or self._running(global_step):
            return False
        step_dir = os.path.join(self.config.output_dir, f"step_{global_step}")
        result = os.path.join(step_dir, "result.json")
        os.makedirs(step_dir, exist_ok=True)
        for stale in (result, result + ".tmp"):  # a relaunched step's old result is not this one's
            if os.path.exists(stale):
                os.remove(stale)
        self._collected.discard(result)
        self._cleanup_snapshot(step_dir)
        try:
            _eval.export_draft_snapshot(draft_model, step_dir)
            args = ["--draft", step_dir, "--step", str(global_step), "--result-json", result]
            self._start(global_step, step_dir, [*args, "--draft-root", self.access.draft_root])
        except Exception:
            self._cleanup_snapshot(step_dir)
            raise
        return True


def fleet_access(cfg, settings) -> FleetAccess:
    """The fleet a recipe's remote_target names (RemoteTargetSettings ``settings``), for its workers."""
    endpoints = settings.endpoints if isinstance(settings.endpoints, str) else ",".join(settings.endpoints)
    token_file = cfg.get("remote_target.auth_token_file", None) or os.environ.get(TOKEN_FILE_ENV) or None
    root = settings.draft_root or ""
    return FleetAccess(endpoints, settings.client_options.get("nameserver"), token_file, root)


def check_eval(cfg, draft_root: str | None) -> None:
    """The fleet evaluates greedily a snapshot it can read: refuse, before setup, a decode_eval it could not run."""
    block = cfg.get("recipe_args.decode_eval", None)
    if block is None or int(block.get("every_steps", 0) or 0) <= 0:
        return
    if bool(cfg.get("recipe_args.parallel_drafting", False)):
        raise ValueError(
            "decode_eval with parallel_drafting: the fleet evaluates EAGLE-3's one-token-at-a-time drafts, "
            "not P-EAGLE's; leave decode_eval out (or every_steps: 0)"
        )
    temperature = block.get("temperature", None)
    if temperature not in (None, 0, 0.0):
        raise ValueError(
            f"decode_eval.temperature={temperature}: the fleet evaluates greedy decoding, where "
            "speculative decoding is lossless; leave it at 0"
        )
    if not draft_root:
        raise ValueError(
            "decode_eval on the fleet: set remote_target.draft_root to the folder the servers read drafts from "
            "(their --draft-dir-root, a shared volume, as mounted here), with recipe_args.output_dir under it"
        )
    snapshots = os.path.realpath(str(cfg.get("recipe_args.output_dir", None) or "."))
    if os.path.commonpath([snapshots, os.path.realpath(draft_root)]) != os.path.realpath(draft_root):
        raise ValueError(
            f"decode_eval writes its snapshots under {snapshots}, which is not under "
            f"remote_target.draft_root={draft_root}: the servers could not read them; put "
            "recipe_args.output_dir under it"
        )


class FleetCycles:
    """Mixed in before FleetRecipe in a recipe with NeMo's regen and decode_eval runners (EAGLE-3): the
    runners NeMo builds are swapped for the fleet's, and a cycle running when training ends is waited for."""

    def __init__(self, cfg):
        fleet_blocks(cfg)
        super().__init__(cfg)
        check_eval(cfg, self.remote_target.draft_root)

    def _setup_regen(self, recipe_cfg, target_path) -> None:
        super()._setup_regen(recipe_cfg, target_path)
        if self.regen_runner is not None:
            self.regen_runner = FleetRegenRunner(
                self.regen_runner.config, fleet_access(self.cfg, self.remote_target)
            )

    def setup(self):
        super().setup()
        if self.decode_eval_runner is not None:
            config = self.decode_eval_runner.config
            self.decode_eval_runner = FleetDecodeEvalRunner(
                config, fleet_access(self.cfg, self.remote_target)
            )

    def _train_epochs(self, *args, **kwargs):
        super()._train_epochs(*args, **kwargs)
        self._trained = (
            True  # training ended as planned, not by an error: its last cycles are worth waiting for
        )

    def _finalize_training(self) -> None:
        # NeMo's finalize collects decode-eval results and then stops whatever still runs: wait for it first
        for name in ("decode_eval_runner", "regen_runner") if getattr(self, "_trained", False) else ():
            runner = getattr(self, name, None)
            if isinstance(runner, FleetWorker):
                try:
                    runner.wait()
                except Exception:
                    log.exception("%s: waiting for the last cycle failed", runner.name)
        super()._finalize_training()
