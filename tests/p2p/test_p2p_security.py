"""Who may join a session's group, and how rendezvous ports are reserved and given back.

Real `eagle3-target serve` processes and real client and attacker processes on loopback (gloo).
"""

import contextlib
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from eagle3_target.protocol import contract
from eagle3_target.protocol.rendezvous import hello, listen, store_namespace

from .p2p_support import read_line, result, start_server, worker

HELD = "eagle3_target_p2p_ports_held"
TEARDOWNS = "eagle3_target_p2p_teardowns_total"


def init_nccl(url: str, session: str, body: dict, token: str | None = None) -> tuple[int, dict]:
    headers = {contract.SESSION_HEADER: session}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}/init_nccl", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def try_init_nccl(*args) -> None:
    with contextlib.suppress(OSError):  # answered "failed", or cut off by the exiting server
        init_nccl(*args)


AUTHENTICATED = {"backend": "gloo", "auth": contract.P2P_AUTH}


def stop(server, timeout: float = 60) -> float:
    """SIGTERM the server; return the seconds it took to exit."""
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        pytest.fail(f"the server did not exit within {timeout}s of SIGTERM")
    return time.monotonic() - start


@pytest.fixture
def fresh_server(request):
    servers = []

    def start(*extra: str):
        servers.append(start_server(*extra))
        return servers[-1]

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def victim_reply(proc) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()[-3000:]
    return json.loads(line)


def test_a_stranger_on_the_port_before_the_trainer_cannot_join(server_process):
    """NeMo's layout is public: a stranger who connects first waits for keys that never come."""
    victim = worker("victim", server_process.url)
    reply = victim_reply(victim)
    attacker = worker("attack", f"{reply['host']}:{reply['nccl_port']}", "--timeout", "8")
    read_line(attacker, "CONNECTED")
    victim.stdin.write("go\n")
    victim.stdin.flush()
    out = result(victim)
    assert out == {"first_join": "ok", "ok": True, "transfers": 1}
    read_line(attacker, "REFUSED")


def test_a_stranger_who_read_the_store_fails_the_challenge_and_is_counted(server_process):
    """TCPStore lets anyone connected list its keys: give the attacker the namespace and the hello.

    The secret itself never enters the store, so the attacker cannot answer the challenge sent
    over the group: it is dropped before any tensor, logged and counted, and the victim gets a
    fresh group of its own.
    """
    rejected = server_process.metric(TEARDOWNS, reason="peer_rejected")
    victim = worker("victim", server_process.url)
    reply = victim_reply(victim)
    port, secret = reply["nccl_port"], reply["secret"]
    _, value = hello(secret)
    attacker = worker(
        "attack",
        f"{reply['host']}:{port}",
        "--timeout",
        "30",
        "--namespace",
        store_namespace(port, secret),
        "--hello",
        value.hex(),
    )
    read_line(attacker, "CONNECTED")
    read_line(attacker, "JOINED")
    read_line(attacker, "CLOSED")
    server_process.wait_metric(TEARDOWNS, rejected + 1, reason="peer_rejected")
    victim.stdin.write("go\n")
    victim.stdin.flush()
    out = result(victim)
    assert out["first_join"].startswith("failed") and out["ok"] and out["transfers"] == 1
    assert attacker.wait(30) == 0


def test_without_a_token_nothing_is_reserved_and_nemo_mode_needs_the_opt_in(tmp_path, fresh_server):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    server = fresh_server("--auth-token-file", str(token_file))
    named = {"backend": "gloo", "nccl_port": server.ports[0]}
    for body in (AUTHENTICATED, named):
        status, reply = init_nccl(server.url, "anon", body)
        assert (status, reply["error"]) == (401, "unauthorized")
    status, reply = init_nccl(server.url, "nemo", named, token="s3cret")
    assert (status, reply["error"]) == (403, "p2p_auth_required") and "--allow-unauthenticated-p2p" in reply[
        "detail"
    ]
    assert server.metric(HELD) == 0
    listen("127.0.0.1", server.ports[0]).close()  # never bound
    status, reply = init_nccl(server.url, "ours", AUTHENTICATED, token="s3cret")
    assert status == 200 and reply["status"] == "ok" and len(reply["secret"]) == 64
    assert server.metric(HELD) == 1

    allowing = fresh_server("--auth-token-file", str(token_file), "--allow-unauthenticated-p2p")
    status, reply = init_nccl(allowing.url, "nemo", {"backend": "gloo"}, token="s3cret")
    assert status == 200 and reply["status"] == "ok" and "secret" not in reply


