"""A trainer in its own process, for hostile-server tests: its peak memory is its own to measure.

Reads one case per line on stdin (JSON), answers one result per line on stdout. Before each
case the peak resident size (VmHWM) is reset through /proc/self/clear_refs, so each result
says how far above its starting size that case drove the trainer. A case builds a
RemoteTargetBackend on the given endpoints, fetches the input embeddings if asked, runs its
batches and compares every one with the reference supervision computed here.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from client_support import draft_vocab, expected, make_batch  # noqa: E402

from eagle3_target.client import BatchInputs, Features, PoolOptions, RemoteTargetBackend  # noqa: E402
from eagle3_target.server.runners.base import Capture, ForwardInputs  # noqa: E402
from eagle3_target.server.runners.synthetic import SyntheticRunner  # noqa: E402


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run_case(case: dict) -> dict:
    runner, vocab = SyntheticRunner(), draft_vocab()
    options = PoolOptions(**case.get("options", {}))
    features = Features(**case["features"]) if "features" in case else None
    result: dict = {"correct": 0, "error": None}
    with RemoteTargetBackend(
        case["endpoints"], options=options, encoding=case.get("encoding"), features=features
    ) as backend:
        result["wait_for_servers"] = backend.wait_for_servers(case.get("settle", 0.0))
        for name in case.get("weights", []):
            assert torch.equal(backend.target_weight(name), runner.weight(name)), f"wrong weight {name}"
        for seed in range(case.get("captures", 0)):
            ids, mask, loss = make_batch(seed)
            got = backend.capture(BatchInputs(ids, mask, loss))
            want = runner.capture(ForwardInputs(ids, mask), Capture.of(features))
            for key in got:
                assert torch.equal(got[key], getattr(want, key)), f"capture {seed}: wrong {key}"
            result["correct"] += 1
        if case.get("embeddings"):
            weight = backend.get_input_embeddings().weight
            assert torch.equal(weight, runner.input_embeddings()), "wrong input embeddings"
            result["embeddings"] = True
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        for seed in range(case.get("batches", 0)):
            ids, mask, loss = make_batch(seed)
            got = backend.generate_batch(ids, mask, loss)
            for key, value in expected(runner, vocab, ids, mask, loss).items():
                have = getattr(got, key)
                if case.get("encoding") == "hidden" and key == "target_probs":  # approximate by design
                    assert (have - value).abs().max() <= 0.02, f"batch {seed}: wrong {key}"
                else:
                    assert torch.equal(have, value), f"batch {seed}: wrong {key}"
            result["correct"] += 1
        time.sleep(case.get("linger", 0.0))  # background tasks (heartbeats) meet the hostile server
        result["servers"] = backend.pool.describe_members()
        result["failovers"], result["hedges"] = backend.pool.failovers, backend.pool.hedges
    return result


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(1)
    run_case  # noqa: B018 -- imports above are warm before the first case's baseline
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        start_kb, started = _status_kb("VmRSS"), time.monotonic()
        try:
            result = run_case(case)
        except AssertionError as exc:
            result = {"wrong": str(exc)}
        except Exception as exc:
            result = {
                "error": f"{type(exc).__name__}: {str(exc)[:2000]}",
                "trace": traceback.format_exc()[-3000:],
            }
        result["peak_mb"] = (_status_kb("VmHWM") - start_kb) / 1024
        result["seconds"] = time.monotonic() - started
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
