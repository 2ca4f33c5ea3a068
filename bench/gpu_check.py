"""GPU check: a Llama-shaped target with random weights behind our server, on one host, one CUDA GPU.

    python bench/gpu_check.py [--json gpu_check.json] [--layers 8] [--batch 4 --seq 2048]
    python bench/gpu_check.py --layers 32 --json gpu_check_32.json   # the 8B shape: issue 32's goal
    python bench/gpu_check.py --device cpu --small        # what CI runs: a tiny shape on the CPU
    python bench/gpu_check.py --tensor-parallel-size 2    # `serve` split over 2 GPUs against 1 (tokens/s)

With ``PYTHONPATH=src`` from the repository root; about a minute at 8 layers and two to three at 32
on an H100 or H200 (most of it building the model and its float32 reference).

Needs: PyTorch 2.11+ (the image's own CUDA build), transformers (LlamaConfig, LlamaForCausalLM),
aiohttp and prometheus-client (the server), with this project installed ``--no-deps`` beside them.
Nothing is downloaded: the model is built from a config (Llama-3.1-8B's widths, layers cut to
``--layers`` so it fits in a few minutes) and its weights are random.

Measured, with the HF runner in bf16:
- bare forward: the model's own forward (aux states captured), seconds and tokens/s at B x S;
- server: /generate over loopback HTTP per encoding ("nemo", "logits", "hidden"), the server's
  compute phases from its Server-Timing header, the whole round trip with the reply read into
  tensors and turned into supervision on the device, reply bytes per token, tokens/s;
- the server's overhead over the bare forward per encoding: (its compute phases, the copy to host
  memory included) / bare - 1 ("server_overhead" is nemo's); and in steady state: seconds per batch
  with two requests in flight (the send of one overlaps the next forward) / bare - 1, which the
  loopback wire bounds;
- the model's overhead with two requests in flight, before and after the reply's projection (the
  encoding) and its copy to host memory left the turn at the model (host_copy.py): the service
  driven directly, no wire, both waited for inside the turn ("copy_in_turn", as before) and run on
  a side stream beside the next forward ("copy_overlapped"); seconds per batch / bare - 1, goal
  <= 5% for every encoding at the 8B shape (--layers 32);
- the device-to-host copy of a "nemo" reply's size into pageable and into pinned memory (GB/s);
- peak GPU memory while the server computes a batch;
- bf16 supervision against a float32 reference (same weights, first sequence of the batch): max
  differences of aux_hidden_states and target_probs, and the share of position_mask that differs;
- a feature request (DFlash's, five layers): bytes per token, round trip and the server's compute
  against the bare capture; and EAGLE-1's compact option on the device: the trainer's
  F.linear(final_hidden, lm_head) against the forward's own logits (max |diff|, bit-identical or not).
One table is printed; --json writes the same numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MISSING = []
try:
    import gpu_features  # beside this script: the feature-request checks
    import gpu_wire  # beside this script: the server over the wire and in the service
    import prometheus_client  # noqa: F401  (the server's metrics)
    import torch
    from gpu_features import synchronize
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as exc:  # say what this image lacks in one line, before any work
    MISSING.append(exc.name)

# Llama-3.1-8B's widths; --layers cuts the depth.
LLAMA_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def build_model(args: argparse.Namespace, dtype) -> LlamaForCausalLM:
    config = LlamaConfig(**(SMALL if args.small else LLAMA_8B), num_hidden_layers=args.layers)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def bare_forward_seconds(runner, input_ids, attention_mask, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):  # the first warms up
        synchronize(runner.info.device)
        start = time.perf_counter()
        runner.forward(input_ids, attention_mask)
        synchronize(runner.info.device)
        times.append(time.perf_counter() - start)
    return times[1:]


def host_copy_gbps(nbytes: int, device: str) -> dict | None:
    """GB/s of one device-to-host copy of ``nbytes`` into pageable and into pinned memory."""
    if not device.startswith("cuda"):
        return None
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    speeds = {}
    for kind, pinned in (("pageable", False), ("pinned", True)):
        target = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        times = []
        for _ in range(4):
            synchronize(device)
            start = time.perf_counter()
            target.copy_(source, non_blocking=pinned)
            synchronize(device)
            times.append(time.perf_counter() - start)
        speeds[kind] = nbytes / statistics.median(times[1:]) / 1e9
    return speeds


def reference_errors(args, model, inputs: dict, vocab: dict, bf16_nemo: dict) -> dict:
    """bf16 supervision from the server against float32 supervision of the same weights (first sequence)."""
    from eagle3_target.protocol.supervision import VocabMapping, build_supervision
    from eagle3_target.server.runners.hf import HFRunner

    reference = HFRunner(model.float(), name="gpu-check-fp32")
    one = {k: v[:1].to(args.device) for k, v in inputs.items()}
    logits, aux = reference.forward(one["input_ids"], one["attention_mask"])
    mapping = VocabMapping(
        vocab["selected_token_ids"].to(args.device), vocab["selected_token_mask"].to(args.device)
    )
    ref = build_supervision(logits, aux, one["input_ids"], one["loss_mask"], mapping)
    got = {k: v[:1] for k, v in bf16_nemo.items()}
    ref_aux = ref["aux_hidden_states"].cpu()
    return dict(
        aux_max_abs=float((got["aux_hidden_states"] - ref_aux).abs().max()),
        aux_ref_max_abs=float(ref_aux.abs().max()),
        target_probs_max_abs=float((got["target_probs"] - ref["target_probs"].cpu()).abs().max()),
        position_mask_differs=float(
            (got["position_mask"].bool() != ref["position_mask"].cpu()).float().mean()
        ),
    )


def draft_vocab(vocab_size: int, size: int) -> dict:
    ids = torch.randperm(vocab_size)[:size]  # unsorted, as NeMo's frequency order is
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[ids] = True
    return {"selected_token_ids": ids, "selected_token_mask": mask}


def encoding_rows(wire_results: dict, in_service: dict, bare: float, tokens: int) -> dict:
    """Each encoding's measures as rates and as overheads over the bare forward."""
    return {
        name: {
            **r,
            "bytes_per_token": r["bytes"] / tokens,
            "tokens_per_s": tokens / r["round_trip_s"],
            "overhead": r["server_compute_s"] / bare - 1,
            "two_in_flight_tokens_per_s": tokens / r["two_in_flight_s"],
            "two_in_flight_overhead": r["two_in_flight_s"] / bare - 1,
            "service_two_in_flight_s": in_service[name],
            "service_two_in_flight_overhead": {m: t / bare - 1 for m, t in in_service[name].items()},
        }
        for name, r in wire_results.items()
    }


