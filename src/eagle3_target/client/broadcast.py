"""A trainer's new weights sent live to every replica, in the manner of SGLang's and vLLM's
update_weights_from_distributed: `broadcast_refresh(urls, tensors, version, admin_token)`.

Each replica is first told every tensor's name, dtype and shape (POST /weights/broadcast, admin token) and
checks them against what it serves; only when every replica has accepted does any tensor move, so a wrong
architecture or a missing tensor changes nothing anywhere. Then, per replica at once, this process joins the
authenticated p2p group the replica opened (the one a session's /init_nccl gets: p2p.py's PeerGroup), sends
the tensors in the announced order, and waits for POST /weights/broadcast/outcome, which answers once the
replica serves them under ``version``. A replica that accepted the announcement of a broadcast that then went
no further (another replica refused it) gives up at its --p2p-rendezvous-timeout and keeps its weights.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import torch

from eagle3_target.protocol import contract
from eagle3_target.protocol.model_info import check_target_version
from eagle3_target.protocol.p2p import NCCL, PeerGroup, TransferError

from .refresh import Outcome, post_admin


def broadcast_refresh(
    urls: list[str],
    tensors: Mapping[str, torch.Tensor],
    version: str,
    admin_token: str,
    *,
    timeout: float = 600.0,
) -> Outcome:
    """Serve ``tensors`` (checkpoint names, the served dtypes and shapes) on every replica of ``urls`` under
    the label ``version``; blocks until each has answered (call it outside a running event loop, or through
    asyncio.to_thread). Returns the version each replica serves now, or why it refused, in one line.
    ValueError: ``version`` is no version label."""
    label = check_target_version(version)
    sent = {name: tensor.detach() for name, tensor in tensors.items()}
    replicas = list(dict.fromkeys(url.rstrip("/") for url in urls))
    return asyncio.run(_broadcast(replicas, sent, label, admin_token, timeout))


def announcement(tensors: Mapping[str, torch.Tensor], version: str) -> str:
    """The body of POST /weights/broadcast: the label and each tensor's name, dtype and shape in send order."""
    return json.dumps(
        {
            "version": version,
            "names": list(tensors),
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
            "shapes": [list(t.shape) for t in tensors.values()],
        }
    )


async def _broadcast(
    urls: list[str], tensors: dict[str, torch.Tensor], version: str, token: str, timeout: float
) -> Outcome:
    outcome, body = Outcome(), announcement(tensors, version)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        replies = await asyncio.gather(
            *(post_admin(http, f"{u}/{contract.BROADCAST}", body, token) for u in urls)
        )
        for url, (_, why) in zip(urls, replies, strict=True):
            if why is not None:
                outcome.refused[url] = why
        if outcome.refused:
            return outcome  # nothing sent anywhere
        with ThreadPoolExecutor(len(urls), thread_name_prefix="weights-broadcast") as threads:
            send = functools.partial(_send, http, threads, tensors, token, timeout)
            settled = await asyncio.gather(
                *(send(url, reply) for url, (reply, _) in zip(urls, replies, strict=True))
            )
    for url, (reply, why) in zip(urls, settled, strict=True):
        outcome.settle(url, reply, why)
    return outcome


async def _send(
    http: aiohttp.ClientSession,
    threads: ThreadPoolExecutor,
    tensors: dict[str, torch.Tensor],
    token: str,
    timeout: float,
    url: str,
    reply: dict,
) -> tuple[dict, str | None]:
    """Join ``reply``'s group, send, and wait for the replica's outcome; the group closes only then, once the
    replica has received everything."""
    ask = json.dumps({"transfer": reply.get("transfer")})
    answered = asyncio.create_task(post_admin(http, f"{url}/{contract.BROADCAST_OUTCOME}", ask, token))
    loop, group = asyncio.get_running_loop(), None
    try:
        group = await loop.run_in_executor(threads, join_group, reply, timeout)
        await loop.run_in_executor(threads, group.send, tensors, None, timeout)
    except (TransferError, KeyError, ValueError, TypeError) as exc:
        sent = f"; sending failed here: {' '.join(str(exc).split())[:200]}"
        if group is not None:
            group.close()  # the replica's receive fails at once
    else:
        sent = ""
    try:
        result, why = await answered
    finally:
        if group is not None:
            group.close()
    return result, None if why is None else why + sent


def join_group(reply: dict, timeout: float) -> PeerGroup:
    backend = reply["backend"]
    device = f"cuda:{torch.cuda.current_device()}" if backend == NCCL else "cpu"
    host, port, secret = reply["host"], int(reply["nccl_port"]), reply["secret"]
    return PeerGroup.join(host, port, backend, timeout, device, secret=secret)
