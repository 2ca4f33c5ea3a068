"""A ``regen:`` cycle against the fleet: ``python -m eagle3_target.client.nemo.regen_worker --config-json F
--cycle-dir D --step N``, launched by FleetRegenRunner (fleet_cycles.py) with the fleet's endpoint spec (and
token file) in its environment.

NeMo's own worker boots a vLLM server and runs regenerate.py against it; this one finds a ready server of the
fleet (the discovery the trainer uses), takes the model name it serves, and runs NeMo's regenerate.py against
its OpenAI endpoints with NeMo's own arguments. READY is written only after regenerate succeeds, as NeMo does.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys

import aiohttp

from ..endpoints import EndpointResolver, default_spec, make_resolver, parse_specs, read_auth_token
from ._imports import nemo_module

_regen = nemo_module("components.speculative.regen_loop")
_regenerate = nemo_module("components.speculative.regenerate")


async def fleet_server(nameserver: str | None, token: str | None, timeout: float) -> tuple[str, list[str]]:
    """The first discovered server whose /v1/models answers, and the model names it serves."""
    resolver = make_resolver(nameserver) if nameserver else None
    urls = await EndpointResolver(parse_specs(default_spec()), resolver).resolve()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    refusals = []
    async with aiohttp.ClientSession(
        headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as session:
        for url in urls:
            try:
                async with session.get(f"{url}/v1/models") as reply:
                    if reply.status == 200:
                        return url, [m["id"] for m in (await reply.json())["data"]]
                    refusals.append(f"{url}: HTTP {reply.status} {(await reply.text())[:120]}")
            except (TimeoutError, aiohttp.ClientError) as exc:
                refusals.append(f"{url}: {exc or type(exc).__name__}")
    raise RuntimeError(f"no fleet server serves /v1/models ({'; '.join(refusals) or 'none discovered'})")


def regenerate(cfg, server: str, shards_dir: str, token: str | None) -> int:
    """NeMo's regenerate.main with the arguments NeMo's worker gives it, ``server`` as the target."""
    if token:  # regenerate.py sends no key; OpenAI clients send it as a bearer token
        session = functools.partial(aiohttp.ClientSession, headers={"Authorization": f"Bearer {token}"})
        shim = argparse.Namespace(**{**vars(aiohttp), "ClientSession": session})
        _regenerate._import_aiohttp = lambda: shim
    return _regenerate.main(_regen._regenerate_argv(cfg, server, shards_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="regen worker: regenerate training shards on the fleet")
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--cycle-dir", required=True)
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--nameserver", default=None)
    args = parser.parse_args(argv)
    with open(args.config_json) as f:
        cfg = _regen.RegenConfig(**json.load(f))
    token = read_auth_token()
    server, models = asyncio.run(fleet_server(args.nameserver, token, min(cfg.timeout_s, 60.0)))
    if cfg.served_model_name not in models:
        # NeMo names the vLLM server it boots; the fleet's servers are named already
        print(f"regen worker: the fleet serves {models[0]!r}; regenerating with it", flush=True)
        cfg.served_model_name = models[0]
    shards_dir = os.path.join(args.cycle_dir, "shards")
    print(f"regen worker: regenerating on {server}/v1", flush=True)
    rc = regenerate(cfg, server, shards_dir, token)
    if rc != 0:
        print(f"regen worker: regenerate exited with code {rc}", flush=True)
        return rc
    with open(os.path.join(args.cycle_dir, "READY"), "w") as f:
        f.write(str(args.step))
    print(f"regen worker: cycle {args.step} ready at {shards_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
