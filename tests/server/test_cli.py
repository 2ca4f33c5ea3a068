"""`eagle3-target serve` as a user runs it: a real process on loopback."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=body, method=method), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        if http("GET", f"{url}/health")[0] == 200:
            return
        time.sleep(0.2)
    raise AssertionError("server never became ready")


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "eagle3_target.cli", "serve", "--host", "127.0.0.1", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def test_serve_embedded_default_model_and_exit_on_disconnect():
    port = free_port()
    proc = start("--port", str(port), "--exit-on-disconnect")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        status, body = http("POST", f"{url}/model_info", b"")
        info = json.loads(body)
        assert status == 200 and info["model"] == "embedded-tiny-llama" and info["aux_layer_ids"] == [1, 3, 4]
        assert http("POST", f"{url}/disconnect", b"{}") == (200, b'{"status": "ok"}')
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    logs = proc.stderr.read().decode()
    assert f"listening on http://127.0.0.1:{port}" in logs
    assert "ready: embedded-tiny-llama" in logs


def test_server_keeps_running_after_disconnect_by_default(tmp_path):
    token = tmp_path / "token"
    token.write_text("abc\n")
    port = free_port()
    proc = start("--port", str(port), "--engine", "synthetic", "--auth-token-file", str(token))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        assert http("POST", f"{url}/disconnect", b"{}")[0] == 401
        req = urllib.request.Request(f"{url}/disconnect", data=b"{}", headers={"Authorization": "Bearer abc"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        time.sleep(0.5)
        assert proc.poll() is None
        assert http("GET", f"{url}/health")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_unloadable_model_exits_non_zero(tmp_path):
    proc = start("--port", str(free_port()), "--model", str(tmp_path / "missing"))
    assert proc.wait(timeout=120) == 1
    assert "loading the target model failed" in proc.stderr.read().decode()


@pytest.mark.parametrize(
    "args, message",
    [(["--aux-layer-ids", "1,2"], "three layer ids"), (["--engine", "vllm"], "invalid choice")],
)
def test_bad_arguments_are_refused(args, message):
    proc = start("--port", "1", *args)
    assert proc.wait(timeout=30) == 2
    assert message in proc.stderr.read().decode()
