"""Tokens/s of ViSpec stage 2's and DSpark-VLM's requests through one server against the bare forward, on
image-text targets on the CPU (family_features.py's part 3 for the families whose request carries images).

    PYTHONPATH=src OMP_NUM_THREADS=2 python bench/vlm_throughput.py [--json out.json]
    PYTHONPATH=src python bench/vlm_throughput.py --small     # what tests/bench runs

The target is a random Qwen2.5-VL with the CPU bench's text proportions (engine_throughput's Llama: hidden
512, 8 layers, vocabulary 32000) and a 2-layer vision tower; each of the two rows holds two 112x112 images
(16 image tokens each), their pixel_values in bfloat16 as NeMo's pipeline sends them. Every request carries
the batch's images; the bare capture is the same runner called directly, measured in turn in this run.
DSpark-VLM's request (NeMo takes it for MiniMax M3 VL only) goes to a random MiniMax M3 VL of the same text
proportions (dense layers, head 64), with the same images: NeMo's default layers for a 5-layer draft.
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
from family_features import ON_VLM, families, image_text, through_server  # noqa: E402  (the sibling bench)
from make_vlm_data import TEXT, VISION, vocabulary  # noqa: E402  (the example's tiny target)
from transformers import (  # noqa: E402
    MiniMaxM3SparseForConditionalGeneration,
    MiniMaxM3VLConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
)

from eagle3_target.server.runners.hf import HFRunner  # noqa: E402

BENCH_TEXT = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_attention_heads=8)
SIDE_PATCHES, MERGE = 8, 2  # a 112x112 image: 8x8 patches of 14 px, merged 2x2 into 16 image tokens
PATCH_DIM = 3 * 2 * 14 * 14
DSPARK_LAYERS = [1, 2, 4, 6, 7]  # NeMo's build_target_layer_ids(8, 5): a 5-layer draft on 8 layers


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


def build_minimax(small: bool) -> MiniMaxM3SparseForConditionalGeneration:
    text = {**TEXT} if small else {**TEXT, **BENCH_TEXT, "num_key_value_heads": 8}
    head, layers = text["hidden_size"] // text["num_attention_heads"], text["num_hidden_layers"]
    config = MiniMaxM3VLConfig(
        text_config=dict(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            dense_intermediate_size=text["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"],
            head_dim=head,
            rotary_dim=head // 2,
            mlp_layer_types=["dense"] * layers,
            max_position_embeddings=4096,
            bos_token_id=1,
            eos_token_id=2,
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
        image_token_index=text["vocab_size"] - 1,
        video_token_index=text["vocab_size"] - 4,
        projector_hidden_size=text["hidden_size"],
    )
    torch.manual_seed(0)
    return MiniMaxM3SparseForConditionalGeneration(config).eval()


def image_batch(marks: tuple[int, int, int], rows: int, seq: int, per_row: int = 2):
    """``rows`` rows of ``seq`` random words, each with ``per_row`` images' placeholders (``marks``: the vision
    start, image and vision end token ids), and the images."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(7, 900, (rows, seq), generator=gen)
    tokens = SIDE_PATCHES**2 // MERGE**2
    for row in range(rows):
        for image in range(per_row):
            start = 4 + image * (tokens + 8)
            ids[row, start] = marks[0]
            ids[row, start + 1 : start + 1 + tokens] = marks[1]
            ids[row, start + 1 + tokens] = marks[2]
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
    config = model.config
    marks = (config.vision_start_token_id, config.image_token_id, config.vision_end_token_id)
    batch, images = image_batch(marks, rows, seq)
    layers = model.config.text_config.num_hidden_layers
    asks = {}
    for name, family in families().items():  # each whose request carries images: ViSpec's stage 2
        if image_text(family):
            asks[name] = family.ask([], layers)
            if family.compact is not None:
                asks[f"{name} compact"] = family.compact([], layers)
    served = through_server(HFRunner(model, name="bench-vlm"), asks, batch, args.repeats, images=images)
    minimax = build_minimax(args.small)
    dspark = {label: families()[name].ask(DSPARK_LAYERS, layers) for label, (name, *_) in ON_VLM.items()}
    # MiniMax's config names no vision start and end marks: the two words below the image token stand in
    image = minimax.config.image_token_id
    mm_batch, _ = image_batch((image - 2, image, image - 1), rows, seq)
    runner = HFRunner(minimax, name="bench-minimax")
    served |= through_server(runner, dspark, mm_batch, args.repeats, images=images)
    result = dict(
        machine=f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        torch=torch.__version__,
        cpu_shape=dict(
            batch=rows, seq=seq, image_tokens=int((batch[0] == model.config.image_token_id).sum())
        ),
        through_one_server=served,
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
