"""Feature requests per draft family: wire bytes per token at real shapes, the compact option's
exactness, and tokens/s through one server against the bare forward, on the CPU.

    PYTHONPATH=src OMP_NUM_THREADS=2 python bench/family_features.py [--json out.json]
    PYTHONPATH=src python bench/family_features.py --small     # what tests/bench runs

1. Bytes per token of each family's /generate reply (protocol/families) at NeMo's shapes: Qwen3-8B
   (36 layers, hidden 4096, vocab 151936) for DFlash (5 layers), JetSpec and DSpark; Llama-3.1-8B
   (32 layers, hidden 4096, vocab 128256) for P-EAGLE, EAGLE-1 and EAGLE-3 (draft vocabulary 32000),
   Qwen2.5-VL-7B's language model for ViSpec's two stages, MiniMax M3 VL's text model (60 layers, hidden
   6144, vocab 200064) for DSpark-VLM (DSpark with multimodal: true; its request is text DSpark's), bf16, B x S = 1 x 4096. Computed from the reply's shapes with the wire format's own entry headers
   (on meta tensors: nothing is allocated), so they are the bytes the server sends; the smoke test
   checks them against a real reply. "compact" is the family's compact request: the post-norm hidden
   state instead of full-vocabulary logits, the trainer applying the lm_head (fetched once).
2. The compact option's logits, F.linear(final_hidden, lm_head) on the trainer, against the logits the
   server's forward computes, on a random Llama on the CPU in float32 and bfloat16: max |diff|, and
   whether they are bit-identical for the same batch, and for one row of it.
3. Tokens/s of each family's request through one server (loopback HTTP, RemoteTargetBackend.capture)
   against the bare capture (the same runner called directly), measured in turn in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from aiohttp import web

from eagle3_target.client.nemo import registry
from eagle3_target.protocol import capture, wire
from eagle3_target.protocol.families import Family
from eagle3_target.protocol.features import CAN_IMAGE_MASK, LOGITS_DRAFT_PROBS, Features
from eagle3_target.server.runners.base import Capture, ForwardInputs
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The CPU timings' Llama: engine_throughput's, small with realistic proportions (vocab >> hidden)
from engine_throughput import BENCH_LLAMA  # noqa: E402  (the sibling bench's model)

QWEN3_8B = dict(num_hidden_layers=36, hidden_size=4096, vocab_size=151936)
LLAMA31_8B = dict(num_hidden_layers=32, hidden_size=4096, vocab_size=128256)
QWEN25_VL_7B = dict(num_hidden_layers=28, hidden_size=3584, vocab_size=152064)  # its language model
MINIMAX_M3_VL = dict(num_hidden_layers=60, hidden_size=6144, vocab_size=200064)  # its text model
DRAFT_VOCAB = 32000
# family -> (the target NeMo's recipe pairs it with here, target_layer_ids); any other family: DEFAULT_REAL
REAL = {
    "dflash": ("Qwen3-8B", QWEN3_8B, [1, 9, 17, 25, 33]),  # DFlash's build_target_layer_ids(36, 5)
    "jetspec": ("Qwen3-8B", QWEN3_8B, [1, 9, 17, 25, 33]),
    "dspark": ("Qwen3-8B", QWEN3_8B, [1, 10, 18, 26, 35]),  # DSpark's build_target_layer_ids(36, 5)
    "peagle": ("Llama-3.1-8B", LLAMA31_8B, [1, 15, 28]),  # EAGLE-3's default aux layers
    "eagle1": ("Llama-3.1-8B", LLAMA31_8B, []),
    "eagle3": ("Llama-3.1-8B", LLAMA31_8B, [1, 15, 28]),
    "vispec_stage1": ("Qwen2.5-VL-7B", QWEN25_VL_7B, []),
    "vispec": ("Qwen2.5-VL-7B", QWEN25_VL_7B, []),  # the merged embedding output is layer -1
}
DEFAULT_REAL = REAL["dflash"]
# a family's request again on an image-text target: label -> (family, target, shape, target_layer_ids).
# DSpark with multimodal: true takes MiniMax M3 VL targets only; its request is text DSpark's.
ON_VLM = {"dspark_vlm": ("dspark", "MiniMax-M3-VL", MINIMAX_M3_VL, [1, 16, 30, 44, 59])}  # (60, 5)
SMALL_LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8)


def families() -> dict[str, Family]:
    """Every family's request, by name: the registry's (client/nemo/registry.py), entry points' included."""
    return {name: found.request for name, found in registry.families().items()}


