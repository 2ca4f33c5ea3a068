"""The whole point-to-point path between a real server process and real client processes (gloo on CPU)."""

import signal

from .p2p_support import P2P_TIMEOUT, read_line, result, worker


def test_p2p_batches_equal_the_reference_and_count_as_nccl_bytes(server_process):
    before = server_process.metric("eagle3_target_sent_bytes_total", path="p2p")
    out = result(worker("batches", server_process.url, "--batches", "3"))
    assert out == {**out, "ok": True, "transfers": 3, "fallbacks": 0}
    assert server_process.metric("eagle3_target_sent_bytes_total", path="p2p") > before


def test_wire_path_forced_never_builds_a_group(server_process):
    before = server_process.metric("eagle3_target_sent_bytes_total", path="p2p")
    out = result(worker("batches", server_process.url, "--data-path", "wire", "--batches", "2"))
    assert out == {**out, "ok": True, "transfers": 0}
    assert server_process.metric("eagle3_target_sent_bytes_total", path="p2p") == before


def test_client_killed_mid_transfer_then_next_clients_served_on_both_paths(server_process):
    failed = server_process.metric("eagle3_target_p2p_teardowns_total", reason="send_failed")
    # Large enough that the server is still sending when the worker stops receiving.
    staller = worker("stall", server_process.url, "--batch", "4", "--seq", "512")
    read_line(staller, "STALLED")
    staller.send_signal(signal.SIGKILL)
    staller.wait(10)
    server_process.wait_metric(
        "eagle3_target_p2p_teardowns_total", failed + 1, timeout=P2P_TIMEOUT + 5, reason="send_failed"
    )
    assert result(worker("batches", server_process.url, "--data-path", "wire", "--batches", "1"))["ok"]
    out = result(worker("batches", server_process.url, "--batches", "2"))
    assert out == {**out, "ok": True, "transfers": 2, "fallbacks": 0}


def test_two_sessions_at_once_each_get_their_own_batches(server_process):
    a = worker("batches", server_process.url, "--barrier", "--batches", "3")
    b = worker("batches", server_process.url, "--barrier", "--batches", "3", "--seq", "48")
    read_line(a, "READY")
    read_line(b, "READY")
    assert server_process.metric("eagle3_target_p2p_groups") == 2  # one group per session, both up
    for proc in (a, b):
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [result(a), result(b)]
    assert results[0]["session"] != results[1]["session"]
    for out in results:
        assert out == {**out, "ok": True, "transfers": 4, "fallbacks": 0}  # the barrier batch, then three
