"""The p2p groups on their own: a real gloo pair over loopback (two threads, two groups)."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from eagle3_target.protocol.p2p import GLOO, PeerGroup
from eagle3_target.protocol.rendezvous import TransferError, listen
from eagle3_target.server.p2p.options import PortRange


@pytest.fixture
def pair():
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with ThreadPoolExecutor(1) as pool:
        server = pool.submit(PeerGroup.host, sock, GLOO, 5.0)
        client = PeerGroup.join("127.0.0.1", port, GLOO, 5.0)
        server = server.result(10)
    yield server, client
    server.close()
    client.close()


def test_every_wire_dtype_round_trips_with_byte_views_and_none(pair):
    server, client = pair
    tensors = {
        "bf16": torch.randn(2, 3).bfloat16(),
        "missing": None,
        "bool": torch.rand(2, 3, 1) > 0.5,
        "int8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "int16": torch.tensor([[1, -2], [300, -32000]], dtype=torch.int16),
        "f32": torch.randn(4),
        "i64": torch.arange(5) - 2,
    }
    metadata = {k: None if t is None else (t.dtype, list(t.shape)) for k, t in tensors.items()}
    with ThreadPoolExecutor(1) as pool:
        received = pool.submit(client.recv, metadata, 3, 5.0)
        sent = server.send(tensors, 3, 5.0)
        received = received.result(10)
    assert sent == sum(t.numel() * t.element_size() for t in tensors.values() if t is not None)
    assert list(received) == list(tensors)
    for key, tensor in tensors.items():
        if tensor is None:
            assert received[key] is None
        else:
            assert received[key].dtype == tensor.dtype and torch.equal(received[key], tensor), key


def test_sequence_mismatch_closes_the_receivers_group(pair):
    server, client = pair
    with ThreadPoolExecutor(1) as pool:
        received = pool.submit(client.recv, {"x": (torch.float32, [2])}, 4, 5.0)
        server.send({"x": torch.ones(2)}, 5, 5.0)
        with pytest.raises(TransferError, match="expected transfer 4"):
            received.result(10)
    assert client.closed


def test_send_to_a_peer_that_never_receives_times_out_and_closes(pair):
    server, _ = pair
    start = time.monotonic()
    with pytest.raises(TransferError, match="(?i)timed out"):
        server.send({"x": torch.ones(1 << 20)}, 0, 0.5)
    assert time.monotonic() - start < 5 and server.closed
    with pytest.raises(TransferError, match="closed"):
        server.send({"x": torch.ones(1)}, 1, 0.5)


def test_join_without_a_server_fails_within_its_timeout():
    port = listen("127.0.0.1", 0)
    free = port.getsockname()[1]
    port.close()
    start = time.monotonic()
    with pytest.raises(TransferError, match="rendezvous"):
        PeerGroup.join("127.0.0.1", free, GLOO, 1.0)
    assert time.monotonic() - start < 10


def test_a_taken_port_is_refused_and_port_ranges_parse():
    sock = listen("127.0.0.1", 0)
    with pytest.raises(OSError):
        listen("127.0.0.1", sock.getsockname()[1])
    sock.close()
    assert (PortRange.parse("8101-8164").start, len(PortRange.parse("8101-8164"))) == (8101, 64)
    assert list(PortRange.parse("9000")) == [9000]
    for bad in ("x-y", "9-8", "0-5", "1-70000"):
        with pytest.raises(ValueError):
            PortRange.parse(bad)


def test_join_honours_its_timeout_against_a_port_that_never_answers():
    silent = listen("127.0.0.1", 0)  # the kernel completes connections; nobody ever speaks
    start = time.monotonic()
    try:
        with pytest.raises(TransferError, match="within 2s"):
            PeerGroup.join("127.0.0.1", silent.getsockname()[1], GLOO, 2.0)
    finally:
        silent.close()
    assert time.monotonic() - start < 6