def reply_bytes(features: Features, batch: int, seq: int, shape: dict, dtype=torch.bfloat16) -> int:
    """The wire bytes of a /generate reply for ``features``: entry headers plus tensor bytes."""
    want = capture.expected(
        features, batch, seq, shape["hidden_size"], shape["vocab_size"], DRAFT_VOCAB, dtype
    )
    total = len(wire.MAGIC_BYTES)
    for key, (kind, dims) in want.items():
        meta = torch.empty(dims, dtype=kind or dtype, device="meta")
        total += len(wire._entry_header(key, meta)) + meta.numel() * meta.element_size()
    return total


def image_text(family) -> bool:
    """Whether a family's request needs an image-text target."""
    return CAN_IMAGE_MASK in family.ask([0], 2).needs()


def real(family: str) -> tuple[str, dict, list[int]]:
    return REAL.get(family, DEFAULT_REAL)


def requests(layer_ids: list[int], num_layers: int) -> dict[str, Features]:
    """Each text family's exact request and, where it has one, its compact request (a text-only target:
    the families whose request needs an image-text target's image mask are left out)."""
    out = {}
    for name, family in families().items():
        ids = layer_ids[: len(real(name)[2]) or None]
        if image_text(family):
            continue
        out[name] = family.ask(ids, num_layers)
        if family.compact is not None:
            out[f"{name} compact"] = family.compact(ids, num_layers)
    return out


def targets() -> dict[str, tuple]:
    """Each row of the bytes table: label -> (family, target, shape, target_layer_ids)."""
    return {name: (family, *real(name)) for name, family in families().items()} | {
        label: (families()[name], *rest) for label, (name, *rest) in ON_VLM.items()
    }


def bytes_table(seq: int = 4096) -> dict:
    rows = {}
    for name, (family, model, shape, ids) in targets().items():
        asks = {name: family.ask(ids, shape["num_hidden_layers"])}
        if family.compact is not None:
            asks[f"{name} compact"] = family.compact(ids, shape["num_hidden_layers"])
        for label, features in asks.items():
            rows[label] = dict(
                target=model,
                request=features.to_header(),
                bytes_per_token=reply_bytes(features, 1, seq, shape) / seq,
            )
    return rows


@torch.inference_mode()
def compact_exactness(model, batch: int, seq: int) -> dict:
    """The trainer's lm_head over the shipped final hidden state against the server forward's logits."""
    out = {}
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    for dtype in (torch.float32, torch.bfloat16):
        runner = HFRunner(copy.deepcopy(model).to(dtype), name="bench")
        got = runner.capture(
            ForwardInputs(ids, torch.ones_like(ids)), Capture(final_hidden=True, logits=True)
        )
        head = runner.weight("lm_head").clone()  # what /weights/lm_head sends
        trainer = F.linear(got.final_hidden.clone(), head)
        one_row = F.linear(got.final_hidden[:1].clone(), head)
        out[str(dtype).removeprefix("torch.")] = dict(
            max_abs=float((trainer.float() - got.logits.float()).abs().max()),
            identical=bool(torch.equal(trainer, got.logits)),
            one_row_identical=bool(torch.equal(one_row, got.logits[:1])),
            one_row_max_abs=float((one_row.float() - got.logits[:1].float()).abs().max()),
        )
    return out


