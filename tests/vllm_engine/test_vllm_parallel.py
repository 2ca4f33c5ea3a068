"""The vllm engine split over ranks (tensor parallel 2, pipeline parallel 2, the mp executor's worker
processes on this CPU) against the one-device hf engine: EAGLE-3's nemo encoding, a DFlash feature
request and /weights/lm_head within 1e-4; a dead rank makes the runner unhealthy and leaves no worker."""

import os
import signal
import time

import pytest
from parallel_support import TOLERANCE

from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.runners import load_runner

from .split_support import AUX_LAYER_IDS, NODE_ENV, alive, gaps, replies

# Each engine starts in 25-70 s on 2 idle cores, several minutes on a loaded machine.
pytestmark = pytest.mark.timeout(1200)

LAYOUTS = {
    "tp2": ParallelLayout(tensor_parallel_size=2),
    "pp2": ParallelLayout(pipeline_parallel_size=2),
}


def options(model: str) -> dict:
    return dict(model=model, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def split(request, order_one_dir, monkeypatch_module):
    for key, value in NODE_ENV.items():
        monkeypatch_module.setenv(key, os.environ.get(key, value))
    runner = load_runner("vllm", parallel=LAYOUTS[request.param], **options(order_one_dir))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_every_reply_is_within_1e_4_of_one_device(split, one_device):
    got = gaps(replies(split), one_device)
    print("largest gaps", split.parallel, got)
    assert max(got.values()) <= TOLERANCE, got
    assert split.healthy()
    assert "hidden" in split.info.encodings  # each logit is still one head row times the final state


def test_a_dead_worker_makes_the_runner_unhealthy_and_takes_the_others_with_it(split):
    workers = [w.proc.pid for w in split.executor.workers]
    assert len(workers) == 2 and split.healthy()
    os.kill(workers[-1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while split.healthy() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not split.healthy()
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)], "orphan vLLM workers"
