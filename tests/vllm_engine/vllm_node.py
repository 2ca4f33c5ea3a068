"""One node of a two-node vLLM replica on loopback, as a server process would run it (tests start it).

python vllm_node.py head MODEL PORT OUT   # node-rank 0: saves its replies and pids to OUT, then
                                          # lives while the replica is healthy (exit 3 when not)
python vllm_node.py follow MODEL PORT     # node-rank 1: follows the head until it is gone
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from split_support import AUX_LAYER_IDS, NODE_ENV, replies  # noqa: E402

from eagle3_target.server.parallel import ParallelLayout  # noqa: E402
from eagle3_target.server.runners.vllm import VLLMRunner  # noqa: E402


def main(role: str, model: str, port: str, out: str | None = None) -> int:
    for key, value in NODE_ENV.items():
        os.environ.setdefault(key, value)
    layout = dict(tensor_parallel_size=2, nnodes=2, master_addr="127.0.0.1", master_port=int(port))
    options = dict(model=model, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    if role == "follow":
        VLLMRunner.follow(parallel=ParallelLayout(node_rank=1, **layout), **options)
        return 0
    runner = VLLMRunner.load(parallel=ParallelLayout(node_rank=0, **layout), **options)
    workers = [w.proc.pid for w in runner.executor.workers]
    torch.save({"replies": replies(runner), "workers": workers}, out + ".part")
    os.replace(out + ".part", out)
    while runner.healthy():
        time.sleep(0.5)
    print("vllm_node head: the replica is unhealthy; exiting", flush=True)
    runner.close()
    return 3


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
