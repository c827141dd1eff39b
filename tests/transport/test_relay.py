"""The TURN-style relay on 127.0.0.1: a private side's real TCP and HTTP servers answer through a
relay's allocation ports, byte for byte; the relay refuses the unauthorized, caps peers and
connections, and its client learns when the relay goes."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from gossamer.transport.relay import RelayClient, RelayConfig, RelayRefused, RelayServer
from gossamer.transport.tcp import TcpServer, tcp_connect
from gossamer.transport.tcp_client import ConnectFailed


def authorize(auth: bytes) -> str:
    if not auth.startswith(b"peer:"):
        raise RelayRefused("not a peer of this run")
    return auth[5:].decode()


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


async def test_a_private_peers_servers_answer_through_the_relay(private_side) -> None:
    relay = await RelayServer.create(authorize=authorize)
    client = await RelayClient.connect(relay.address, auth=b"peer:alice", targets=private_side)
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
    finally:
        await http_client.aclose()
        await client.aclose()
        await relay.aclose()


async def test_the_relay_refuses_the_unauthorized_and_caps_peers(private_side) -> None:
    relay = await RelayServer.create(authorize=authorize, config=RelayConfig(max_peers=1))
    try:
        with pytest.raises(RelayRefused, match="not a peer"):
            await RelayClient.connect(relay.address, auth=b"mallory", targets=private_side)
        first = await RelayClient.connect(relay.address, auth=b"peer:alice", targets=private_side)
        with pytest.raises(RelayRefused, match="full"):
            await RelayClient.connect(relay.address, auth=b"peer:carol", targets=private_side)
        again = await RelayClient.connect(relay.address, auth=b"peer:alice", targets=private_side)  # replaces its own
        await asyncio.wait_for(first.closed, 10.0)
        await again.aclose()
        await first.aclose()
    finally:
        await relay.aclose()


async def test_connections_over_the_cap_are_closed(private_side) -> None:
    relay = await RelayServer.create(authorize=authorize, config=RelayConfig(max_connections=1))
    client = await RelayClient.connect(relay.address, auth=b"peer:alice", targets=private_side)
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
    relay = await RelayServer.create(authorize=authorize)
    client = await RelayClient.connect(relay.address, auth=b"peer:alice", targets=private_side)
    port = client.ports[1]
    await relay.aclose()
    await asyncio.wait_for(client.closed, 10.0)
    with pytest.raises(ConnectFailed):
        await tcp_connect("127.0.0.1", port)
    await client.aclose()
