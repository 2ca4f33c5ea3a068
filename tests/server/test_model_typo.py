"""`serve --model X` where X is neither a local folder nor a model on the hub: one line within seconds (one hub
request, no retries), saying there is no such folder when X names no ``org/``."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from huggingface_hub import constants
from target_support import free_port

from eagle3_target.server import preflight
from eagle3_target.server.options import UsageError


class NoSuchRepo(http.server.BaseHTTPRequestHandler):
    """The hub's answer for a repository that does not exist."""

    def do_GET(self):
        self.send_response(401)  # what the hub answers an anonymous client for a missing repo
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch):
    def point_at(endpoint: str) -> None:
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return point_at


def refusal(model: str) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(UsageError) as refused:
        preflight.check_model(model)
    return str(refused.value), time.monotonic() - start


def test_a_typo_of_a_local_folder_with_the_hub_unreachable(hub):
    hub(f"http://127.0.0.1:{free_port()}")  # nothing listens: as a cluster without egress
    line, took = refusal("targt")
    assert line.startswith(
        "--model targt: there is no local folder 'targt', and the hub cannot be reached"
    ), line
    assert took < 10


def test_a_name_the_hub_does_not_have(hub):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub(f"http://127.0.0.1:{server.server_address[1]}")
        line, took = refusal("targt")
        assert line == (
            "--model targt: there is no local folder 'targt', and the hub has no model targt "
            "(a private or gated one needs $HF_TOKEN)"
        )
        line, _ = refusal("meta-llama/Llama-3.1-8Bx")  # an org/name: no word of a folder
        assert line.startswith(
            "--model meta-llama/Llama-3.1-8Bx: the hub has no model meta-llama/Llama-3.1-8Bx"
        )
        assert took < 10
    finally:
        server.shutdown()


def test_offline_mode_looks_in_the_cache_only(hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    line, _ = refusal("targt")
    assert (
        line
        == "--model targt: there is no local folder 'targt', and the hub cache has no such model (HF_HUB_OFFLINE is set)"
    )
