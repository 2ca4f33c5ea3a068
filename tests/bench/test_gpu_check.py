"""bench/gpu_check.py on the CPU with a tiny Llama: it runs end to end and its JSON holds what it claims."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_the_cpu_and_writes_its_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    args = ["--device", "cpu", "--small", "--batch", "2", "--seq", "32", "--draft-vocab", "128"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), *args, "--repeats", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "server overhead over the bare forward: nemo" in proc.stdout
    assert "copy to host in the turn -> beside the next forward (goal <= 5%): nemo" in proc.stdout
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["shape"]["num_hidden_layers"] == 8
    tokens, hidden, draft = 2 * 32, 64, 128
    encodings = result["encodings"]
    assert list(encodings) == ["nemo", "logits", "hidden"]
    # nemo: bf16 aux states [3H], fp32 probs [Vd], a bool mask and two int64 columns per token, plus headers
    nemo_payload = tokens * (3 * hidden * 2 + draft * 4 + 1 + 8 + 8)
    assert 0 < encodings["nemo"]["bytes"] - nemo_payload < 400
    assert encodings["hidden"]["bytes"] < encodings["logits"]["bytes"] < encodings["nemo"]["bytes"]
    for numbers in encodings.values():
        assert numbers["tokens_per_s"] > 0 and numbers["server_compute_s"] > 0
        assert list(numbers["server_phases_s"]) == ["decode", "forward", "projection", "copy", "encode"]
        assert abs(sum(numbers["server_phases_s"].values()) - numbers["server_compute_s"]) < 0.01
        assert numbers["two_in_flight_tokens_per_s"] * numbers["two_in_flight_s"] == pytest.approx(tokens)
        bare = result["bare_forward"]["seconds"]
        assert numbers["overhead"] == numbers["server_compute_s"] / bare - 1
        assert numbers["peak_gpu_bytes"] is None  # no GPU here
        in_service = numbers["service_two_in_flight_s"]
        assert list(in_service) == ["copy_in_turn", "copy_overlapped"] and min(in_service.values()) > 0
        assert numbers["service_two_in_flight_overhead"] == {m: t / bare - 1 for m, t in in_service.items()}
    assert result["bare_forward"]["tokens_per_s"] > 0
    assert result["server_overhead"] == encodings["nemo"]["overhead"]
    assert result["host_copy_gbps"] is None  # measured on a GPU only
    assert all(f"two in flight, {name}" in proc.stdout for name in encodings)
    assert result["logits_vs_nemo_max_abs"] == 0  # same ops, same device: bit-identical
    assert result["hidden_vs_nemo_target_probs_max_abs"] < 1e-3
    errors = result["bf16_vs_fp32"]
    assert 0 < errors["aux_max_abs"] < 0.05 * errors["aux_ref_max_abs"]
    assert 0 < errors["target_probs_max_abs"] < 1e-2
    assert 0 <= errors["position_mask_differs"] < 0.25
    dflash = result["dflash_capture"]
    assert dflash["request"] == '{"layers":[1,2,3,4,5],"final_hidden":false,"logits":"none","shift":false}'
    assert 0 < dflash["bytes"] - tokens * 5 * hidden * 2 < 200  # five bf16 layers per token, plus headers
    assert dflash["bytes_per_token"] == dflash["bytes"] / tokens and dflash["tokens_per_s"] > 0
    assert dflash["overhead"] == dflash["server_compute_s"] / dflash["bare_capture_s"] - 1
    assert result["eagle1_compact_logits"] == {"max_abs": 0.0, "identical": True}  # CPU: the same op
    assert "feature request" in proc.stdout
