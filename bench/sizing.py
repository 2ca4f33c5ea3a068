"""How many GPUs a replica of a common target needs: the sizing table of docs/deploy.md, from each model's config.

Parameters are counted from the config's shapes (the fields below are copied from each model's config.json
on the Hugging Face hub): embeddings and an untied lm_head, attention (grouped-query, or DeepSeek's
multi-head latent attention), dense or mixture-of-experts MLPs. Per GPU a replica needs

    weights / (gpusPerReplica x nodesPerReplica)
    + T x (2 V + 4 Vd + 6 H) x 1.25        the batch: bf16 logits, float32 draft probs, three bf16 aux
                                            states, a quarter more for the forward's own activations
    + 2 GiB                                 CUDA context
    <= 0.9 x the GPU's memory               the rest: fragmentation, NCCL buffers

with T = 8192 tokens (the server's default --max-batch-tokens) and a 32k draft vocabulary Vd. The batch is
counted on every GPU: the hf engine gathers full logits on every rank. A replica is tensor parallel within
a node (gpusPerReplica of 1, 2, 4 or 8 that divides the heads; vllm replicates KV heads where the size is a
multiple of their count) and pipeline parallel over nodesPerReplica nodes; fewest nodes first.

    python bench/sizing.py            # prints the markdown table
"""

from __future__ import annotations

import math

GB = 1e9
T, VD = 8192, 32000
GPUS = {"H100 80 GB": 80 * GB, "H200 141 GB": 141 * GB}
USABLE = 0.9  # of a GPU's memory: the allocator's fragmentation and NCCL's buffers take the rest

# (name, weight bytes per parameter in the published checkpoint, config fields)
MODELS = [
    ("Llama-3.1-8B", 2, dict(H=4096, L=32, V=128256, heads=32, kv=8, hd=128, inter=14336)),
    ("Llama-3.3-70B", 2, dict(H=8192, L=80, V=128256, heads=64, kv=8, hd=128, inter=28672)),
    ("Qwen3-235B-A22B", 2, dict(H=4096, L=94, V=151936, heads=64, kv=4, hd=128, experts=128, moe_inter=1536)),
    (
        "DeepSeek-V3",
        1,  # published in FP8 (block scales add about 0.01%)
        dict(H=7168, L=61, V=129280, heads=128, kv=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v_hd=128,
             inter=18432, dense_layers=3, experts=256, shared=1, moe_inter=2048),
    ),
    (
        "Kimi-K2",
        1,  # published in FP8
        dict(H=7168, L=61, V=163840, heads=64, kv=64, q_lora=1536, kv_lora=512, nope=128, rope=64, v_hd=128,
             inter=18432, dense_layers=1, experts=384, shared=1, moe_inter=2048),
    ),
]  # fmt: skip # why: one checkpoint's config fields on two lines, as its config.json groups them


def attention(c: dict) -> int:
    H, heads = c["H"], c["heads"]
    if "kv_lora" in c:  # multi-head latent attention
        q = H * c["q_lora"] + c["q_lora"] * heads * (c["nope"] + c["rope"])
        kv = H * (c["kv_lora"] + c["rope"]) + c["kv_lora"] * heads * (c["nope"] + c["v_hd"])
        return q + kv + heads * c["v_hd"] * H
    return 2 * H * heads * c["hd"] + 2 * H * c["kv"] * c["hd"]


def parameters(c: dict) -> int:
    H, L = c["H"], c["L"]
    if "experts" in c:
        dense = c.get("dense_layers", 0)
        moe = (c["experts"] + c.get("shared", 0)) * 3 * H * c["moe_inter"] + H * c["experts"]
        mlp = dense * 3 * H * c.get("inter", 0) + (L - dense) * moe
    else:
        mlp = L * 3 * H * c["inter"]
    return 2 * c["V"] * H + L * attention(c) + mlp


def batch_bytes(c: dict) -> float:
    return T * (2 * c["V"] + 4 * VD + 6 * c["H"]) * 1.25


def splits(c: dict):
    """(gpusPerReplica, nodesPerReplica): fewest nodes first, then fewest GPUs per node."""
    sizes = [g for g in (1, 2, 4, 8) if c["heads"] % g == 0 and (c["kv"] % g == 0 or g % c["kv"] == 0)]
    return sorted(((g, k) for g in sizes for k in range(1, 9) if k <= c["L"]), key=lambda s: (s[1], s[0]))


def smallest(weights: float, c: dict, memory: float) -> tuple[int, int]:
    for g, k in splits(c):
        if weights / (g * k) + batch_bytes(c) + 2 * 2**30 <= USABLE * memory:
            return g, k
    raise ValueError("needs more than 8 nodes")


def main() -> None:
    names = " | ".join(GPUS)
    print(f"| model | params | weights | batch per GPU | {names} |")
    print("| --- | --- | --- | --- |" + " --- |" * len(GPUS))
    for name, width, c in MODELS:
        params = parameters(c)
        weights = params * width
        cells = []
        for memory in GPUS.values():
            g, k = smallest(weights, c, memory)
            cells.append(
                f"{g} x {k}" + ("" if g * k == 1 else f" ({math.ceil(weights / (g * k) / GB)} GB each)")
            )
        dtype = "bf16" if width == 2 else "fp8"
        print(
            f"| {name} | {params / 1e9:,.1f} B | {weights / GB:,.0f} GB {dtype} | {batch_bytes(c) / GB:.1f} GB | "
            + " | ".join(cells)
            + " |"
        )


if __name__ == "__main__":
    main()
