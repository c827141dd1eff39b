"""HttpServer / HttpClient over real loopback sockets: bulk tensors, JSON, caps, deadlines, leaks."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp import web

from gossamer.transport.errors import ConnectionClosed, DecodeError, RemoteError, TransportTimeout
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer, read_body_into, read_tensors, stream_tensors
from gossamer.transport.limits import Limits
from gossamer.transport.tcp_client import ConnectFailed
from tests.transport.support import WAIT_S, LeakCheck, RawClient

LIMITS = Limits(max_payload_bytes=256 << 20)
CONFIG = HttpConfig(limits=LIMITS, max_body_bytes=256 << 20, header_timeout_s=10.0, idle_timeout_s=10.0,
                    request_timeout_s=30.0)


# --- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    """Fail the test if it leaves tasks running or file descriptors open."""
    check = LeakCheck()
    yield
    check.verify()


class Store:
    """The app under test: a tensor store plus a few endpoints with known behaviour."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.metadata: dict[str, str] = {}
        self.outcomes: list[str] = []
        self.outcome_seen = asyncio.Event()
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_put("/tensors", self.put_tensors)
        app.router.add_get("/tensors", self.get_tensors)
        app.router.add_put("/bytes", self.put_bytes)
        app.router.add_get("/status", self.status)
        app.router.add_post("/echo", self.echo)
        app.router.add_get("/hang", self.hang)
        return app

    async def put_tensors(self, request: web.Request) -> web.Response:
        self.tensors, self.metadata = await read_tensors(request, limits=LIMITS, require_finite=True)
        return web.json_response({"stored": sorted(self.tensors)})

    async def get_tensors(self, request: web.Request) -> web.StreamResponse:
        return await stream_tensors(request, self.tensors, self.metadata)

    async def put_bytes(self, request: web.Request) -> web.Response:
        try:
            body = await read_body_into(request, max_bytes=1 << 20)
        except BaseException as exc:
            self.outcomes.append(type(exc).__name__)
            self.outcome_seen.set()
            raise
        self.outcomes.append("complete")
        self.outcome_seen.set()
        return web.json_response({"size": len(body), "sum": sum(body[:1000])})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def echo(self, request: web.Request) -> web.Response:
        return web.json_response({"got": await request.json()})

    async def hang(self, request: web.Request) -> web.Response:
        await asyncio.wait_for(self.release.wait(), WAIT_S)
        return web.json_response({"late": True})


class Net:
    """A served Store and clients for one test, all closed at its end."""

    def __init__(self) -> None:
        self.closers: list = []
        self.store = Store()

    async def server(self, config: HttpConfig = CONFIG) -> HttpServer:
        server = await HttpServer.create(self.store.app(), config=config)
        self.closers.append(server.aclose)
        return server

    async def client(self, config: HttpConfig = CONFIG) -> HttpClient:
        client = await HttpClient.create(config=config)
        self.closers.append(client.aclose)
        return client

    async def raw(self, server: HttpServer) -> RawClient:
        raw = await RawClient.connect(server.address)
        self.closers.append(raw.aclose)
        return raw


@pytest.fixture
async def net(no_leaks: None) -> AsyncIterator[Net]:
    net = Net()
    yield net
    for close in reversed(net.closers):
        await close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"header_timeout_s": 0}, "header_timeout_s"), ({"idle_timeout_s": float("nan")}, "idle_timeout_s"),
     ({"max_body_bytes": -1}, "max_body_bytes"), ({"chunk_bytes": 0}, "chunk_bytes"),
     ({"max_connections": 2.0}, "max_connections")],
)
def test_config_refuses_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        HttpConfig(**kwargs)


# --- happy paths ----------------------------------------------------------------------------


