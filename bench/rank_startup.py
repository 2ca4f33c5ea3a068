"""Trainer start-up with 1, 2 and 4 data-parallel ranks (torchrun, gloo) against two HF servers on CPU.

Each rank runs our recipe's setup(): its own client session (join; EAGLE-3's vocab mapping to every
server), NeMo's data and draft, and the target's one-time weights, which rank 0 fetches and broadcasts to
the others (client/nemo/ranks.py): EAGLE-3's input embeddings, or with --family dspark DSpark's input
embeddings and lm_head (the path every feature family takes, client/nemo/features.open_backend). With
--per-rank-fetch every rank fetches them itself, for comparison. The target is a random Llama (DSpark: a
Qwen3) with a large vocabulary (--vocab x --hidden, float32: the weight blobs are what grows with the rank
count), served by `eagle3-target serve --engine hf`; NeMo AutoModel is needed.

    python bench/rank_startup.py                     # ranks 1, 2, 4; shared and per-rank fetch
    python bench/rank_startup.py --family dspark     # the same for DSpark's two weights
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from packing_throughput import hf_server  # noqa: E402


def make_data():
    spec = importlib.util.spec_from_file_location("make_data", ROOT / "examples" / "nemo" / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_target(root: Path, family: str, vocab: int, hidden: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from eagle3_target.server.runners.tiny import TINY_LLAMA, build_tiny_llama

    data = make_data()
    shape = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=8)
    if family == "dspark":  # NeMo's DSpark drafts take Qwen3-style targets
        torch.manual_seed(0)
        config = Qwen3Config(**{**TINY_LLAMA, **shape, "head_dim": hidden // 8})
        model = Qwen3ForCausalLM(config).eval()
    else:
        model = build_tiny_llama(seed=0, **shape)
    model.save_pretrained(root / "model")
    words = data.write_tokenizer(root / "model")
    data.write_conversations(root / "chats.jsonl", words, 64)
    shutil.copytree(root / "model", root / "trainer", ignore=shutil.ignore_patterns("*.safetensors"))


# recipe_args for the families measured here (a family in the registry, its first recipe trained)
FAMILY_ARGS = {
    "eagle3": {"ttt_steps": 2, "draft_vocab_size": 256},
    "dspark": {
        "draft_num_hidden_layers": 1,
        "target_layer_ids": [-1, 3, 7],
        "block_size": 4,
        "num_anchors": 8,
        "mask_token_id": 3,
        "markov_rank": 16,
    },
}


def recipe_yaml(root: Path, family: str, endpoints: str) -> Path:
    import yaml

    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {
            "target_model_name_or_path": str(root / "trainer"),
            "train_data_path": str(root / "chats.jsonl"),
            "seq_length": 64,
            "micro_batch_size": 2,
            "num_epochs": 1,
            "output_dir": str(root / "out"),
            **FAMILY_ARGS[family],
        },
        "optimizer": {"lr": 1e-3},
        "remote_target": {"endpoints": endpoints, "wait_timeout": 60},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def worker(config: str, family: str, per_rank_fetch: bool) -> None:
    """One rank: our recipe's setup(), timed; a JSON line per rank on stdout."""
    import torch.distributed as dist
    from nemo_automodel.components.config._arg_parser import parse_args_and_load_config

    from eagle3_target.client import nemo
    from eagle3_target.client.nemo import backend, fleet_target, ranks, registry

    if per_rank_fetch:  # EAGLE-3's embeddings (backend.py); every other family's weights (ranks.py)
        backend.fetched_once = ranks.fetched_once = lambda fetch, device=None: fetch()
    fetching = {}
    if family == "eagle3":
        owner, name = backend.NeMoTargetBackend, "get_input_embeddings"
    else:
        owner, name = fleet_target, "fetched_weights"
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            fetching["seconds"] = time.perf_counter() - start

    setattr(owner, name, timed)
    recipe_class = nemo.recipe_class(registry.families()[family].recipes[0])
    recipe = recipe_class(parse_args_and_load_config(argv=["--config", config]))
    start = time.perf_counter()
    recipe.setup()
    setup = time.perf_counter() - start
    line = {"rank": dist.get_rank(), "setup": setup, "weights": fetching["seconds"]}
    # One write(2) of under PIPE_BUF bytes: the ranks share torchrun's stdout, and print's separate
    # writes of text and newline interleaved between ranks under load.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"RESULT {json.dumps(line)}\n".encode())
    recipe.target_wrapper.close()


def torchrun(ranks: int, config: Path, family: str, per_rank_fetch: bool) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    # --standalone: torchrun binds its own free rendezvous port (a port picked beforehand can be taken meanwhile)
    cmd += ["--standalone", __file__, "--worker", str(config), f"--family={family}"]
    cmd += ["--per-rank-fetch"] if per_rank_fetch else []
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    lines = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return wall, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--family", choices=sorted(FAMILY_ARGS), default="eagle3")
    p.add_argument("--vocab", type=int, default=65536)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--per-rank-fetch", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.family, args.per_rank_fetch)
    from eagle3_target.client.nemo.registry import families

    weights = len(families()[args.family].request.weights)  # the embeddings; DSpark also the lm_head
    megabytes = weights * args.vocab * args.hidden * 4 / 1e6
    print(
        f"{args.family}: {weights} target weight(s) {args.vocab} x {args.hidden} float32 = {megabytes:.0f} MB; "
        "2 HF servers; gloo"
    )
    print(f"{'ranks':>5}  {'fetch':9}{'torchrun s':>11}{'setup s (max rank)':>20}{'weights s (max)':>20}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_target(root, args.family, args.vocab, args.hidden)
        with hf_server(str(root / "model"), 1) as first, hf_server(str(root / "model"), 1) as second:
            config = recipe_yaml(root, args.family, f"{first},{second}")
            for ranks in (int(n) for n in args.ranks.split(",")):
                for per_rank in (False, True):
                    if per_rank and ranks == 1:
                        continue
                    wall, lines = torchrun(ranks, config, args.family, per_rank)
                    setup = max(line["setup"] for line in lines)
                    fetched = max(line["weights"] for line in lines)
                    fetch = "per rank" if per_rank else "once"
                    print(f"{ranks:>5}  {fetch:9}{wall:>11.1f}{setup:>20.2f}{fetched:>20.2f}")


if __name__ == "__main__":
    main()
