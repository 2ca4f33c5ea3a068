"""/init_nccl, port allocation, sequence numbers and teardown against an in-process server (gloo on CPU)."""

import asyncio
import json
import socket
import threading
import time

import pytest
import torch
from prometheus_client import CollectorRegistry
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import contract, wire
from eagle3_target.protocol.metadata import decode_metadata
from eagle3_target.protocol.p2p import PeerGroup
from eagle3_target.protocol.rendezvous import TransferError, listen
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.p2p.groups import P2PGroups
from eagle3_target.server.p2p.options import P2POptions, PortRange
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.sessions import Session

from .p2p_support import port_range

V = 512


def options(**kw) -> ServerOptions:
    p2p = P2POptions(port_range=PortRange(*port_range()), timeout=3.0, rendezvous_timeout=3.0, **kw)
    return ServerOptions(p2p=p2p)


async def init(srv, session: str, body: dict | bytes, host_header=None) -> dict:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await srv.http.post(f"{srv.url}/init_nccl", data=data, headers={contract.SESSION_HEADER: session})
    async with resp:
        return {"status_code": resp.status, **(await resp.json())}


async def joined(reply: dict) -> PeerGroup:
    return await asyncio.to_thread(PeerGroup.join, reply["host"], reply["nccl_port"], "gloo", 5.0)


async def session_with_vocab(srv, session: str) -> dict:
    ids = torch.arange(0, V, 5)
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    resp = await srv.post(
        "set_vocab_mapping", vocab_body(ids, mask), headers={contract.SESSION_HEADER: session}
    )
    assert resp.status == 200
    return {contract.SESSION_HEADER: session}


async def test_nemo_replies_stay_exact_and_bad_bodies_get_400():
    async with serve(lambda: SyntheticRunner(vocab_size=V), options()) as srv:
        # A NeMo client asks for NCCL; a CPU server offers gloo only: NeMo's exact "disabled" bytes.
        async with srv.http.post(f"{srv.url}/init_nccl", data=b'{"nccl_port": 9}') as resp:
            assert resp.status == 200 and await resp.read() == b'{"status": "disabled"}'
        for body in (b"not json", b"[1]", b'{"nccl_port": "x"}', b'{"nccl_port": 70000}', b'{"backend": 3}'):
            reply = await init(srv, "s", body)
            assert reply["status_code"] == 400 and reply["error"].startswith("bad_"), body
    async with serve(lambda: SyntheticRunner(vocab_size=V), options(enabled=False)) as srv:
        assert (await init(srv, "s", {"backend": "gloo"}))["status"] == "disabled"
        info = await (await srv.http.post(f"{srv.url}/model_info")).json()
        assert info["p2p"] == {"backend": None}


async def test_ports_come_from_the_range_skip_taken_ones_and_bind_the_pod_address():
    ports = port_range()
    squatter = socket.socket()  # another pod on this node (hostNetwork) holds the first port
    squatter.bind(("127.0.0.2", ports[0]))
    squatter.listen()
    try:
        opts = ServerOptions(p2p=P2POptions(port=ports[0], port_range=PortRange(*ports), timeout=3.0))
        async with serve(lambda: SyntheticRunner(vocab_size=V), opts, host="127.0.0.2") as srv:
            info = await (await srv.http.post(f"{srv.url}/model_info")).json()
            assert info["p2p"] == {"backend": "gloo", "port_range": list(ports)}
            a, b = await init(srv, "a", {"backend": "gloo"}), await init(srv, "b", {"backend": "gloo"})
            assert a["status"] == b["status"] == "ok" and a["host"] == b["host"] == "127.0.0.2"
            assert a["group_name"] == f"nemo_eagle_target_transfer_{a['nccl_port']}"
            assert {a["nccl_port"], b["nccl_port"]} == {ports[0] + 1, ports[0] + 2}
            with pytest.raises(ConnectionRefusedError):  # bound on the pod address only
                socket.create_connection(("127.0.0.1", a["nccl_port"]), timeout=2).close()
            groups = await asyncio.gather(joined(a), joined(b))
            for group in groups:
                group.close()
    finally:
        squatter.close()


async def test_unjoined_group_is_torn_down_and_generate_falls_back_to_the_wire():
    async with serve(lambda: SyntheticRunner(vocab_size=V), options()) as srv:
        headers = await session_with_vocab(srv, "lonely")
        reply = await init(srv, "lonely", {"backend": "gloo"})
        assert reply["status"] == "ok"
        # Nobody joins: the request waits out the rendezvous, then gets the wire blob without the echo.
        async with srv.http.post(
            f"{srv.url}/generate",
            data=generate_body(torch.ones(1, 8, dtype=torch.long)),
            headers={**headers, contract.NCCL_HEADER: "1"},
        ) as resp:
            assert resp.status == 200 and contract.NCCL_HEADER not in resp.headers
            assert set(wire.decode(bytearray(await resp.read()))) == set(contract.SUPERVISION_KEYS)
        assert "lonely" not in srv.server.service.p2p.groups
        listen("127.0.0.1", reply["nccl_port"]).close()  # the store let its port go