async def test_tensors_round_trip_up_and_down(net: Net) -> None:
    server = await net.server()
    client = await net.client()
    tensors = {"w": torch.randn(4096, 2048), "b": torch.arange(7, dtype=torch.int64),
               "h": torch.ones(3, 5, dtype=torch.float16)}  # 32 MiB in all

    stored = await client.put_tensors(server.url("/tensors"), tensors, {"round": "3"})
    back, metadata = await client.get_tensors(server.url("/tensors"))

    assert stored == {"stored": ["b", "h", "w"]}
    assert metadata == {"round": "3"}
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[name], tensors[name]) for name in tensors)


async def test_json_endpoints(net: Net) -> None:
    server = await net.server()
    client = await net.client()

    status = await client.get_json(server.url("/status"))
    echoed = await client.post_json(server.url("/echo"), {"peer": "ab12", "round": 4})

    assert status == {"ok": True}
    assert echoed == {"got": {"peer": "ab12", "round": 4}}


async def test_bytes_are_read_into_one_buffer_of_the_announced_size(net: Net) -> None:
    server = await net.server()
    client = await net.client()
    data = bytes(range(256)) * 3000

    answer = await client.put_bytes(server.url("/bytes"), data)

    assert answer == {"size": len(data), "sum": sum(data[:1000])}


# --- refused requests -----------------------------------------------------------------------


async def test_body_over_the_cap_gets_413_and_the_server_keeps_serving(net: Net) -> None:
    server = await net.server()
    client = await net.client()

    with pytest.raises(RemoteError) as refused:
        await client.put_bytes(server.url("/bytes"), bytes(2 << 20))
    still = await client.get_json(server.url("/status"))

    assert refused.value.status == 413
    assert still == {"ok": True}


