"""`eagle3-target evaluate`: arguments (standard library only, so --help needs no extra) and run()."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_target.exits import CommandError, Exit


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="one target server, http://host:port")
    where.add_argument(
        "--service", help="the fleet: dns://name[:port], srv://name, or a Service's DNS name[:port]"
    )
    p.add_argument(
        "--draft",
        required=True,
        help="the draft as the server sees it under its --draft-dir-root: a checkpoint folder train-draft "
        "writes (epoch_E_step_S) or the checkpoint dir holding them (the newest is taken)",
    )
    p.add_argument("--data", type=Path, required=True, help="a jsonl of {'messages': [...]} rows")
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        required=True,
        help="K: draft tokens the target verifies per step",
    )
    p.add_argument("--max-tokens", type=int, required=True, help="new tokens per prompt")
    p.add_argument("--json", type=Path, help="write the report (acceptance, rates, output_ids) to this file")
    p.add_argument(
        "--auth-token-file", type=Path, help="bearer token file (default: $EAGLE3_TARGET_AUTH_TOKEN_FILE)"
    )
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for a server to be ready before giving up"
    )


def run(args: argparse.Namespace) -> int:
    if args.num_speculative_tokens < 1 or args.max_tokens < 1:
        raise CommandError("--num-speculative-tokens and --max-tokens must be at least 1", Exit.USAGE)
    import asyncio
    import json

    from .evaluate import evaluate, find_server, read_prompts
    from .probe import read_token

    prompts = read_prompts(args.data)
    token = read_token(args.auth_token_file)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    spec = args.url or (args.service if "://" in args.service else f"dns://{args.service}")
    request = {
        "draft": args.draft,
        "num_speculative_tokens": args.num_speculative_tokens,
        "max_tokens": args.max_tokens,
    }

    async def main():
        url = await find_server(spec, headers, args.wait)
        return await evaluate(url, headers, prompts, request)

    report = asyncio.run(main())
    print(
        f"acceptance length {report['acceptance_length']:.3f} tokens per target step over {report['steps']} steps, "
        f"{report['prompts']} prompts; {report['tokens_per_second']:.1f} tokens/s"
    )
    print("accepted per position: " + " ".join(f"{rate:.3f}" for rate in report["acceptance_rates"]))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return Exit.OK
