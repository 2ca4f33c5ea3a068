"""A client process for the p2p tests: `python p2p_worker.py MODE URL [options]`.

batches: fetch batches through RemoteTargetBackend on the chosen data path, check each
         against the supervision computed locally, print one JSON line of results.
compare: fetch the same batches once per encoding, all point-to-point, and print how each
         differs from "nemo": exact or not, and the largest target_probs difference.
stall:   build a group, ask for one p2p batch, receive only its first tensor, print
         STALLED and sleep (the test kills us mid-transfer).
hold:    build --sessions groups, one session each, print HELD, then heartbeat every
         --heartbeat seconds until killed.
victim:  call /init_nccl in the authenticated mode and print its reply; on a line from the
         test, join with that secret (or, if that fails, build a fresh group) and fetch one
         batch over p2p; print one JSON line of results.
attack:  URL is HOST:PORT of someone else's rendezvous. Connect to its store (print
         CONNECTED), set --hello if given, join a gloo group as rank 1 under --namespace
         (default: NeMo's layout) and print REFUSED if that fails. Otherwise print JOINED,
         receive the 32-byte challenge, answer it with zeros, and print CLOSED if the server
         then drops us or RECEIVED if more data arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import time

import aiohttp
import torch

from eagle3_target.client import PoolOptions, RemoteTargetBackend
from eagle3_target.client.agreement import Agreement
from eagle3_target.client.connection import ServerConnection
from eagle3_target.client.fetch import fetch_supervision
from eagle3_target.client.p2p import P2PChannel
from eagle3_target.protocol import contract, encodings, p2p, rendezvous, wire
from eagle3_target.protocol.metadata import decode_metadata
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
        channel = next(iter(backend.pool.members.values())).agreement.p2p
        if args.barrier:
            backend.generate_batch(*make_batch(0, 1, 4))  # builds the group
            print("READY", flush=True)
            sys.stdin.readline()
        ok = True
        for seed in range(1, args.batches + 1):
            ids, mask, loss = make_batch(seed, args.batch, args.seq)
            got = backend.generate_batch(ids, mask, loss).as_dict()
            want = expected(ids, loss, vocab)
            ok &= all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in contract.SUPERVISION_KEYS)
        print(
            json.dumps(
                {
                    "ok": ok,
                    "transfers": channel.transfers if channel else 0,
                    "fallbacks": channel.fallbacks if channel else 0,
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
            channel = next(iter(backend.pool.members.values())).agreement.p2p
            report[encoding] = {"transfers": channel.transfers, "fallbacks": channel.fallbacks}
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
        await conn.set_vocab_mapping(wire.encode(dict(zip(contract.VOCAB_KEYS, draft_vocab(), strict=False))))
        channel = P2PChannel(args.url, await conn.model_info(), "p2p", timeout=args.timeout)
        await channel.ready(conn.init_nccl)
        ids, mask, loss = make_batch(7, args.batch, args.seq)
        request = wire.encode({"input_ids": ids, "attention_mask": mask, "loss_mask": loss})
        headers = {contract.NCCL_HEADER: "1", contract.SEQUENCE_HEADER: "0"}
        _, payload = await conn.post(contract.GENERATE, request, headers=headers)
        metadata = decode_metadata(payload)
        first = next(iter(metadata))
        channel.group.recv({first: metadata[first]}, 0, args.timeout)  # the server is still sending the rest
        print("STALLED", flush=True)
        time.sleep(600)


async def hold(args) -> None:
    async with aiohttp.ClientSession() as http:
        conns = []
        for i in range(args.sessions):
            conn = ServerConnection(args.url, http, f"holder-{i}", timeout=args.timeout)
            channel = P2PChannel(args.url, await conn.model_info(), "p2p", timeout=args.timeout)
            await channel.ready(conn.init_nccl)
            conns.append(conn)
        print("HELD", flush=True)
        while True:
            await asyncio.gather(*(conn.heartbeat() for conn in conns))
            await asyncio.sleep(args.heartbeat)


async def victim(args) -> None:
    async with aiohttp.ClientSession() as http:
        conn = ServerConnection(args.url, http, "victim", timeout=args.timeout)
        vocab = draft_vocab()
        await conn.set_vocab_mapping(wire.encode(dict(zip(contract.VOCAB_KEYS, vocab, strict=False))))
        body = json.dumps({"backend": "gloo", "auth": contract.P2P_AUTH}).encode()
        info = await conn.model_info()
        reply = await conn.init_nccl(body)
        print(json.dumps(reply), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        channel = P2PChannel(args.url, info, "p2p", timeout=args.timeout)
        join = p2p.PeerGroup.join
        try:
            channel.group = await asyncio.to_thread(
                join, reply["host"], reply["nccl_port"], "gloo", args.timeout, secret=reply["secret"]
            )
            first_join = "ok"
        except p2p.TransferError as exc:
            first_join = f"failed: {exc}"
        ids, mask, loss = make_batch(3, args.batch, args.seq)
        request = wire.encode({"input_ids": ids, "attention_mask": mask, "loss_mask": loss})
        agreement = Agreement(info, encodings.NEMO, channel)
        reply = await fetch_supervision(conn, agreement, request, (args.batch, args.seq, len(vocab[0])), None)
        got, want = reply.tensors, expected(ids, loss, vocab)
        ok = all(torch.equal(got[k], want[k].to(got[k].dtype)) for k in contract.SUPERVISION_KEYS)
        print(json.dumps({"first_join": first_join, "ok": ok, "transfers": channel.transfers}), flush=True)


def attack(args) -> None:
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    host, _, port = args.url.rpartition(":")
    timeout = datetime.timedelta(seconds=args.timeout)
    store = TCPStore(host, int(port), 2, False, timeout)
    print("CONNECTED", flush=True)
    namespace = args.namespace or rendezvous.group_name(int(port))  # NeMo's layout
    keys = PrefixStore(f"{namespace}/", store)
    if args.hello:
        keys.set("hello", bytes.fromhex(args.hello))
    options = ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [ProcessGroupGloo.create_device(hostname=host)]
    try:
        pg = ProcessGroupGloo(PrefixStore("cpu/", keys), 1, 2, options)
    except RuntimeError:
        print("REFUSED", flush=True)
        return
    print("JOINED", flush=True)
    challenge = torch.empty(p2p.NONCE_BYTES, dtype=torch.uint8)
    pg.recv([challenge], 0, 0).wait(timeout)
    pg.send([torch.zeros(32, dtype=torch.uint8)], 0, 0).wait(timeout)
    try:
        pg.recv([torch.empty(8, dtype=torch.uint8)], 0, 0).wait(timeout)
    except RuntimeError:
        print("CLOSED", flush=True)
        return
    print("RECEIVED", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["batches", "compare", "stall", "hold", "victim", "attack"])
    p.add_argument("url")
    p.add_argument("--data-path", default="p2p")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--barrier", action="store_true")
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--namespace")
    p.add_argument("--hello")
    args = p.parse_args()
    if args.mode == "batches":
        run_batches(args)
    elif args.mode == "compare":
        compare_encodings(args)
    elif args.mode == "attack":
        attack(args)
    else:
        asyncio.run({"stall": stall, "hold": hold, "victim": victim}[args.mode](args))


if __name__ == "__main__":
    main()
