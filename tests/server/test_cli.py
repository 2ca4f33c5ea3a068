"""`eagle3-target serve` as a user runs it: a real process on loopback."""

import concurrent.futures
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import warnings

import pytest
import torch
from target_support import PORT_TAKEN, free_port, generate_body, vocab_body
from transformers import LlamaConfig

from eagle3_target.protocol import contract, wire
from eagle3_target.server.runners.tiny import TINY_LLAMA


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=body, method=method), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def wait_for(condition, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def in_flight(url: str) -> float:
    """The requests the server is handling now (its gauge), less the /metrics request that reads it."""
    text = http("GET", f"{url}/metrics")[1].decode()
    return float(re.search(r"^eagle3_target_requests_in_flight (\S+)$", text, re.M).group(1)) - 1


def start(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "eagle3_target.cli", "serve", "--host", "127.0.0.1", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def serving(*args: str) -> tuple[subprocess.Popen, int, str]:
    """`serve` on a free port, ready: (process, port, url). free_port() only finds a port free now, so the
    server is started again on another one if something took it first."""
    for _ in range(5):
        port = free_port()
        proc = start("--port", str(port), *args)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while proc.poll() is None and http("GET", f"{url}/health")[0] != 200:
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.2)
        if proc.poll() is None:
            return proc, port, url
        err = proc.stderr.read().decode()
        assert PORT_TAKEN in err, err
    raise AssertionError("five ports in a row were taken before the server could bind one")


def test_serve_embedded_default_model_and_exit_on_disconnect():
    proc, port, url = serving("--exit-on-disconnect")
    try:
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
    proc, port, url = serving("--engine", "synthetic", "--auth-token-file", str(token))
    try:
        assert http("POST", f"{url}/disconnect", b"{}")[0] == 401
        req = urllib.request.Request(f"{url}/disconnect", data=b"{}", headers={"Authorization": "Bearer abc"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        # A request answered after the /disconnect: the server went on serving (NeMo's would have exited).
        assert http("GET", f"{url}/health")[0] == 200
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_unloadable_model_exits_non_zero(tmp_path):
    LlamaConfig(**TINY_LLAMA).save_pretrained(tmp_path)  # a config passes the checks; no weights to load
    proc = start("--port", str(free_port()), "--model", str(tmp_path))
    assert proc.wait(timeout=240) == 1  # imports and the failed load crawl on a loaded machine
    assert "loading the target model failed" in proc.stderr.read().decode()


def refused(*args: str) -> str:
    """Run serve with ``args``; it must exit 2 at once with one error line and no traceback."""
    for _ in range(5):  # again on another port if free_port()'s was taken before serve could bind it
        proc = start("--port", str(free_port()), *args)
        try:
            assert proc.wait(timeout=240) == 2  # before any slow work, but imports crawl on a loaded machine
        finally:
            proc.kill()  # one that was not refused is not left serving
        err = proc.stderr.read().decode()
        if PORT_TAKEN not in err:
            break
    assert "Traceback" not in err and "listening on" not in err and "loaded" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return errors[0]


@pytest.fixture(scope="module")
def six_layer_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("six-layers")
    LlamaConfig(**{**TINY_LLAMA, "num_hidden_layers": 6}).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--aux-layer-ids", "1,2"], "three layer ids"),
        (["--aux-layer-ids", "1,2,99"], "[99] out of range for a model with 8 layers"),
        (["--aux-layer-ids", "1,1,2"], "three distinct layer ids"),
        (["--model", "/no/such/model"], "--model /no/such/model: no such directory"),
        (["--model", "./relative-missing"], "no such directory"),
        (["--device", "cuda:0"], "has no usable CUDA; use --device cpu"),
        (["--device", "tpu-ish"], "is not a torch device"),
        (["--engine", "sglang"], "pip install 'eagle3-target[server,sglang]'"),
        (["--engine", "vllm"], "pip install 'eagle3-target[server,vllm]'"),
        (["--nccl-port", "9000", "--nccl-port-range", "9100-9163"], "--nccl-port 9000 is outside"),
        (["--nccl-port", "9164", "--nccl-port-range", "9100-9163"], "--nccl-port-range 9100-9163"),
    ],
)
def test_bad_arguments_are_one_line_before_loading(args, message):
    assert message in refused(*args)


def test_colliding_default_aux_layers_name_the_flag(six_layer_model):
    line = refused("--model", six_layer_model)
    assert "default aux layers [1, 2, 2]" in line and "set --aux-layer-ids" in line


def test_a_taken_port_is_reported_first():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start("--port", str(port), "--model", "/no/such/model")
        assert proc.wait(timeout=60) == 2
        err = proc.stderr.read().decode()
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err and "Traceback" not in err


def test_unknown_log_level_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "--log-level", "chatty", "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "invalid choice: 'CHATTY'" in proc.stderr


def test_a_missing_extra_names_the_install_command():
    code = "import sys; sys.modules['aiohttp'] = None; from eagle3_target.cli import main; sys.exit(main(['serve']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5  # not installed (docs/cli.md)
    assert proc.stderr.strip() == (
        "eagle3-target serve: error: aiohttp is not installed; pip install 'eagle3-target[server]'"
    )


@pytest.mark.parametrize("content", ["", " \n\t\n"])
def test_an_empty_auth_token_file_is_refused_before_the_model_loads(tmp_path, content):
    token = tmp_path / "token"
    token.write_text(content)
    line = refused("--auth-token-file", str(token))  # the hf engine: refused before its slow load
    assert str(token) in line and "is empty" in line


def test_an_unreadable_auth_token_file_is_refused(tmp_path):
    line = refused("--auth-token-file", str(tmp_path / "missing"))
    assert str(tmp_path / "missing") in line and "cannot read it" in line


def test_an_empty_admin_token_file_is_refused_naming_its_flag(tmp_path):
    token = tmp_path / "admin"
    token.write_text("\n")
    line = refused("--admin-token-file", str(token))
    assert line.startswith("eagle3-target serve: error: --admin-token-file ") and "is empty" in line


def test_serving_beyond_loopback_without_auth_warns():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "eagle3_target.cli", "serve", "--engine", "synthetic", "--host", "0.0.0.0"]
    proc = subprocess.Popen([*cmd, "--port", str(free_port())], stderr=subprocess.PIPE, env=env)
    try:
        lines = iter(proc.stderr.readline, b"")
        warning = next(line for line in lines if b"WARNING" in line or b"listening" in line)
        assert b"without --auth-token-file" in warning
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_embedded_model_answers_to_its_name():
    """An Eagle3Target's spec.model cannot be empty, so the operator asks for the embedded model by name."""
    proc, port, url = serving("--model", "embedded-tiny-llama")
    try:
        status, body = http("POST", f"{url}/model_info", b"")
        assert status == 200 and json.loads(body)["model"] == "embedded-tiny-llama"
    finally:
        proc.kill()
        proc.wait()


