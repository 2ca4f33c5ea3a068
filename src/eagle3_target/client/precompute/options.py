"""The precompute command's flags: NeMo's ``precompute_eagle3`` flags with NeMo's meaning and defaults,
then the fleet's (client) options and ours (workers, progress); plus the checks made before any work.
Standard library only, so help and argument errors answer at once (docs/cli.md)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from eagle3_target.exits import CommandError, Exit
from eagle3_target.protocol.choices import AUTO, ENCODING_CHOICES, HIDDEN
from eagle3_target.protocol.contract import PRIORITIES
from eagle3_target.protocol.families import families
from eagle3_target.protocol.model_info import NEWEST, check_version_choice

WORKER_INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in each pod of an Indexed Job
WORKER_COUNT_ENV = "EAGLE3_TARGET_WORKER_COUNT"  # the Job's completions (the Job template sets it)
# What reads as a local file rather than a Hugging Face dataset id (NeMo accepts both).
LOCAL_DATA = re.compile(r"^(/|\.|~)|\.(jsonl?|parquet|arrow|csv)$")


DTYPE_NAMES = ("bf16", "fp16", "fp32")  # NeMo's cache dtypes (eagle3_cache.DTYPE_MAP)


class UsageError(CommandError):
    """Bad input, reported as one line with exit status 2 before any work."""

    def __init__(self, message: str):
        super().__init__(message, Exit.USAGE)


def env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    return int(text) if text else default


def add_family_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--family",
        default="eagle3",
        help="which family's NeMo offline cache to write: eagle3 (precompute_eagle3's, the default), dspark "
        "(precompute_dspark's), or another family's that has one",
    )


def add_nemo_arguments(p: argparse.ArgumentParser) -> None:
    """NeMo 0.7.0's precompute_eagle3 and precompute_dspark flags (all but --device and --log-level: the
    fleet runs the target)."""
    add_family_argument(p)
    p.add_argument(
        "--target-model", required=True, help="target model path or HF repo id (tokenizer, config)"
    )
    p.add_argument("--input-data", required=True, help="HF dataset id or local chat dataset path")
    p.add_argument(
        "--output-dir", required=True, help="cache directory: a local path or an fsspec URL (s3://...)"
    )
    p.add_argument("--seq-length", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="draft vocabulary size (default: the full target vocab)",
    )
    p.add_argument(
        "--target-probs-topk",
        type=int,
        default=0,
        help="store only the top-k of each token's draft-vocab distribution (0, the default: in full, exact); "
        "a real disk/fidelity trade-off, as in NeMo",
    )
    p.add_argument("--batch-size", type=int, default=4, help="target forward batch size (default 4)")
    p.add_argument(
        "--shard-size",
        type=int,
        default=256,
        help="samples per shard, a multiple of --batch-size (default 256)",
    )
    p.add_argument(
        "--dtype", default="bf16", choices=sorted(DTYPE_NAMES), help="cache float dtype (default bf16)"
    )
    p.add_argument("--num-workers", type=int, default=0, help="dataloader workers (default 0)")
    p.add_argument("--split", default=None, help="HF dataset split (slice syntax allowed)")
    p.add_argument("--shuffle-seed", type=int, default=42, help="dataset ingestion shuffle seed (default 42)")
    p.add_argument(
        "--aux-layer-ids",
        type=int,
        nargs="+",
        default=None,
        help="target layers to capture (default: the fleet's, which must equal these when given)",
    )
    p.add_argument(
        "--mask-reasoning-content",
        action="store_true",
        help="exclude reasoning_content tokens from the loss mask",
    )
    p.add_argument(
        "--mask-generation-prompt",
        action="store_true",
        help="exclude each assistant turn's template prefix from the loss mask",
    )
    p.add_argument(
        "--trust-remote-code", action="store_true", help="let the tokenizer run code from the model's repo"
    )
    p.add_argument("--resume", action="store_true", help="keep the shards already written, compute the rest")
    add_dspark_arguments(p)


def add_dspark_arguments(p: argparse.ArgumentParser) -> None:
    """precompute_dspark's own flags (--family dspark)."""
    p.add_argument(
        "--draft-num-hidden-layers",
        type=int,
        default=5,
        help="dspark: draft layer count that spreads the default --target-layer-ids (default 5)",
    )
    p.add_argument(
        "--target-layer-ids",
        type=int,
        nargs="+",
        default=None,
        help="dspark: target layers to capture (-1 the embedding output, the last the post-norm hidden state)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="dspark: inline Jinja template or path to a template/tokenizer config",
    )
    p.add_argument(
        "--target-attn-implementation",
        default=None,
        help="dspark: accepted for NeMo's command lines; the fleet's servers load the target (serve's options)",
    )
    p.add_argument(
        "--target-force-hf",
        action="store_true",
        help="dspark: accepted for NeMo's command lines; the fleet's servers load the target",
    )


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoints", help="endpoint spec(s) of the fleet (default: $EAGLE3_TARGET_SERVICE)")
    p.add_argument("--nameserver", help="DNS server host[:port] (default: the system's)")
    p.add_argument("--auth-token-file", type=Path, help="default: $EAGLE3_TARGET_AUTH_TOKEN_FILE")
    p.add_argument(
        "--encoding",
        default=AUTO,
        choices=ENCODING_CHOICES,
        help="reply encoding (default auto: logits or nemo, both exact; hidden needs --allow-approximate)",
    )
    p.add_argument(
        "--allow-approximate",
        action="store_true",
        help="accept --encoding hidden, whose target_probs are close to but not NeMo's",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=2,
        help="requests per server (default 2: a server runs one and queues the next, so it never waits on "
        "this worker's shard writes)",
    )
    p.add_argument(
        "--priority",
        choices=tuple(PRIORITIES),
        help="this job's share of each server while other jobs wait (X-Eagle3-Priority; default: the "
        "server's, normal). A server that grants less refuses the batches",
    )
    p.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds to find a ready server (default 300)"
    )
    p.add_argument(
        "--request-timeout", type=float, default=120.0, help="one attempt on one server (default 120)"
    )
    p.add_argument("--deadline", type=float, default=600.0, help="all attempts of one batch (default 600)")
    p.add_argument(
        "--hedge-after", type=float, default=10.0, help="re-send a batch unanswered this long (default 10)"
    )
    p.add_argument(
        "--target-version",
        default=NEWEST,
        help="the target version the whole cache is made from: a label, or newest (the default: the newest "
        "the fleet serves at the start, kept for the run). Recorded in target_version.json",
    )
    p.add_argument(
        "--skip-config-digest",
        action="store_true",
        help="accept a fleet whose config digest differs from --target-model's (a synthetic fleet); "
        "shapes are still checked",
    )


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--worker-count",
        type=int,
        default=env_int(WORKER_COUNT_ENV, 1),
        help=f"workers sharing the cache, each writing its own shards (default ${WORKER_COUNT_ENV} or 1)",
    )
    p.add_argument(
        "--worker-index",
        type=int,
        default=env_int(WORKER_INDEX_ENV, 0),
        help=f"this worker, 0..count-1 (default ${WORKER_INDEX_ENV}, as an Indexed Job sets it, or 0)",
    )
    p.add_argument(
        "--log-interval",
        type=float,
        default=30.0,
        help="seconds between progress lines off a terminal (default 30)",
    )
    p.add_argument(
        "--metrics-file", help="Prometheus textfile, rewritten at each progress line and at the end"
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port while running")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_nemo_arguments(p)
    add_fleet_arguments(p)
    add_run_arguments(p)


def check(args: argparse.Namespace) -> None:
    """NeMo's argument checks and ours: UsageError for the first problem found."""
    checks = [
        (args.batch_size >= 1, f"--batch-size must be >= 1, got {args.batch_size}"),
        (args.shard_size >= 1, f"--shard-size must be >= 1, got {args.shard_size}"),
        (
            args.shard_size % max(args.batch_size, 1) == 0,
            f"--shard-size ({args.shard_size}) must be a multiple of --batch-size ({args.batch_size}) "
            "so shards align to batch boundaries",
        ),
        (args.seq_length >= 1, f"--seq-length must be >= 1, got {args.seq_length}"),
        (
            args.draft_vocab_size is None or args.draft_vocab_size >= 1,
            f"--draft-vocab-size must be >= 1 or omitted, got {args.draft_vocab_size}",
        ),
        (args.target_probs_topk >= 0, f"--target-probs-topk must be >= 0, got {args.target_probs_topk}"),
        (args.num_workers >= 0, f"--num-workers must be >= 0, got {args.num_workers}"),
        (args.max_in_flight >= 1, f"--max-in-flight must be >= 1, got {args.max_in_flight}"),
        (args.worker_count >= 1, f"--worker-count must be >= 1, got {args.worker_count}"),
        (
            0 <= args.worker_index < args.worker_count,
            f"--worker-index {args.worker_index} is outside 0..{args.worker_count - 1} (--worker-count)",
        ),
        (
            args.encoding != HIDDEN or args.allow_approximate,
            "--encoding hidden gives approximate target_probs, not NeMo's; add --allow-approximate to accept that",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    try:
        check_version_choice(args.target_version)
    except ValueError as exc:
        raise UsageError(f"--target-version: {exc}") from None
    if args.family not in families():
        raise UsageError(f"--family {args.family}: no such draft family ({', '.join(sorted(families()))})")
    if args.draft_num_hidden_layers < 1:
        raise UsageError(f"--draft-num-hidden-layers must be >= 1, got {args.draft_num_hidden_layers}")
    data = os.path.expanduser(args.input_data)
    if LOCAL_DATA.search(args.input_data) and not os.path.exists(data):
        raise UsageError(f"--input-data {args.input_data}: no such file or directory")


def check_family_flags(args: argparse.Namespace, caches: dict) -> None:
    """``caches``: family name -> its OfflineCache (client/nemo/registry.py). A family without one, or
    another family's flag, is refused in one line."""
    if args.family not in caches:
        raise UsageError(
            f"--family {args.family} has no offline cache; families with one: {', '.join(sorted(caches))}"
        )
    for owner, offline in sorted(caches.items()):
        for name, default in offline.flags.items():
            if owner != args.family and getattr(args, name) != default:
                flag = "--" + name.replace("_", "-")
                raise UsageError(
                    f"{flag} is a --family {owner} flag; this run writes the {args.family} cache"
                )
