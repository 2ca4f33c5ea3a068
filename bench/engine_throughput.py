"""Engine throughput: tokens/s of EAGLE-3 supervision (forward + build_supervision) for hf vs vllm.

Both engines load the same randomly initialised Llama (saved once to a temporary directory, or
--model), and get the same right-padded batches and draft vocabulary. The ratio vllm/hf, both
measured in this run, is the result; absolute numbers depend on the machine. Run it in the vLLM
environment (see docs/vllm.md):

    OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=1 python bench/engine_throughput.py
    python bench/engine_throughput.py --device cuda:0 --dtype bfloat16 --model /models/Llama-3.1-8B
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time

import torch

from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.tiny import build_tiny_llama

# A small Llama with realistic proportions (vocab >> hidden), big enough that the forward dominates.
BENCH_LLAMA = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
)


def batches(count: int, rows: int, seq: int, vocab: int, seed: int = 0):
    """Right-padded rows, lengths between seq/2 and seq, as a packed dataset gives them."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=gen)
        mask = (torch.arange(seq) < lengths[:, None]).long()
        yield torch.randint(0, vocab, (rows, seq), generator=gen) * mask, mask


def measure(runner, work, vocab: VocabMapping, device: str) -> tuple[float, float]:
    """Median and best tokens/s over the batches (one warm-up batch first)."""

    def once(input_ids, mask):
        input_ids, mask = input_ids.to(device), mask.to(device)
        start = time.perf_counter()
        logits, aux = runner.forward(input_ids, mask)
        out = build_supervision(logits, aux, input_ids, mask, vocab)
        out["target_probs"].sum().item()  # waits for the device
        return int(mask.sum()) / (time.perf_counter() - start)

    once(*work[0])
    rates = [once(*batch) for batch in work]
    return statistics.median(rates), max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a model directory or hub id (default: a random 8-layer Llama)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            build_tiny_llama(seed=0, **BENCH_LLAMA).save_pretrained(tmp)
            model = tmp
        options = dict(model=model, dtype=args.dtype, device=args.device, aux_layer_ids=None)
        results = {}
        for engine in ("hf", "vllm"):
            runner = load_runner(engine, **options)
            vocab_size = runner.info.vocab_size
            ids = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(1))[: args.draft_vocab]
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[ids] = True
            vocab = VocabMapping(ids.to(runner.info.device), mask.to(runner.info.device))
            work = list(batches(args.batches, args.rows, args.seq, vocab_size))
            results[engine] = measure(runner, work, vocab, runner.info.device)
            runner.close()

    print(
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"{args.device} {args.dtype}, {args.rows} rows x {args.seq} tokens (half to full), "
        f"{args.batches} batches, draft vocab {args.draft_vocab}"
    )
    for engine, (median, best) in results.items():
        print(f"{engine:5s} median {median:9.0f} tokens/s   best {best:9.0f} tokens/s")
    print(f"vllm / hf (median): {results['vllm'][0] / results['hf'][0]:.2f}")


if __name__ == "__main__":  # vLLM may spawn workers, which re-import this file
    main()