async def test_named_port_handshake_sequence_numbers_and_mismatch():
    async with serve(lambda: SyntheticRunner(vocab_size=V), options()) as srv:
        headers = await session_with_vocab(srv, "nemo-like")
        port = srv.server.options.p2p.port_range.end
        # NeMo's order: the client joins while /init_nccl is open; the reply comes after the rendezvous.
        group_task = asyncio.create_task(asyncio.to_thread(PeerGroup.join, "127.0.0.1", port, "gloo", 5.0))
        reply = await init(srv, "nemo-like", {"nccl_port": port, "backend": "gloo"})
        group = await group_task
        assert reply["status"] == "ok" and reply["nccl_port"] == port
        body = generate_body(torch.arange(16).view(2, 8))
        for seq in (0, 1):
            async with srv.http.post(
                f"{srv.url}/generate",
                data=body,
                headers={**headers, contract.NCCL_HEADER: "1", contract.SEQUENCE_HEADER: str(seq)},
            ) as resp:
                assert resp.headers[contract.NCCL_HEADER] == "1" and resp.headers[
                    contract.SEQUENCE_HEADER
                ] == str(seq)
                # The p2p reply names the weights' version as the wire one does (a synthetic runner's: config-)
                assert resp.headers[contract.TARGET_VERSION_HEADER].startswith("config-")
                metadata = decode_metadata(await resp.read())
            assert list(metadata) == list(contract.SUPERVISION_KEYS)
            tensors = await asyncio.to_thread(group.recv, metadata, seq, 5.0)
            assert (
                tensors["position_mask"].dtype == torch.bool
                and tensors["target_probs"].shape[-1] == V // 5 + 1
            )
        # Out of sequence: answered over the wire, the server's group is gone.
        async with srv.http.post(
            f"{srv.url}/generate",
            data=body,
            headers={**headers, contract.NCCL_HEADER: "1", contract.SEQUENCE_HEADER: "5"},
        ) as resp:
            assert contract.NCCL_HEADER not in resp.headers
            wire.decode(bytearray(await resp.read()))
        assert "nemo-like" not in srv.server.service.p2p.groups
        with pytest.raises(TransferError):  # the server's side closed: our receive fails, it does not hang
            await asyncio.to_thread(group.recv, metadata, 2, 5.0)
        assert group.closed


async def test_disconnect_tears_the_sessions_group_down_and_leaves_others():
    async with serve(lambda: SyntheticRunner(vocab_size=V), options()) as srv:
        a, b = await init(srv, "a", {"backend": "gloo"}), await init(srv, "b", {"backend": "gloo"})
        ga, gb = await asyncio.gather(joined(a), joined(b))
        await srv.post("disconnect", b"{}", headers={contract.SESSION_HEADER: "a"})
        assert set(srv.server.service.p2p.groups) == {"b"}
        ga.close()
        gb.close()


async def test_a_cancelled_send_tears_the_group_down_and_frees_its_port():
    registry = CollectorRegistry()
    plane = P2PGroups(P2POptions(port_range=PortRange(*port_range()), timeout=5.0), registry=registry)
    session = Session("s", time.monotonic())
    body = json.dumps({"backend": "gloo", "auth": contract.P2P_AUTH}).encode()
    reply = await plane.init(session, "127.0.0.1", body, "cpu")
    join = PeerGroup.join
    group = await asyncio.to_thread(
        join, "127.0.0.1", reply["nccl_port"], "gloo", 30.0, secret=reply["secret"]
    )
    try:
        async with plane.transfer(session, asked=True, sequence=None) as transfer:
            send = asyncio.create_task(transfer.send({"x": torch.ones(1 << 22)}))  # nobody receives it
            sending = f"p2p send {reply['nccl_port']}"  # the send's thread, named by group.py's _off_loop
            async with asyncio.timeout(60):
                while not any(thread.name == sending for thread in threading.enumerate()):
                    await asyncio.sleep(0.01)
            send.cancel()
            with pytest.raises(asyncio.CancelledError):
                await send
        assert registry.get_sample_value("eagle3_target_p2p_teardowns_total", {"reason": "cancelled"}) == 1
        deadline = time.monotonic() + 60  # gloo's send in flight ends at its deadline; then the port goes
        while registry.get_sample_value("eagle3_target_p2p_ports_held") != 0:
            assert time.monotonic() < deadline, "the cancelled group's port was never released"
            await asyncio.sleep(0.05)
        listen("127.0.0.1", reply["nccl_port"]).close()
    finally:
        group.close()