async def check(args: argparse.Namespace) -> dict:
    from eagle3_target.server.runners.hf import HFRunner

    model = build_model(args, torch.bfloat16)
    runner = HFRunner(model, name=f"random-llama-{args.layers}-layers")
    vocab_size = model.config.vocab_size
    vocab = draft_vocab(vocab_size, args.draft_vocab)
    input_ids = torch.randint(0, vocab_size, (args.batch, args.seq))
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, : args.seq // 4] = 0  # a prompt part that is not trained on
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "loss_mask": loss_mask}

    ids_dev, mask_dev = input_ids.to(args.device), inputs["attention_mask"].to(args.device)
    bare = statistics.median(bare_forward_seconds(runner, ids_dev, mask_dev, args.repeats))
    bare_dflash = gpu_features.bare_capture_seconds(runner, ids_dev, mask_dev, args.repeats)
    compact = gpu_features.compact_logits(runner, ids_dev[:1], mask_dev[:1])
    app_runner, url, service = await gpu_wire.start_server(runner, args.batch * args.seq)
    try:
        # The trainer's side gets a thread and an event loop of its own, as a trainer process would:
        # the server's sends and the client's receives then overlap (socket calls release the GIL).
        trainer = gpu_wire.over_the_wire(url, runner, inputs, vocab, args.repeats)
        wire_results, supervision = await asyncio.to_thread(asyncio.run, trainer)
        in_service = await gpu_wire.service_two_in_flight(service, inputs, vocab, args.repeats)
    finally:
        await app_runner.cleanup()
    runner.close()  # its hooks go; the float32 reference reuses the same modules
    tokens = args.batch * args.seq
    nemo = supervision["nemo"]
    dflash = wire_results.pop("features")
    return dict(
        device=args.device,
        gpu=torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        torch=torch.__version__,
        shape=dict(batch=args.batch, seq=args.seq, layers=args.layers, **model.config.to_diff_dict()),
        bare_forward=dict(seconds=bare, tokens_per_s=tokens / bare),
        server_overhead=wire_results["nemo"]["server_compute_s"] / bare - 1,
        host_copy_gbps=host_copy_gbps(wire_results["nemo"]["bytes"], args.device),
        encodings=encoding_rows(wire_results, in_service, bare, tokens),
        logits_vs_nemo_max_abs=max(float((supervision["logits"][k] - nemo[k]).abs().max()) for k in nemo),
        hidden_vs_nemo_target_probs_max_abs=float(
            (supervision["hidden"]["target_probs"] - nemo["target_probs"]).abs().max()
        ),
        bf16_vs_fp32=reference_errors(args, model, inputs, vocab, nemo),
        dflash_capture={
            **dflash,
            "bare_capture_s": bare_dflash,
            "bytes_per_token": dflash["bytes"] / tokens,
            "tokens_per_s": tokens / dflash["round_trip_s"],
            "overhead": dflash["server_compute_s"] / bare_dflash - 1,
        },
        eagle1_compact_logits=compact,
    )