def test_serve_binds_each_address_it_is_given():
    """A dual-stack pod passes both of its addresses ($(POD_IPS)): one listening socket each, one server."""
    proc, port, url = serving("--host", "127.0.0.1,::1", "--engine", "synthetic")
    try:
        assert http("GET", f"http://[::1]:{port}/health")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    logs = proc.stderr.read().decode()
    assert f"listening on http://127.0.0.1:{port}" in logs and f"listening on http://[::1]:{port}" in logs


def test_serve_names_the_address_it_cannot_bind_and_lets_the_others_go(capsys):
    """In this process, so the check cannot pass on the kernel freeing a dead process's sockets: by the time
    serve has reported the error, the IPv4 socket it bound first is closed, not left to the garbage collector
    (which would warn of an unclosed socket) and no longer holding the port."""
    from eagle3_target.cli import main

    with socket.socket(socket.AF_INET6) as taken:
        taken.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        taken.bind(("::1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            code = main(["serve", "--host", "127.0.0.1,::1", "--port", str(port), "--engine", "synthetic"])
            gc.collect()
        assert code == 2
        assert f"cannot listen on [::1]:{port}" in capsys.readouterr().err
        # Only this socket: gc.collect() also finds what earlier tests left behind.
        ours = [str(w.message) for w in caught if f"laddr=('127.0.0.1', {port})" in str(w.message)]
        assert not ours, ours
        with socket.create_server(("127.0.0.1", port)):  # the IPv4 socket bound first was closed
            pass


def test_double_colon_binds_both_families():
    from eagle3_target.server.process import listen

    with listen("::", 0) as server:
        port = server.getsockname()[1]
        peers = []
        for address in ("127.0.0.1", "::1"):
            with socket.create_connection((address, port), timeout=5):
                conn, peer = server.accept()
                conn.close()
                peers.append(peer[0])
    assert peers == ["::ffff:127.0.0.1", "::1"]  # IPv4 arrives v4-mapped on the one IPv6 socket


def test_sigterm_drains_requests_in_flight_and_refuses_new_ones():
    proc, port, url = serving("--engine", "synthetic", "--forward-delay", "1.5", "--drain-timeout", "20")
    try:
        ids = torch.arange(10)
        mask = torch.zeros(512, dtype=torch.bool)
        mask[ids] = True
        assert http("POST", f"{url}/set_vocab_mapping", vocab_body(ids, mask))[0] == 200
        batch = generate_body(torch.zeros(1, 8, dtype=torch.long))
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            sent = [pool.submit(http, "POST", f"{url}/generate", batch) for _ in range(3)]
            # All three are in the server: one in the forward, two waiting for the compute lock.
            wait_for(lambda: in_flight(url) == 3, "three /generate requests in flight")
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            wait_for(lambda: http("GET", f"{url}/health") == (503, b'{"status": "draining"}'), "draining")
            status, body = http("POST", f"{url}/generate", batch)
            assert status == 503 and json.loads(body)["error"] == "draining"
            for future in sent:
                status, body = future.result()
                assert status == 200 and wire.decode(bytearray(body))["target_probs"].shape == (1, 8, 10)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 20
    finally:
        proc.kill()


def test_sigterm_while_the_model_loads_exits_at_once():
    proc = start("--port", str(free_port()))  # the hf engine: seconds of imports and loading
    try:
        next(line for line in iter(proc.stderr.readline, b"") if b"listening on" in line)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert b"ready:" not in proc.stderr.read()
    finally:
        proc.kill()


def init_nccl(url: str, session: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{url}/init_nccl", json.dumps(body).encode(), {contract.SESSION_HEADER: session}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=60) as resp:
            return resp.status, resp.read()
    except OSError:  # cut off by the exiting server
        return 0, b""


def nemo_rendezvous_pending(url: str, port: int) -> None:
    """A NeMo-style /init_nccl on a named port of the default range, after ours, left open: NeMo's order
    keeps it open until a rendezvous that never comes. A port some other process holds (other servers' ranges
    on a busy machine) is answered "failed" at once, so the next one is tried."""
    replies: list[tuple[int, bytes]] = []
    for nccl_port in range(port + 101, port + 111):
        named = {"backend": "gloo", "nccl_port": nccl_port}
        nemo = threading.Thread(
            target=lambda body: replies.append(init_nccl(url, "nemo", body)), args=(named,), daemon=True
        )
        nemo.start()
        deadline = time.monotonic() + 60
        while b"eagle3_target_p2p_ports_held 2.0" not in http("GET", f"{url}/metrics")[1]:
            if not nemo.is_alive():
                break  # answered at once: that port was taken
            assert time.monotonic() < deadline, "the second rendezvous never became pending"
            time.sleep(0.2)
        else:
            return
    raise AssertionError(f"no rendezvous became pending on ten ports: {replies[-1]}")


def test_sigterm_with_rendezvous_pending_exits_long_before_the_drain_timeout():
    """Nobody joins either group: a pending rendezvous is abandoned, never waited for.

    The exit comes long before --drain-timeout (nothing else is in flight), let alone the
    rendezvous and transfer timeouts.
    """
    proc, port, url = serving(
        "--engine",
        "synthetic",
        "--drain-timeout",
        "30",
        "--p2p-timeout",
        "120",
        "--p2p-rendezvous-timeout",
        "120",
    )
    try:
        status, body = init_nccl(url, "ours", {"backend": "gloo", "auth": contract.P2P_AUTH})
        assert status == 200 and json.loads(body)["status"] == "ok", body
        nemo_rendezvous_pending(url, port)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("still running 15 s after SIGTERM: a pending rendezvous was waited for")
        assert code == 0, proc.stderr.read().decode()[-2000:]
    finally:
        proc.kill()
