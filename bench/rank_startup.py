"""Trainer start-up with 1, 2 and 4 data-parallel ranks (torchrun, gloo) against two HF servers on CPU.

Each rank runs our TrainEagle3Recipe's setup(): its own client session (join, vocab mapping to every
server), NeMo's data and draft, and the target's input embeddings, which rank 0 fetches and broadcasts to
the others (client/nemo/ranks.py). With --per-rank-fetch every rank fetches them itself, for comparison.
The target is a random Llama with a large vocabulary (--vocab x --hidden, float32: the embedding blob is
what grows with the rank count), served by `eagle3-target serve --engine hf`; NeMo AutoModel is needed.

    python bench/rank_startup.py                     # ranks 1, 2, 4; shared and per-rank fetch
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


def write_target(root: Path, vocab: int, hidden: int) -> None:
    from eagle3_target.server.runners.tiny import build_tiny_llama

    data = make_data()
    shape = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=8)
    build_tiny_llama(seed=0, **shape).save_pretrained(root / "model")
    words = data.write_tokenizer(root / "model")
    data.write_conversations(root / "chats.jsonl", words, 64)
    shutil.copytree(root / "model", root / "trainer", ignore=shutil.ignore_patterns("*.safetensors"))


def recipe_yaml(root: Path, endpoints: str) -> Path:
    import yaml

    config = {
        "dist_env": {"backend": "gloo"},
        "recipe_args": {
            "target_model_name_or_path": str(root / "trainer"),
            "train_data_path": str(root / "chats.jsonl"),
            "seq_length": 64,
            "micro_batch_size": 2,
            "ttt_steps": 2,
            "num_epochs": 1,
            "draft_vocab_size": 256,
            "output_dir": str(root / "out"),
        },
        "optimizer": {"lr": 1e-3},
        "remote_target": {"endpoints": endpoints, "wait_timeout": 60},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def worker(config: str, per_rank_fetch: bool) -> None:
    """One rank: our recipe's setup(), timed; a JSON line per rank on stdout."""
    import torch.distributed as dist
    from nemo_automodel.components.config._arg_parser import parse_args_and_load_config

    from eagle3_target.client.nemo import TrainEagle3Recipe, backend

    if per_rank_fetch:
        backend.fetched_once = lambda fetch, device=None: fetch()
    fetching = {}
    original = backend.NeMoTargetBackend.get_input_embeddings

    def timed(self):
        start = time.perf_counter()
        try:
            return original(self)
        finally:
            fetching["seconds"] = time.perf_counter() - start

    backend.NeMoTargetBackend.get_input_embeddings = timed
    recipe = TrainEagle3Recipe(parse_args_and_load_config(argv=["--config", config]))
    start = time.perf_counter()
    recipe.setup()
    setup = time.perf_counter() - start
    line = {"rank": dist.get_rank(), "setup": setup, "embeddings": fetching["seconds"]}
    # One write(2) of under PIPE_BUF bytes: the ranks share torchrun's stdout, and print's separate
    # writes of text and newline interleaved between ranks under load.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"RESULT {json.dumps(line)}\n".encode())
    recipe.target_wrapper.close()


def torchrun(ranks: int, config: Path, per_rank_fetch: bool) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    # --standalone: torchrun binds its own free rendezvous port (a port picked beforehand can be taken meanwhile)
    cmd += ["--standalone", __file__, "--worker", str(config)]
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
    p.add_argument("--vocab", type=int, default=65536)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--per-rank-fetch", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.per_rank_fetch)
    megabytes = args.vocab * args.hidden * 4 / 1e6
    print(f"target embeddings {args.vocab} x {args.hidden} float32 = {megabytes:.0f} MB; 2 HF servers; gloo")
    print(f"{'ranks':>5}  {'fetch':9}{'torchrun s':>11}{'setup s (max rank)':>20}{'embeddings s (max)':>20}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_target(root, args.vocab, args.hidden)
        with hf_server(str(root / "model"), 1) as first, hf_server(str(root / "model"), 1) as second:
            config = recipe_yaml(root, f"{first},{second}")
            for ranks in (int(n) for n in args.ranks.split(",")):
                for per_rank in (False, True):
                    if per_rank and ranks == 1:
                        continue
                    wall, lines = torchrun(ranks, config, per_rank)
                    setup = max(line["setup"] for line in lines)
                    embeddings = max(line["embeddings"] for line in lines)
                    fetch = "per rank" if per_rank else "once"
                    print(f"{ranks:>5}  {fetch:9}{wall:>11.1f}{setup:>20.2f}{embeddings:>20.2f}")


if __name__ == "__main__":
    main()
