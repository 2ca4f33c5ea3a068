"""What every offline cache's run does (eagle3.py, dspark.py): check everything cheap first, connect, plan this
worker's shards and check a manifest it continues."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.protocol.model_info import config_digest

from . import cache, data
from .options import UsageError
from .progress import Progress
from .store import CacheStore

log = logging.getLogger("eagle3_target.precompute")


def check_output(store: CacheStore, args: argparse.Namespace) -> set[int]:
    """This worker's shards already in the cache; refused without --resume. What a killed run of this worker
    left half-written is removed."""

    def mine(shard: int) -> bool:
        return shard % args.worker_count == args.worker_index

    present = {s for s in store.shard_indices() if mine(s)}
    if present and not args.resume:
        raise UsageError(
            f"{args.output_dir} already has shards; pass --resume to continue or use a fresh dir"
        )
    for name in store.remove_partial_shards(mine):
        log.info("removed %s, a shard a killed run left half-written", name)
    return present


def check_model(info: dict[str, Any], config, args: argparse.Namespace) -> list[int]:
    """The fleet must serve --target-model: same shapes and (unless skipped) the same config digest.
    Returns the aux layer ids the fleet captures."""
    expected = {
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
    }
    if not args.skip_config_digest and "config_digest" in info:
        expected["config_digest"] = config_digest(config.to_diff_dict())
    if getattr(args, "aux_layer_ids", None) is not None:
        expected["aux_layer_ids"] = list(args.aux_layer_ids)
    wrong = {k: (v, info.get(k)) for k, v in expected.items() if info.get(k) != v}
    if wrong:
        told = ", ".join(f"{k}: {want} here, {got} on the fleet" for k, (want, got) in wrong.items())
        raise UsageError(f"the fleet does not serve --target-model {args.target_model} ({told})")
    return list(info.get("aux_layer_ids") or [])


def connect(args: argparse.Namespace, token: str | None, features=None) -> RemoteTargetBackend:
    """The fleet, every server found given ``--start-timeout`` to join (prefetch depth counts them);
    ``features``: what to capture instead of EAGLE-3's supervision."""
    options = PoolOptions(
        request_timeout=args.request_timeout,
        deadline=args.deadline,
        start_timeout=args.start_timeout,
        max_in_flight=args.max_in_flight,
        hedge_after=args.hedge_after,
        encoding=args.encoding,
        priority=args.priority,
        target_version=args.target_version,
    )
    backend = RemoteTargetBackend(
        args.endpoints, auth_token=token, nameserver=args.nameserver, options=options, features=features
    )
    backend.wait_for_servers(args.start_timeout)
    if backend.target_version is not None:  # the newest now stays this run's: one cache, one version
        backend.pin_target_version(backend.target_version)
    return backend


def record_version(store: CacheStore, version: str | None, args: argparse.Namespace) -> None:
    """The one target version of the cache, in cache.VERSION_FILE beside NeMo's files (NeMo reads none but its own).
    A resumed run, or another worker, continues a cache only from the version it was made from."""
    if version is None:  # servers that report none (NeMo's own)
        return
    recorded = (store.read_json(cache.VERSION_FILE) or {}).get("target_version")
    if recorded not in (None, version) and (args.resume or args.worker_count > 1):
        raise UsageError(
            f"{args.output_dir} holds a cache made from target version {recorded}, and this run's is {version}: "
            f"pass --target-version {recorded} while the fleet serves it, or use a fresh directory"
        )
    store.write(cache.VERSION_FILE, json.dumps({"target_version": version}, indent=2).encode())


def check_manifest(
    store: CacheStore, manifest: dict[str, Any], present: set[int], args, difference=cache.manifest_difference
) -> dict[str, Any] | None:
    """A resumed run, or one of several workers, continues a cache only if it was made the same way
    (``difference(recorded, manifest)`` names the fields that differ). Returns the recorded manifest, if any."""
    recorded = store.read_manifest()
    if recorded is None:
        if present:
            raise UsageError(
                f"{args.output_dir} has shards but no manifest, so they cannot be verified; "
                "delete the directory and start fresh"
            )
        return None
    wrong = difference(recorded, manifest)
    if wrong:
        raise UsageError(
            f"{args.output_dir} holds a cache made with other settings (mismatched fields: {wrong}); "
            "re-run with the original settings, or use a fresh directory"
        )
    return recorded


def shard_len(shard: int, dataset: data.Dataset, args) -> int:
    return min(args.shard_size, dataset.num_samples - shard * args.shard_size)


def plan(dataset: data.Dataset, present: set[int], args, what: str) -> tuple[list[int], Progress]:
    """This worker's shards not yet written (logged as ``what``) and the Progress that counts them."""
    owned = data.owned_shards(dataset.num_samples, args.shard_size, args.worker_index, args.worker_count)
    todo = [s for s in owned if s not in present]
    worker = f"{args.worker_index + 1}/{args.worker_count}"
    log.info(
        "worker %s: %d of %d %s to write (%d present) -> %s",
        worker,
        len(todo),
        len(owned),
        what,
        len(owned) - len(todo),
        args.output_dir,
    )
    progress = Progress(
        sum(shard_len(s, dataset, args) for s in todo),
        worker=worker,
        log_interval=args.log_interval,
        metrics_file=args.metrics_file,
        metrics_port=args.metrics_port,
    )
    return todo, progress
