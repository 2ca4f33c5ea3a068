"""Data-parallel ranks under torchrun (--nproc-per-node 2): NeMo's EAGLE-3 and DFlash recipes (padded and
packed) and its DSpark recipe (padded; a feature-capture family) through our subclasses against two servers
train bit for bit as NeMo's co-located run with two ranks: every micro-batch loss and the final draft of each
rank. Each rank is its own client session; the target's weights cross the network once per job (rank 0
fetches, the others receive them over the trainer's group), and the trainer's copy of the target has no
weight file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from .exactness import make_target, start_fleet, weight_files

WORKER = os.path.join(os.path.dirname(__file__), "ranks_worker.py")
RANKS = 2
ARCHITECTURE = {"eagle3": "llama", "dflash": "qwen3", "dspark": "qwen3"}
# the one-time weights each family's trainer asks for: (endpoint label, requests per job)
WEIGHT_FETCHES = {"eagle3": ("input_embeddings", 1), "dflash": ("weights", 2), "dspark": ("weights", 2)}
CASES = [("eagle3", 0), ("eagle3", 64), ("dflash", 0), ("dflash", 64), ("dspark", 0)]


@pytest.fixture(scope="module")
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    make_target(root, ARCHITECTURE[request.param], chats=32)
    servers = start_fleet(root / "model", ["127.0.0.11", "127.0.0.12"])
    yield request.param, root, servers
    for server in servers:
        server.kill()


def torchrun(family: str, mode: str, root, out, packed: int, endpoints: str = "") -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={RANKS}"]
    cmd += ["--standalone", WORKER, family, mode, str(root), str(out), f"--packed={packed}"]
    cmd += [f"--endpoints={endpoints}"]
    # both runs alike: one intra-op thread per rank, or reductions run in another order
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(RANKS)]


def served(server, endpoint: str) -> float:
    text = server._get("/metrics")[1]
    found = re.search(
        rf'^eagle3_target_requests_total\{{code="200",endpoint="{endpoint}"\}} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize(
    ("family", "packed"),
    CASES,
    ids=[f"{name}-{'packed' if packed else 'padded'}" for name, packed in CASES],
    indirect=["family"],
)
def test_two_ranks_train_bit_identically_to_nemos_colocated_ranks(family, packed, tmp_path):
    name, root, servers = family
    endpoint, per_job = WEIGHT_FETCHES[name]
    fetched = sum(served(s, endpoint) for s in servers)
    reference = torchrun(name, "colocated", root, tmp_path / "nemo", packed)
    ours = torchrun(name, "remote", root, tmp_path / "ours", packed, ",".join(s.url for s in servers))
    assert sum(served(s, endpoint) for s in servers) - fetched == per_job, "weights fetched once per job"
    assert not weight_files(root / "trainer"), "the trainer must not need the target's weights"
    for rank, (got, want) in enumerate(zip(ours, reference, strict=True)):
        assert len(want["losses"]) >= 2 and not torch.equal(want["losses"][0], want["losses"][-1])
        assert torch.equal(got["losses"].view(torch.int32), want["losses"].view(torch.int32)), (
            rank,
            got,
            want,
        )
        assert got["draft"].keys() == want["draft"].keys()
        for key, value in want["draft"].items():
            assert torch.equal(got["draft"][key], value), (rank, key)
    # the ranks saw different data (each its own shard), and both trained
    assert not torch.equal(ours[0]["losses"], ours[1]["losses"])