async def test_missing_content_length_gets_411(net: Net) -> None:
    server = await net.server()
    raw = await net.raw(server)

    await raw.send(b"PUT /bytes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    head = await raw.read_response_head()

    assert status_of(head) == 411


async def test_garbage_instead_of_safetensors_gets_400_with_the_reason(net: Net) -> None:
    server = await net.server()
    client = await net.client()

    with pytest.raises(RemoteError, match="bad safetensors body") as refused:
        await client.put_bytes(server.url("/tensors"), b"\x80\x04\x95 pickle? no thanks" * 10)

    assert refused.value.status == 400


async def test_non_finite_tensors_get_400(net: Net) -> None:
    server = await net.server()
    client = await net.client()

    with pytest.raises(RemoteError, match="NaN") as refused:
        await client.put_tensors(server.url("/tensors"), {"x": torch.tensor([1.0, float("nan")])})

    assert refused.value.status == 400


async def test_client_refuses_a_response_over_its_cap(net: Net) -> None:
    server = await net.server()
    uploader = await net.client()
    await uploader.put_tensors(server.url("/tensors"), {"x": torch.zeros(1 << 20)})
    small = await net.client(HttpConfig(max_body_bytes=1 << 20))

    with pytest.raises(DecodeError, match="exceeds the cap"):
        await small.get_tensors(server.url("/tensors"))


async def test_http_errors_and_refused_connections_are_translated(net: Net) -> None:
    server = await net.server()
    client = await net.client()
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, not listening: connecting is refused
    try:
        with pytest.raises(RemoteError) as missing:
            await client.get_json(server.url("/nowhere"))
        with pytest.raises(ConnectFailed):
            host, port = holder.getsockname()
            await client.get_json(f"http://{host}:{port}/status")
    finally:
        holder.close()

    assert missing.value.status == 404


async def test_client_call_times_out_with_transport_timeout(net: Net) -> None:
    server = await net.server()
    client = await net.client(HttpConfig(request_timeout_s=0.3))

    with pytest.raises(TransportTimeout):
        await client.get_json(server.url("/hang"))
    net.store.release.set()
    still = await client.get_json(server.url("/status"))

    assert still == {"ok": True}


# --- hostile and broken clients -------------------------------------------------------------


async def test_truncated_upload_is_reported_and_the_server_keeps_serving(net: Net) -> None:
    server = await net.server()
    client = await net.client()
    raw = await net.raw(server)

    await raw.send(b"PUT /bytes HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + bytes(100))
    await raw.aclose()
    await asyncio.wait_for(net.store.outcome_seen.wait(), WAIT_S)
    still = await client.get_json(server.url("/status"))

    assert net.store.outcomes in ([ConnectionClosed.__name__], ["CancelledError"])  # the handler may be cancelled
    assert still == {"ok": True}


@pytest.mark.parametrize("after_a_response", [False, True])
async def test_slowloris_is_cut_after_header_timeout_while_others_are_served(net: Net,
                                                                             after_a_response: bool) -> None:
    config = HttpConfig(header_timeout_s=0.5, idle_timeout_s=WAIT_S)
    server = await net.server(config)
    client = await net.client(config)
    raw = await net.raw(server)
    if after_a_response:
        await raw.send(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(await raw.read_response_head()) == 200

    async def trickle() -> None:
        await raw.send(b"GET /status HTTP/1.1\r\n")
        for byte in b"X-Slow: " + b"a" * 100:
            await asyncio.sleep(0.1)  # the attacker's pace, not a synchronisation
            await raw.send(bytes([byte]))

    started = time.monotonic()
    attacker = asyncio.create_task(trickle())
    try:
        served = await client.get_json(server.url("/status"))
        leftover = await raw.read_until_eof()
        elapsed_s = time.monotonic() - started
    finally:
        attacker.cancel()
        await asyncio.gather(attacker, return_exceptions=True)

    assert served == {"ok": True}
    assert leftover == b""
    assert elapsed_s >= config.header_timeout_s


async def test_stalled_body_gets_408_after_idle_timeout(net: Net) -> None:
    config = HttpConfig(header_timeout_s=WAIT_S, idle_timeout_s=0.3)
    server = await net.server(config)
    raw = await net.raw(server)
    started = time.monotonic()

    await raw.send(b"PUT /bytes HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + bytes(10))
    head = await raw.read_response_head()

    assert status_of(head) == 408
    assert net.store.outcomes == [TransportTimeout.__name__]
    assert time.monotonic() - started >= config.idle_timeout_s


async def test_connection_cap_answers_503(net: Net) -> None:
    config = HttpConfig(max_connections=2, header_timeout_s=WAIT_S)
    server = await net.server(config)
    first, second = await net.raw(server), await net.raw(server)
    for raw in (first, second):
        await raw.send(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(await raw.read_response_head()) == 200
    client = await net.client(config)

    with pytest.raises(RemoteError, match="overloaded") as refused:
        await client.get_json(server.url("/status"))
    await first.send(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    again = await first.read_response_head()

    assert refused.value.status == 503
    assert status_of(again) == 200
    assert server.connections_open == 2


async def test_aclose_is_idempotent_and_releases_everything(no_leaks: None) -> None:
    server = await HttpServer.create(Store().app(), config=CONFIG)
    client = await HttpClient.create(config=CONFIG)
    await client.get_json(server.url("/status"))

    await client.aclose()
    await client.aclose()
    await server.aclose()
    await server.aclose()

    assert server.connections_open == 0


async def test_the_client_gives_up_idle_connections_before_a_server_would_close_them() -> None:
    """A server closes a keep-alive connection idle ``header_timeout_s``; aiohttp's client kept its
    own for 15 s, so after a 10-15 s lull (a learner's round deadline) a request could go out on a
    connection the server was closing and be lost. Learners over WAN links lost a few messages a run
    that way after every faulted round (``scripts/chaos/wan_faults.py``)."""
    config = HttpConfig(header_timeout_s=10.0)
    client = await HttpClient.create(config=config)
    try:
        keepalive = client._session.connector._keepalive_timeout  # type: ignore[union-attr]
        assert keepalive == config.client_keepalive_s == 5.0 < config.header_timeout_s
    finally:
        await client.aclose()