def print_table(result: dict) -> None:
    bare = result["bare_forward"]
    print(f"{result['gpu'] or result['device']}, torch {result['torch']}, {result['shape']['layers']} layers")
    print(f"{'what':28} {'seconds':>9} {'tokens/s':>10} {'B/token':>9} {'peak GPU GB':>12}")
    print(f"{'bare forward':28} {bare['seconds']:9.3f} {bare['tokens_per_s']:10.0f}")
    for name, r in result["encodings"].items():
        peak = f"{r['peak_gpu_bytes'] / 1e9:12.2f}" if r["peak_gpu_bytes"] else f"{'-':>12}"
        phases = ", ".join(f"{p} {s:.3f}" for p, s in r["server_phases_s"].items())
        print(
            f"{'server compute, ' + name:28} {r['server_compute_s']:9.3f}   ({phases})\n"
            f"{'round trip, ' + name:28} {r['round_trip_s']:9.3f} {r['tokens_per_s']:10.0f} "
            f"{r['bytes_per_token']:9.0f} {peak}"
        )
    for name, r in result["encodings"].items():
        print(
            f"{'two in flight, ' + name:28} {r['two_in_flight_s']:9.3f} {r['two_in_flight_tokens_per_s']:10.0f}"
        )
    errors = result["bf16_vs_fp32"]
    overheads = "; ".join(
        f"{name} {100 * r['overhead']:.1f}% per request, {100 * r['two_in_flight_overhead']:.1f}% two in flight"
        for name, r in result["encodings"].items()
    )
    print(f"server overhead over the bare forward: {overheads}")
    model = "; ".join(
        f"{name} {100 * r['service_two_in_flight_overhead']['copy_in_turn']:.1f}% -> "
        f"{100 * r['service_two_in_flight_overhead']['copy_overlapped']:.1f}%"
        for name, r in result["encodings"].items()
    )
    print(
        f"model overhead, two in flight, copy to host in the turn -> beside the next forward (goal <= 5%): {model}"
    )
    if result["host_copy_gbps"]:
        copy = result["host_copy_gbps"]
        print(
            f"device to host, one nemo reply: pageable {copy['pageable']:.1f} GB/s, pinned {copy['pinned']:.1f} GB/s"
        )
    dflash, compact = result["dflash_capture"], result["eagle1_compact_logits"]
    print(
        f"feature request {dflash['request']}: {dflash['bytes_per_token']:.0f} B/token, "
        f"{dflash['tokens_per_s']:.0f} tokens/s round trip, server overhead over the bare capture "
        f"{100 * dflash['overhead']:.1f}%; EAGLE-1 compact logits vs the forward's: identical "
        f"{compact['identical']}, max |diff| {compact['max_abs']:.3g}"
    )
    print(
        f"logits vs nemo max |diff| {result['logits_vs_nemo_max_abs']:.3g}; hidden vs nemo target_probs "
        f"{result['hidden_vs_nemo_target_probs_max_abs']:.3g}; bf16 vs fp32: aux {errors['aux_max_abs']:.3g} "
        f"(of {errors['aux_ref_max_abs']:.3g}), target_probs {errors['target_probs_max_abs']:.3g}, "
        f"position_mask differs at {100 * errors['position_mask_differs']:.2f}%"
    )


def split_check(args: argparse.Namespace) -> int:
    """bench/tensor_parallel.py at 8B widths (layers cut to --layers), bf16, one GPU per rank."""
    if torch.cuda.device_count() < args.tensor_parallel_size:
        print(f"--tensor-parallel-size {args.tensor_parallel_size} needs as many GPUs", file=sys.stderr)
        return 2
    flags = [
        "--device",
        "cuda",
        "--dtype",
        "bfloat16",
        "--tensor-parallel-size",
        str(args.tensor_parallel_size),
    ]
    flags += ["--layers", str(args.layers), "--batch", str(args.batch), "--seq", str(args.seq)]
    flags += ["--repeats", str(args.repeats), *(["--json", args.json] if args.json else [])]
    if not args.small:
        flags += ["--hidden", "4096", "--vocab", "128256"]
    bench = Path(__file__).with_name("tensor_parallel.py")
    return subprocess.run([sys.executable, str(bench), *flags], check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument(
        "--small", action="store_true", help="a tiny Llama (hidden 64, vocab 512) instead of 8B widths"
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=8,
        help="decoder layers (default 8; at least 7 for the default aux layers)",
    )
    parser.add_argument("--batch", type=int, default=4, help="sequences per batch (default 4)")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence (default 2048)")
    parser.add_argument(
        "--draft-vocab", type=int, default=32000, help="draft vocabulary size (default 32000)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up (default 5)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="above 1: tokens/s and per-request overhead of `serve` split over this many GPUs against one "
        "(bench/tensor_parallel.py), instead of the one-GPU check",
    )
    args = parser.parse_args()
    if args.tensor_parallel_size > 1:
        return split_check(args)
    if MISSING:
        print(
            f"gpu_check needs {', '.join(MISSING)}: pip install it beside the preinstalled torch",
            file=sys.stderr,
        )
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here; run with --device cpu --small for the CPU check", file=sys.stderr)
        return 2
    result = asyncio.run(check(args))
    print_table(result)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
