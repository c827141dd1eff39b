"""The TURN-style relay on 127.0.0.1: a private side's real TCP and HTTP servers answer through a
relay's allocation ports, byte for byte; a capped relay's pacing decisions over a transfer keep
its rate; the relay refuses the unauthorized and any allocation whose proof does not answer its
own fresh challenge (a replay), caps peers and connections, and its client learns when the relay
goes."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from gossamer.crypto.challenge import answer_challenge
from gossamer.crypto.identity import Identity
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from gossamer.transport.relay import RelayClient, RelayConfig, RelayRefused, RelayServer
from gossamer.transport.relay.wire import CHUNK_BYTES
from gossamer.transport.tcp import TcpServer, tcp_connect
from gossamer.transport.tcp_client import ConnectFailed
from tests.transport.test_relay_pace import worst_window_excess

SPLICE = hasattr(os, "splice")  # Linux: relayed connections go through the kernel

ALICE, CAROL, MALLORY = Identity.generate(), Identity.generate(), Identity.generate()


def authorize(auth: bytes) -> str:
    """Stands in for the peer layer's check of a signed, admitted record: ``peer:<peer id>``."""
    if not auth.startswith(b"peer:"):
        raise RelayRefused("not a peer of this run")
    return auth[5:].decode()


def auth_of(who: Identity) -> bytes:
    return b"peer:" + who.peer_id.encode()


async def allocate(relay: RelayServer, who: Identity, targets: list[tuple[str, int]], *,
                   auth: bytes | None = None, zero_copy: bool = True) -> RelayClient:
    return await RelayClient.connect(relay.address, relay_name=relay.name, identity=who,
                                     auth=auth_of(who) if auth is None else auth, targets=targets,
                                     zero_copy=zero_copy)


async def raw_allocate(relay: RelayServer, line: bytes | None = None, *, signer: Identity = ALICE,
                       audience: str = "") -> tuple[bytes, dict, asyncio.StreamWriter]:
    """The control protocol by hand: read the challenge, send ``line`` (by default, alice's genuine
    allocate answering this challenge); the line sent, the relay's answer, the open connection."""
    reader, writer = await asyncio.open_connection(*relay.address)
    challenge = json.loads(await reader.readline())
    if line is None:
        proof = answer_challenge(signer, nonce=base64.b64decode(challenge["nonce"]),
                                 audience=audience or relay.name, now=time.time())
        line = json.dumps({"op": "allocate", "services": 1, "auth": base64.b64encode(auth_of(ALICE)).decode(),
                           "proof": base64.b64encode(proof).decode()}).encode() + b"\n"
    writer.write(line)
    return line, json.loads(await reader.readline()), writer


async def asks_through(port: int, payload: bytes) -> bool:
    connection = await tcp_connect("127.0.0.1", port)
    try:
        return (await connection.request(Frame(FrameType.REQUEST, {}, payload))).header["n"] == len(payload)
    finally:
        await connection.aclose()