def test_a_port_outside_the_range_gets_400_and_is_never_bound(server_process):
    held = server_process.metric(HELD)
    squatted = listen("127.0.0.1", 0)  # held by us: a server that bound it would fail, not refuse
    try:
        outside = [squatted.getsockname()[1], server_process.ports[1] + 1]
        for port in outside:
            status, reply = init_nccl(server_process.url, "named", {"backend": "gloo", "nccl_port": port})
            assert (status, reply["error"]) == (400, "port_out_of_range"), reply
        listen("127.0.0.1", outside[1]).close()
    finally:
        squatted.close()
    assert server_process.metric(HELD) == held


def test_abandoned_rendezvous_exhaust_an_8_port_block_then_free_it(fresh_server):
    # Long enough that no reservation lapses while the block is being filled, even on a loaded machine.
    server = fresh_server("--p2p-rendezvous-timeout", "15")
    # At most one pending rendezvous per session: a second init replaces the first.
    for _ in range(3):
        assert init_nccl(server.url, "again", AUTHENTICATED)[1]["status"] == "ok"
    server.wait_metric(HELD, 1)
    ports = {init_nccl(server.url, f"s{i}", AUTHENTICATED)[1]["nccl_port"] for i in range(7)}
    assert len(ports) == 7 and all(server.ports[0] <= p <= server.ports[1] for p in ports)
    status, reply = init_nccl(server.url, "late", AUTHENTICATED)
    assert status == 200 and reply["status"] == "failed" and "reserved" in reply["detail"]
    # Nobody joins: every port comes back after the rendezvous timeout, well before the transfer timeout.
    server.wait_metric(HELD, 0, timeout=60)
    assert server.metric(TEARDOWNS, reason="rendezvous_failed") == 8
    assert init_nccl(server.url, "late", AUTHENTICATED)[1]["status"] == "ok"


def test_sigkilled_clients_lose_their_groups_when_their_heartbeats_stop(fresh_server):
    server = fresh_server("--p2p-idle-timeout", "4")
    holder = worker("hold", server.url, "--sessions", "8", "--heartbeat", "1")
    read_line(holder, "HELD", timeout=120)
    assert server.metric(HELD) == 8
    # Heartbeats keep them: the block stays held for longer than the idle timeout (six heartbeats per session
    # at one a second, past the 4 s idle timeout).
    beats = server.metric("eagle3_target_requests_total", code="200", endpoint="heartbeat")
    server.wait_metric_at_least(
        "eagle3_target_requests_total", beats + 6 * 8, code="200", endpoint="heartbeat"
    )
    assert (
        server.metric(HELD) == 8 and init_nccl(server.url, "newcomer", AUTHENTICATED)[1]["status"] == "failed"
    )
    killed = time.monotonic()
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    server.wait_metric(HELD, 0, timeout=60)
    out = result(worker("batches", server.url, "--batches", "1"))
    assert out == {**out, "ok": True, "transfers": 1, "fallbacks": 0}
    assert time.monotonic() - killed < 60
    assert server.metric(TEARDOWNS, reason="peer_silent") == 8


def test_shutdown_does_not_wait_for_pending_rendezvous(fresh_server):
    server = fresh_server("--p2p-rendezvous-timeout", "300", "--p2p-timeout", "300")
    assert init_nccl(server.url, "ours", AUTHENTICATED)[1]["status"] == "ok"
    # NeMo's order: the request stays open until the rendezvous ends; nobody joins.
    named = {"backend": "gloo", "nccl_port": server.ports[1]}
    nemo = threading.Thread(target=try_init_nccl, args=(server.url, "nemo", named), daemon=True)
    nemo.start()
    server.wait_metric(HELD, 2, timeout=60)
    assert stop(server) < 30
    assert server.proc.returncode == 0
