"""The distributed slot attack of issue 30 (item 9): 260 slow connections from 16 source addresses
fill the HTTP and TCP servers' 256 slots; an honest client from another address must still be
served (before the fix the cap was global: every honest connection was refused). Real sockets on
loopback, attackers from 127.0.0.10-25 (all of 127.0.0.0/8 is loopback on Linux); ``FairSlots``
alone, too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gossamer.transport.frames import Frame, FrameType, encode_frame
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_server import HttpServer
from gossamer.transport.slots import ADDRESS_FULL, FULL, FairSlots
from gossamer.transport.tcp import TcpConfig
from tests.transport.support import WAIT_S, LeakCheck, RawClient, TcpNet, echo

ATTACKERS = [f"127.0.0.{10 + i}" for i in range(16)]
SLOW = 260
HONEST = "127.0.0.2"
HONEST_CONNECTIONS = 8
GET = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


def status_of(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


# --- the decision alone ------------------------------------------------------------------------


def test_a_newcomer_holding_fewer_takes_the_oldest_idle_slot_of_the_heaviest_address() -> None:
    slots: FairSlots[str] = FairSlots(total=6, per_address=4)
    for conn in ("a1", "a2", "a3", "a4", "b1", "b2"):
        assert slots.admit(conn[0], conn).admitted

    busy = {"a1"}
    first = slots.admit("h", "h1", busy=lambda c: c in busy)
    second = slots.admit("h", "h2")
    third = slots.admit("h", "h3")  # h would hold 3 where the heaviest holds 2: no

    assert first.admitted and first.evicted == "a2"  # a1 is mid-request: its oldest idle goes
    assert second.admitted and second.evicted == "a1"
    assert not third.admitted and third.refused == FULL and third.evicted is None
    assert slots.held("a") == 2 and slots.held("b") == 2 and slots.held("h") == 2 and len(slots) == 6
    assert not slots.admit("a", "a5").admitted  # an address never takes a slot back from one as light
    assert not slots.release("a2") and slots.release("h1") and len(slots) == 5


def test_the_per_address_cap_holds_with_slots_free_and_bad_sizes_name_the_field() -> None:
    slots: FairSlots[int] = FairSlots(total=10, per_address=2)
    assert slots.admit("a", 1).admitted and slots.admit("a", 2).admitted
    assert slots.admit("a", 3).refused == ADDRESS_FULL
    with pytest.raises(ValueError, match="already admitted"):
        slots.admit("b", 1)
    for kwargs, name in (({"total": 0, "per_address": 1}, "total"), ({"total": 1, "per_address": True}, "per_address")):
        with pytest.raises(ValueError, match=name):
            FairSlots(**kwargs)


# --- HTTP ----------------------------------------------------------------------------------------


class Clients:
    def __init__(self) -> None:
        self.closers: list = []

    async def raw(self, address: tuple[str, int], source: str) -> RawClient:
        raw = await RawClient.connect(address, source=source)
        self.closers.append(raw.aclose)
        return raw


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    check = LeakCheck()
    made = Clients()
    yield made
    for close in reversed(made.closers):
        await close()
    check.verify()


async def test_260_slow_http_connections_from_16_addresses_leave_an_honest_client_served(clients: Clients) -> None:
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_get("/ok", ok)
    config = HttpConfig(max_connections=256, max_connections_per_address=32, header_timeout_s=3 * WAIT_S)
    server = await HttpServer.create(app, config=config)
    clients.closers.append(server.aclose)
    attackers = [await clients.raw(server.address, ATTACKERS[i % 16]) for i in range(SLOW)]
    for raw in attackers:
        await raw.send(b"GET /ok HTTP/1.1\r\n")  # a request line, then nothing: a slot held for header_timeout_s
    over = [status_of(await raw.read_response_head()) for raw in attackers[256:]]  # all 260 were accepted

    honest = [await clients.raw(server.address, HONEST) for _ in range(HONEST_CONNECTIONS)]
    for raw in honest:
        await raw.send(GET)
    first = [status_of(await raw.read_response_head()) for raw in honest]
    assert over == [503] * 4
    assert first == [200] * HONEST_CONNECTIONS, f"honest requests answered {first} under the attack"
    # the evicted attackers come back at once, from the same addresses: they cannot take the honest slots
    again = [await clients.raw(server.address, ATTACKERS[i]) for i in range(HONEST_CONNECTIONS)]
    for raw in again:
        await raw.send(b"GET /ok HTTP/1.1\r\n")
    back = [status_of(await raw.read_response_head()) for raw in again]
    for raw in honest:
        await raw.send(GET)  # the same kept-alive connections, served again
    second = [status_of(await raw.read_response_head()) for raw in honest]

    assert back == [503] * HONEST_CONNECTIONS and second == [200] * HONEST_CONNECTIONS
    assert server.evicted_connections == HONEST_CONNECTIONS and server.connections_open == 256


# --- TCP -----------------------------------------------------------------------------------------


def request_bytes(text: str) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(Frame(FrameType.REQUEST, {"x": text, "rid": 1}, b"")))


@pytest.fixture
async def tcp(clients: Clients) -> AsyncIterator[TcpNet]:
    net = TcpNet()
    yield net
    await net.aclose()


async def test_260_slow_tcp_connections_from_16_addresses_leave_honest_peers_served(tcp: TcpNet) -> None:
    config = TcpConfig(max_connections=256, max_connections_per_address=32, first_frame_timeout_s=3 * WAIT_S,
                       read_timeout_s=3 * WAIT_S, idle_timeout_s=3 * WAIT_S)
    server = await tcp.server(echo, config)
    attackers = [await tcp.raw(server, source=ATTACKERS[i % 16]) for i in range(SLOW)]
    for raw in attackers:
        await raw.send(b"GSM")  # three bytes of a prefix, then nothing: each holds its slot mid-frame
    over = [(await raw.read_frame()).header["code"] for raw in attackers[256:]]  # all 260 were accepted

    honest = [await tcp.raw(server, source=HONEST) for _ in range(HONEST_CONNECTIONS)]
    for i, raw in enumerate(honest):
        await raw.send(request_bytes(f"honest {i}"))
    first = [await raw.read_frame() for raw in honest]
    assert over == ["overloaded"] * 4
    assert [f.header.get("echo") for f in first] == [f"honest {i}" for i in range(HONEST_CONNECTIONS)], first
    again = [await tcp.raw(server, source=ATTACKERS[i]) for i in range(HONEST_CONNECTIONS)]
    back = [(await raw.read_frame()).header["code"] for raw in again]
    for i, raw in enumerate(honest):
        await raw.send(request_bytes(f"again {i}"))
    second = [await raw.read_frame() for raw in honest]

    assert back == ["overloaded"] * HONEST_CONNECTIONS
    assert [f.header.get("echo") for f in second] == [f"again {i}" for i in range(HONEST_CONNECTIONS)]
    assert server.evicted_connections == HONEST_CONNECTIONS and server.stats.connections_open == 256