async def answer_at_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write((await reader.read())[::-1])  # everything up to the sender's half-close, reversed
    await writer.drain()
    writer.close()


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (the relay forgets a closed connection a few
    callbacks after it closes it, and says so through no event); no timed wait, the caller bounds it."""
    while not condition():  # noqa: ASYNC110  (sleep(0) is a bare yield to those callbacks)
        await asyncio.sleep(0)


async def echo(frame: Frame, info: object) -> Frame:
    payload = b"".join(bytes(v) for v in frame.payload_views())
    return Frame(FrameType.RESPONSE, {"n": len(payload)}, payload[::-1])


async def hello(request: web.Request) -> web.Response:
    return web.json_response({"hello": request.match_info["who"]})


@pytest.fixture
async def private_side():
    tcp = await TcpServer.create(echo)
    app = web.Application()
    app.add_routes([web.get("/hello/{who}", hello)])
    http = await HttpServer.create(app)
    yield [("127.0.0.1", http.address[1]), ("127.0.0.1", tcp.address[1])]
    await http.aclose()
    await tcp.aclose()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["splice", "copy"])
async def test_a_private_peers_servers_answer_through_the_relay(private_side, zero_copy: bool) -> None:
    relay = await RelayServer.create(name="relay-1", authorize=authorize, config=RelayConfig(zero_copy=zero_copy))
    client = await allocate(relay, ALICE, private_side, zero_copy=zero_copy)
    http_client = await HttpClient.create()
    try:
        http_port, tcp_port = client.ports
        assert await http_client.get_json(f"http://127.0.0.1:{http_port}/hello/bob") == {"hello": "bob"}
        payload = bytes(range(256)) * (16 * 1024)  # 4 MiB, spliced byte for byte both ways
        connection = await tcp_connect("127.0.0.1", tcp_port)
        answers = await asyncio.gather(*(connection.request(Frame(FrameType.REQUEST, {"i": i}, payload))
                                         for i in range(3)))
        await connection.aclose()
        assert all(a.header["n"] == len(payload) and bytes(a.payload) == payload[::-1] for a in answers)
        assert relay.stats()["peers"] == 1 and relay.stats()["bytes"] >= 6 * len(payload)
        assert relay.stats()["spliced"] == (relay.stats()["connections"] if zero_copy and SPLICE else 0)
    finally:
        await http_client.aclose()
        await client.aclose()
        await relay.aclose()


async def test_the_relay_refuses_the_unauthorized_and_caps_peers(private_side) -> None:
    relay = await RelayServer.create(name="relay-1", authorize=authorize, config=RelayConfig(max_peers=1))
    try:
        with pytest.raises(RelayRefused, match="not a peer"):
            await allocate(relay, MALLORY, private_side, auth=b"mallory")
        first = await allocate(relay, ALICE, private_side)
        with pytest.raises(RelayRefused, match="full"):
            await allocate(relay, CAROL, private_side)
        again = await allocate(relay, ALICE, private_side)  # a proven allocation replaces its own
        await asyncio.wait_for(first.closed, 10.0)
        await again.aclose()
        await first.aclose()
    finally:
        await relay.aclose()


async def test_a_replayed_allocation_is_refused_and_the_genuine_one_survives(private_side) -> None:
    relay = await RelayServer.create(name="relay-1", authorize=authorize)
    other = await RelayServer.create(name="relay-2", authorize=authorize)
    try:
        sniffed, answer, writer = await raw_allocate(relay)  # alice's earlier, genuine session
        assert answer["ok"] is True
        writer.close()
        genuine = await allocate(relay, ALICE, private_side)
        unproven = json.dumps({"op": "allocate", "services": 1, "auth": base64.b64encode(auth_of(ALICE)).decode()})
        for line, error in ((sniffed, "challenge"),  # the very line alice sent once, on a new connection
                            (unproven.encode() + b"\n", "challenge")):  # the record alone
            _, answer, writer = await raw_allocate(relay, line)
            writer.close()
            assert answer["ok"] is False and error in answer["error"], (line, answer)
        for signer, audience, error in ((MALLORY, "", "another key"), (ALICE, "relay-2", "challenge")):
            _, answer, writer = await raw_allocate(relay, signer=signer, audience=audience)
            writer.close()
            assert answer["ok"] is False and error in answer["error"], (signer, audience, answer)

        assert not genuine.closed.done() and relay.stats()["peers"] == 1
        assert await asks_through(genuine.ports[1], b"still here")
        fresh = await allocate(relay, ALICE, private_side)  # a fresh genuine proof still works
        await asyncio.wait_for(genuine.closed, 10.0)
        assert await asks_through(fresh.ports[1], b"moved")
        with pytest.raises(RelayRefused, match="challenge"):  # a proof is for the relay it names
            await RelayClient.connect(other.address, relay_name="relay-1", identity=ALICE, auth=auth_of(ALICE),
                                      targets=private_side)
        await fresh.aclose()
        await genuine.aclose()
    finally:
        await other.aclose()
        await relay.aclose()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["splice", "copy"])
async def test_a_relay_keeps_its_cap_over_a_real_transfer(private_side, zero_copy: bool) -> None:
    rate = 16 * 2**20
    decisions: list[tuple[float, int]] = []
    relay: RelayServer | None = None

    def clock() -> float:  # the relay's pace reads it right after counting each chunk it moved
        now = time.monotonic()
        if relay is not None:
            decisions.append((now, relay.stats()["bytes"]))
        return now

    relay = await RelayServer.create(name="relay-1", authorize=authorize, clock=clock,
                                     config=RelayConfig(rate_bytes_per_s=rate, zero_copy=zero_copy))
    client = await allocate(relay, ALICE, private_side, zero_copy=zero_copy)
    try:
        payload = bytes(range(256)) * (16 * 1024)  # 4 MiB, answered reversed: 8 MiB through the relay
        connection = await tcp_connect("127.0.0.1", client.ports[1])
        answer = await connection.request(Frame(FrameType.REQUEST, {}, payload), timeout_s=60.0)
        await connection.aclose()
        assert bytes(answer.payload) == payload[::-1]
        assert relay.stats()["bytes"] >= 2 * len(payload)
        chunk = max(b - a for (_, a), (_, b) in itertools.pairwise(decisions))
        assert worst_window_excess(decisions, rate, 4 * CHUNK_BYTES) <= 2 * chunk + 1024  # two pipes share the pace
    finally:
        await client.aclose()
        await relay.aclose()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["splice", "copy"])
async def test_a_half_close_passes_through_and_the_answer_comes_back(zero_copy: bool) -> None:
    server = await asyncio.start_server(answer_at_eof, "127.0.0.1", 0)
    relay = await RelayServer.create(name="relay-1", authorize=authorize, config=RelayConfig(zero_copy=zero_copy))
    client = await allocate(relay, ALICE, [("127.0.0.1", server.sockets[0].getsockname()[1])], zero_copy=zero_copy)
    try:
        payload = bytes(range(251)) * 40_000  # 10 MB, more than any buffer on the way holds
        reader, writer = await asyncio.open_connection("127.0.0.1", client.ports[0])
        writer.write(payload)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 30.0) == payload[::-1]
        writer.close()
    finally:
        await client.aclose()
        await relay.aclose()
        server.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["splice", "copy"])
async def test_connections_that_ended_both_ways_are_released(zero_copy: bool) -> None:
    server = await asyncio.start_server(answer_at_eof, "127.0.0.1", 0)
    relay = await RelayServer.create(name="relay-1", authorize=authorize,
                                     config=RelayConfig(zero_copy=zero_copy, max_connections=2))
    client = await allocate(relay, ALICE, [("127.0.0.1", server.sockets[0].getsockname()[1])], zero_copy=zero_copy)
    try:
        for i in range(6):  # three times the cap, one after the other
            reader, writer = await asyncio.open_connection("127.0.0.1", client.ports[0])
            writer.write(b"request %d" % i)
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 30.0) == (b"request %d" % i)[::-1]
            writer.close()
            await asyncio.wait_for(until(lambda: relay.stats()["connections"] == 0), 30.0)
    finally:
        await client.aclose()
        await relay.aclose()
        server.close()


async def test_connections_over_the_cap_are_closed(private_side) -> None:
    relay = await RelayServer.create(name="relay-1", authorize=authorize, config=RelayConfig(max_connections=1))
    client = await allocate(relay, ALICE, private_side)
    try:
        tcp_port = client.ports[1]
        held = await tcp_connect("127.0.0.1", tcp_port)
        assert (await held.request(Frame(FrameType.REQUEST, {}, b"ab"))).header["n"] == 2
        extra = await tcp_connect("127.0.0.1", tcp_port)
        with pytest.raises(Exception):  # noqa: B017  (closed by the relay: ConnectionClosed)
            await extra.request(Frame(FrameType.REQUEST, {}, b"cd"), timeout_s=10.0)
        await extra.aclose()
        await held.aclose()
    finally:
        await client.aclose()
        await relay.aclose()


async def test_the_client_learns_when_its_relay_goes(private_side) -> None:
    relay = await RelayServer.create(name="relay-1", authorize=authorize)
    client = await allocate(relay, ALICE, private_side)
    port = client.ports[1]
    await relay.aclose()
    await asyncio.wait_for(client.closed, 10.0)
    with pytest.raises(ConnectFailed):
        await tcp_connect("127.0.0.1", port)
    await client.aclose()
