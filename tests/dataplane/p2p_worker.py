"""A client process for the data-plane tests: `python p2p_worker.py MODE URL [options]`.

batches: fetch batches through RemoteTargetBackend on the chosen data path, check each
         against the supervision computed locally, print one JSON line of results.
compare: fetch the same batches once per encoding, all point-to-point, and print how each
         differs from "nemo": exact or not, and the largest target_probs difference.
stall:   build a group, ask for one p2p batch, receive only its first tensor, print
         STALLED and sleep (the test kills us mid-transfer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp
import torch

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.client.connection import ServerConnection
from eagle3_target.client.p2p import P2PChannel
from eagle3_target.protocol import spec, wire
from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server.runners.synthetic import SyntheticRunner

VOCAB = 512  # the synthetic engine's default


def make_batch(seed: int, batch: int, seq: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    loss = mask.clone()
    loss[:, : seq // 4] = 0
    return ids, mask, loss


def draft_vocab(size: int = 100):
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:size]
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[ids] = True
    return ids, mask


def expected(ids, loss, vocab):
    logits, aux = SyntheticRunner(vocab_size=VOCAB, dtype="float32").forward(ids, torch.ones_like(ids))
    return build_supervision(logits, aux, ids, loss, VocabMapping(*vocab))


def run_batches(args) -> None:
    options = PoolOptions(
        data_path=args.data_path,
        request_timeout=args.timeout,
        deadline=3 * args.timeout,
        start_timeout=args.timeout,
    )
    vocab = draft_vocab()
    with RemoteTargetBackend(args.url, options=options) as backend:
        backend.set_vocab_mapping(*vocab)
        conn = next(iter(backend.pool.members.values())).conn
        if args.barrier:
            backend.generate_batch(*make_batch(0, 1, 4))  # builds the group
            print("READY", flush=True)
            sys.stdin.readline()
        ok = True
        for seed in range(1, args.batches + 1):
            ids, mask, loss = make_batch(seed, args.batch, args.seq)
            got = backend.generate_batch(ids, mask, loss).as_dict()
            want = expected(ids, loss, vocab)
            ok &= all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in spec.SUPERVISION_KEYS)
        print(
            json.dumps(
                {
                    "ok": ok,
                    "transfers": conn.p2p.transfers if conn.p2p else 0,
                    "fallbacks": conn.p2p.fallbacks if conn.p2p else 0,
                    "session": backend.session_id,
                }
            ),
            flush=True,
        )


def compare_encodings(args) -> None:
    vocab = draft_vocab()
    batches = [make_batch(seed, args.batch, args.seq) for seed in range(1, args.batches + 1)]
    got, report = {}, {}
    for encoding in ("nemo", "logits", "hidden"):
        options = PoolOptions(data_path="p2p", encoding=encoding, request_timeout=args.timeout)
        with RemoteTargetBackend(args.url, options=options) as backend:
            backend.set_vocab_mapping(*vocab)
            got[encoding] = [backend.generate_batch(*b).as_dict() for b in batches]
            conn = next(iter(backend.pool.members.values())).conn
            report[encoding] = {"transfers": conn.p2p.transfers, "fallbacks": conn.p2p.fallbacks}
        pairs = list(zip(got[encoding], got["nemo"], strict=True))
        report[encoding]["exact"] = all(
            have[k].dtype == want[k].dtype and torch.equal(have[k], want[k])
            for have, want in pairs
            for k in want
        )
        report[encoding]["max_diff"] = max(
            (have["target_probs"] - want["target_probs"]).abs().max().item() for have, want in pairs
        )
    print(json.dumps(report), flush=True)


async def stall(args) -> None:
    async with aiohttp.ClientSession() as http:
        conn = ServerConnection(args.url, http, "staller", timeout=args.timeout)
        await conn.set_vocab_mapping(wire.encode(dict(zip(spec.VOCAB_KEYS, draft_vocab(), strict=False))))
        conn.info = await conn.model_info()
        channel = P2PChannel("p2p", timeout=args.timeout)
        group = await channel._group(conn)
        ids, mask, loss = make_batch(7, args.batch, args.seq)
        request = wire.encode({"input_ids": ids, "attention_mask": mask, "loss_mask": loss})
        headers = {spec.NCCL_HEADER: "1", spec.SEQUENCE_HEADER: "0"}
        _, payload = await conn.post(spec.GENERATE, request, headers=headers)
        metadata = spec.decode_metadata(payload)
        first = next(iter(metadata))
        group.recv({first: metadata[first]}, 0, args.timeout)  # the server is still sending the rest
        print("STALLED", flush=True)
        time.sleep(600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["batches", "compare", "stall"])
    p.add_argument("url")
    p.add_argument("--data-path", default="p2p")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--barrier", action="store_true")
    args = p.parse_args()
    if args.mode == "batches":
        run_batches(args)
    elif args.mode == "compare":
        compare_encodings(args)
    else:
        asyncio.run(stall(args))


if __name__ == "__main__":
    main()
