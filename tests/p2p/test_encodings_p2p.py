"""The supervision encodings over the point-to-point path (gloo, real processes) on the HF runner."""

import signal

import pytest

from .p2p_support import result, start_server, worker


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 2e-3)])
def test_encodings_over_gloo_against_nemo(dtype, tolerance):
    server = start_server("--engine", "hf", "--dtype", dtype)
    try:
        out = result(worker("compare", server.url, "--batches", "2", "--seq", "32"), timeout=180)
    finally:
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(15)
    for encoding in ("nemo", "logits", "hidden"):
        assert out[encoding]["transfers"] == 2 and out[encoding]["fallbacks"] == 0, out
    assert out["logits"]["exact"] and out["logits"]["max_diff"] == 0.0, out
    assert out["hidden"]["max_diff"] <= tolerance, out
