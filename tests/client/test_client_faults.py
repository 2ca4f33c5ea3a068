"""What the client makes of faults its background work and the p2p path meet (no server needed)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import aiohttp
import pytest
import torch
from aiohttp.client_reqrep import ConnectionKey

from eagle3_target.client.errors import ServerFault
from eagle3_target.client.members import Member, MemberState, short
from eagle3_target.client.membership import Membership
from eagle3_target.client.options import PoolOptions
from eagle3_target.client.p2p import P2PChannel
from eagle3_target.protocol import contract
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.protocol.wire import DTYPE_TO_CODE

from ..target_support import free_port

INFO = ModelInfo(32, 64, 512, (1, 15, 28), dtype="bfloat16", p2p={"backend": "gloo"})
WANT = {"aux_hidden_states": (torch.bfloat16, (2, 16, 192)), "position_bits": (torch.uint8, (4,))}


class _Group:
    """A p2p group that must never be asked to receive."""

    name, backend, closed = "test-group", "gloo", False

    def recv(self, *args):
        raise AssertionError("a receive was posted")

    def close(self):
        self.closed = True


def _metadata(**shapes) -> bytes:
    doc = {k: {"dtype_code": DTYPE_TO_CODE[dtype], "shape": shape} for k, (dtype, shape) in shapes.items()}
    return json.dumps({"keys_order": list(doc), "metadata": doc}).encode()


@pytest.mark.parametrize(
    "shapes",
    [
        {"aux_hidden_states": (torch.bfloat16, [2, 16, -192]), "position_bits": (torch.uint8, [4])},
        {"aux_hidden_states": (torch.bfloat16, [2, 16, 1 << 40]), "position_bits": (torch.uint8, [4])},
        {"aux_hidden_states": (torch.bfloat16, [2, 16, 1]), "position_bits": (torch.uint8, [4])},  # smaller
        {"aux_hidden_states": (torch.float32, [2, 16, 192]), "position_bits": (torch.uint8, [4])},
        {"aux_hidden_states": (torch.bfloat16, [2, 16, 192])},
    ],
    ids=["negative", "huge", "smaller than sent", "another dtype", "a key missing"],
)
async def test_p2p_metadata_that_differs_from_the_agreed_shapes_fails_over_before_any_receive(shapes):
    """Before: RuntimeError from torch, or the trainer killed by SIGABRT inside gloo (metadata smaller
    than what is sent). Now a server fault, raised before a receive is posted; the group is dropped."""
    channel = P2PChannel("http://x", INFO, "p2p")
    channel.group = group = _Group()
    with pytest.raises(ServerFault, match="p2p metadata"):
        await channel.receive({contract.SEQUENCE_HEADER: "0"}, _metadata(**shapes), WANT)
    assert group.closed and channel.group is None


def test_a_server_that_keeps_failing_waits_longer_each_time_before_it_rejoins():
    options = PoolOptions(backoff_base=0.05, readmit_backoff_max=60.0)
    membership = Membership(resolver=None, connect=None, options=options)
    delays = [membership.readmit_delay(strikes) for strikes in range(1, 8)]
    assert delays == sorted(delays) and delays[0] == pytest.approx(0.2) and delays[-1] == 60.0


async def test_quarantine_counts_strikes(caplog):
    membership = Membership(resolver=None, connect=None, options=PoolOptions(readmit_backoff_max=0.01))
    member = Member(conn=type("Conn", (), {"url": "http://x"})())
    member.state = member.state.HEALTHY
    membership._join = lambda m: asyncio.sleep(0)  # no server to join here
    with caplog.at_level(logging.WARNING, "eagle3_target.client.membership"):
        membership.quarantine(member, ServerFault("a reply no server sends"))
        assert member.strikes == 1 and member.last_error == "ServerFault: a reply no server sends"
        member.state = member.state.HEALTHY  # it rejoined, and fails again
        membership.quarantine(member, TimeoutError())
    assert member.strikes == 2 and member.state == MemberState.QUARANTINED
    assert caplog.messages == [
        "quarantining http://x: ServerFault: a reply no server sends",
        "quarantining http://x: TimeoutError",
    ]
    await asyncio.sleep(0)


async def test_the_dns_refresh_loop_outlives_any_error(caplog):
    """Before: one unexpected exception ended the task, and with it every later membership change."""

    class Resolver:
        calls = 0

        async def resolve(self):
            Resolver.calls += 1
            raise RuntimeError("a resolver bug or an answer nobody expected")

    membership = Membership(Resolver(), connect=None, options=PoolOptions(min_resolve_gap=0.0))
    task = asyncio.create_task(membership._refresh_loop())
    with caplog.at_level(logging.WARNING, "eagle3_target.client.membership"):
        for _ in range(3):
            membership.resolve_now.set()
            await asyncio.sleep(0.05)
    assert Resolver.calls >= 2 and not task.done()
    assert "a resolver bug" in caplog.text
    task.cancel()


async def test_a_refused_connection_is_named_in_words():
    port = free_port()
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            await http.get(f"http://127.0.0.1:{port}/health")
    assert short(refused.value) == f"cannot connect to 127.0.0.1:{port}: Connection refused"


def test_an_unresolvable_name_is_named_with_the_resolvers_words():
    """getaddrinfo's errors carry a negative code that os.strerror does not know: its own words are used."""
    key = ConnectionKey("pods.example", 8000, False, True, None, None, None)
    lookup = aiohttp.ClientConnectorError(
        key, socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    )
    assert short(lookup) == "cannot connect to pods.example:8000: Name or service not known"
    wordless = aiohttp.ClientConnectorError(key, OSError("no route to the pods"))  # no code, no strerror
    assert short(wordless) == "cannot connect to pods.example:8000: no route to the pods"


def test_an_error_number_is_named_in_the_systems_words():
    key = ConnectionKey("pods.example", 8000, False, True, None, None, None)
    denied = aiohttp.ClientConnectorError(key, OSError(1, "the server's own words"))
    assert short(denied) == "cannot connect to pods.example:8000: Operation not permitted"


def test_a_failure_is_one_short_line():
    assert short(TimeoutError()) == "TimeoutError"
    assert short(ServerFault("x" * 287)) == "ServerFault: " + "x" * 287  # 300 characters: kept whole
    assert short(ServerFault("x" * 288)) == "ServerFault: " + "x" * 287 + "..."


async def test_a_429_rests_a_member_unquarantined_and_says_so_once(caplog):
    membership = Membership(resolver=None, connect=None, options=PoolOptions())
    member = Member(conn=type("Conn", (), {"url": "http://x"})(), state=MemberState.HEALTHY)
    loop = asyncio.get_running_loop()
    async with membership.changed:
        with caplog.at_level(logging.INFO, "eagle3_target.client.membership"):
            before = loop.time()
            membership.rest(member, 5.0)
            membership.rest(member, 5.0)
            after = loop.time()
        assert await membership.wait_changed(60)  # the pool is told: a request may wait for it
    assert before + 5.0 <= member.rest_until <= after + 5.0
    assert member.state == MemberState.HEALTHY and member.strikes == 0
    assert caplog.messages == ["http://x asks us to wait 5.0s (429)"]


def test_an_empty_pool_says_it_has_no_servers():
    assert Membership(resolver=None, connect=None, options=PoolOptions()).describe() == "no servers"
