"""Target runners: one frozen model forward behind a small engine-agnostic seam.

Which module loads an engine's runner is the engine table's to say (protocol/engines/); this is the one
place that picks between an engine's one-device loader and the loader that leads a split replica.
"""

from eagle3_target.protocol.engine_spec import entry
from eagle3_target.protocol.engines import engine as engine_entry

from ..options import UsageError
from ..parallel import ONE_DEVICE
from .base import HiddenStateRunner, RunnerInfo, TargetRunner, resolve_dtype

__all__ = ["HiddenStateRunner", "RunnerInfo", "TargetRunner", "resolve_dtype", "load_runner", "follow_runner"]


def load_runner(engine: str, **options) -> TargetRunner:
    """Build the runner for ``engine``; heavy engines are imported only when asked for. ``parallel``
    (a ParallelLayout, default one device) picks the loader; a layout the engine cannot honour raises
    UsageError."""
    spec = _known(engine)
    parallel = options.pop("parallel", ONE_DEVICE)
    if parallel.single:
        return entry(spec.load)(**options)
    if spec.load_split is None:
        raise UsageError(f"--engine {engine} runs one device per replica: drop the parallel flags")
    return entry(spec.load_split)(parallel=parallel, **options)


def follow_runner(engine: str, **options) -> None:
    """A node-rank > 0 process: join the replica node-rank 0 leads and follow its forwards; returns
    when the replica ends (a dead leader ends this process sooner, see ranks.py)."""
    spec = _known(engine)
    if not spec.nodes or spec.follow is None:
        raise UsageError(f"--engine {engine} cannot span nodes: drop --nnodes")
    return entry(spec.follow)(**options)


def _known(engine: str):
    try:
        return engine_entry(engine)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