def interleaved(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of ``first`` and of ``second``, run in turn (after one warm-up each), so a busy
    machine slows both alike."""
    first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def through_server(runner, asks: dict[str, Features], batch, repeats: int, images=None) -> dict:
    """Per request: seconds of the bare capture and of RemoteTargetBackend.capture through one server;
    ``images`` an image-text batch's processor outputs, sent with every request."""
    from eagle3_target.client import BatchInputs, PoolOptions, RemoteTargetBackend
    from eagle3_target.server.app import ServerOptions, TargetServer

    ids, mask, loss = batch
    draft = torch.randperm(runner.info.vocab_size, generator=torch.Generator().manual_seed(1))[:DRAFT_VOCAB]
    in_draft = torch.zeros(runner.info.vocab_size, dtype=torch.bool)
    in_draft[draft] = True

    def trainer(url: str) -> dict:
        out = {}
        for label, features in asks.items():
            options = PoolOptions(start_timeout=60, request_timeout=600)
            # Once the server is ready (its warm-up done): the runner serves one caller at a time.
            with RemoteTargetBackend(url, options=options, features=features) as backend:
                if features.logits == LOGITS_DRAFT_PROBS:
                    backend.set_vocab_mapping(draft, in_draft)
                want = Capture.of(features)
                bare, served = interleaved(
                    lambda want=want: runner.capture(ForwardInputs(ids, mask, **(images or {})), want),
                    lambda backend=backend: backend.capture(BatchInputs(ids, mask, loss, media=images or {})),
                    repeats,
                )
            out[label] = dict(bare_s=bare, server_s=served, ratio=bare / served)
        return out

    async def run() -> dict:
        server = TargetServer(lambda: runner, ServerOptions(max_batch_tokens=ids.numel()))
        app_runner = server.app_runner()
        await app_runner.setup()
        await web.TCPSite(app_runner, "127.0.0.1", 0).start()
        try:
            return await asyncio.to_thread(trainer, f"http://127.0.0.1:{app_runner.addresses[0][1]}")
        finally:
            await app_runner.cleanup()

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a tiny Llama and batch (the smoke test)")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    rows, seq = (2, 32) if args.small else (args.rows, args.seq)
    model = build_tiny_llama(seed=0, **(SMALL_LLAMA if args.small else BENCH_LLAMA))
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows, seq))
    batch = (ids, torch.ones_like(ids), torch.ones_like(ids))
    layers = model.config.num_hidden_layers
    result = dict(
        machine=f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        torch=torch.__version__,
        bytes_per_token=bytes_table(),
        compact_exactness=compact_exactness(model, rows, seq),
        cpu_shape=dict(batch=rows, seq=seq, **model.config.to_diff_dict()),
        through_one_server=through_server(
            HFRunner(model, name="bench"), requests([1, 2, 3, 4, 5], layers), batch, args.repeats
        ),
    )
    print_table(result)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


def print_table(result: dict) -> None:
    print(f"{'request':16} {'target':13} {'KB/token':>9}")
    for label, row in result["bytes_per_token"].items():
        print(f"{label:16} {row['target']:13} {row['bytes_per_token'] / 1024:9.1f}")
    for dtype, row in result["compact_exactness"].items():
        print(
            f"compact logits vs the forward's, {dtype}: identical {row['identical']} (max |diff| "
            f"{row['max_abs']:.3g}); one row alone: identical {row['one_row_identical']} "
            f"(max |diff| {row['one_row_max_abs']:.3g})"
        )
    shape = result["cpu_shape"]
    print(
        f"CPU, {result['machine']}: {shape['batch']} x {shape['seq']} tokens, hidden {shape['hidden_size']}"
    )
    print(f"{'request':16} {'bare s':>8} {'server s':>9} {'server/bare tokens/s':>21}")
    for label, row in result["through_one_server"].items():
        print(f"{label:16} {row['bare_s']:8.3f} {row['server_s']:9.3f} {row['ratio']:21.2f}")


if __name__ == "__main__":
    main()
