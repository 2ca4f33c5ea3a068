"""Tokens/s of ViSpec stage 2's requests through one server against the bare forward, on an image-text target on
the CPU (family_features.py's part 3 for the families whose request carries images).

    PYTHONPATH=src OMP_NUM_THREADS=2 python bench/vlm_throughput.py [--json out.json]
    PYTHONPATH=src python bench/vlm_throughput.py --small     # what tests/bench runs

The target is a random Qwen2.5-VL with the CPU bench's text proportions (engine_throughput's Llama: hidden
512, 8 layers, vocabulary 32000) and a 2-layer vision tower; each of the two rows holds two 112x112 images
(16 image tokens each), their pixel_values in bfloat16 as NeMo's pipeline sends them. Every request carries
the batch's images; the bare capture is the same runner called directly, measured in turn in this run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "examples" / "nemo")]
from family_features import through_server  # noqa: E402  (the sibling bench)
from make_vlm_data import TEXT, VISION, vocabulary  # noqa: E402  (the example's tiny target)
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration  # noqa: E402

from eagle3_target.protocol.families import families  # noqa: E402
from eagle3_target.server.runners.hf import HFRunner  # noqa: E402

BENCH_TEXT = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_attention_heads=8)
SIDE_PATCHES, MERGE = 8, 2  # a 112x112 image: 8x8 patches of 14 px, merged 2x2 into 16 image tokens
PATCH_DIM = 3 * 2 * 14 * 14


def build_target(small: bool) -> Qwen2_5_VLForConditionalGeneration:
    ids = {t: i for i, t in enumerate(vocabulary())}
    text = {**TEXT} if small else {**TEXT, **BENCH_TEXT, "num_key_value_heads": 8}
    head = (
        text["hidden_size"] // text["num_attention_heads"]
    )  # mRoPE splits its half as Qwen's does: 1:1.5:1.5
    text["rope_parameters"] = {
        **TEXT["rope_parameters"],
        "mrope_section": [head // 8, 3 * head // 16, 3 * head // 16],
    }
    text.update(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"])
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config={**VISION, "out_hidden_size": text["hidden_size"]},
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def image_batch(config, rows: int, seq: int, per_row: int = 2):
    """``rows`` rows of ``seq`` random words, each with ``per_row`` images' placeholders, and the images."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(7, 900, (rows, seq), generator=gen)
    tokens = SIDE_PATCHES**2 // MERGE**2
    for row in range(rows):
        for image in range(per_row):
            start = 4 + image * (tokens + 8)
            ids[row, start] = config.vision_start_token_id
            ids[row, start + 1 : start + 1 + tokens] = config.image_token_id
            ids[row, start + 1 + tokens] = config.vision_end_token_id
    count = rows * per_row
    images = dict(
        pixel_values=torch.randn(count * SIDE_PATCHES**2, PATCH_DIM, generator=gen).to(torch.bfloat16),
        image_grid_thw=torch.tensor([[1, SIDE_PATCHES, SIDE_PATCHES]] * count, dtype=torch.int64),
    )
    return (ids, torch.ones_like(ids), torch.ones_like(ids)), images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="the example's tiny target (the smoke test)")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    rows, seq = (2, 48) if args.small else (args.rows, args.seq)
    model = build_target(args.small)
    batch, images = image_batch(model.config, rows, seq)
    layers = model.config.text_config.num_hidden_layers
    stage2 = families()["vispec"]  # stage 1 trains on text: its requests carry no images
    asks = {"vispec": stage2.ask([], layers), "vispec compact": stage2.compact([], layers)}
    runner = HFRunner(model, name="bench-vlm")
    result = dict(
        machine=f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        torch=torch.__version__,
        cpu_shape=dict(
            batch=rows, seq=seq, image_tokens=int((batch[0] == model.config.image_token_id).sum())
        ),
        through_one_server=through_server(runner, asks, batch, args.repeats, images=images),
    )
    print(
        f"CPU, {result['machine']}: {rows} x {seq} tokens, {result['cpu_shape']['image_tokens']} image tokens"
    )
    print(f"{'request':22} {'bare s':>8} {'server s':>9} {'server/bare tokens/s':>21}")
    for label, row in result["through_one_server"].items():
        print(f"{label:22} {row['bare_s']:8.3f} {row['server_s']:9.3f} {row['ratio']:21.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
