"""HttpServer against peers that never authenticate (issue 10): one address cannot take every
connection slot, a body dripped below the minimum rate is cut at its whole-body deadline, the
in-flight body budget refuses what it cannot hold and gives every byte back, a client that goes
away mid-body frees its buffer at once and costs one log line, and the log lines peers can
trigger (handler failures, aiohttp's own bad-request errors) are throttled. Real sockets on
loopback; the attackers connect from 127.0.0.1 and the honest client from 127.0.0.2 (another
host, as far as the server's per-address counting goes)."""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gossamer.transport.http import HttpConfig
from gossamer.transport.http_server import HttpServer, path_int, read_body_into
from gossamer.transport.logs import DEFAULT_BURST, ThrottledLog
from tests.transport.support import WAIT_S, LeakCheck, RawClient, dripping, log_waiters

HONEST = "127.0.0.2"
GET = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


class App:
    """Routes with known behaviour; ``outcomes`` says how each body read ended."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.outcome_seen = asyncio.Event()
        self.reading = asyncio.Event()

    def build(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ok", self.ok)
        app.router.add_put("/body", self.body)
        app.router.add_get("/fail", self.fail)
        app.router.add_get("/round/{round}", self.round)
        return app

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def body(self, request: web.Request) -> web.Response:
        self.reading.set()
        try:
            data = await read_body_into(request, max_bytes=64 << 20)
        except BaseException as exc:
            self.outcomes.append(type(exc).__name__)
            self.outcome_seen.set()
            raise
        self.outcomes.append("complete")
        self.outcome_seen.set()
        return web.json_response({"size": len(data)})

    async def fail(self, request: web.Request) -> web.Response:
        raise RuntimeError("a handler bug a peer can trigger")

    async def round(self, request: web.Request) -> web.Response:
        return web.json_response({"round": path_int(request, "round")})


class Net:
    def __init__(self) -> None:
        self.app = App()
        self.closers: list = []

    async def server(self, config: HttpConfig) -> HttpServer:
        server = await HttpServer.create(self.app.build(), config=config)
        self.closers.append(server.aclose)
        return server

    async def raw(self, server: HttpServer, *, source: str | None = None) -> RawClient:
        raw = await RawClient.connect(server.address, source=source)
        self.closers.append(raw.aclose)
        return raw


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    check = LeakCheck()
    network = Net()
    yield network
    for close in reversed(network.closers):
        await close()
    check.verify()


def status_of(head: bytes) -> int:
    return int(head.split(b" ", 2)[1])


def put_head(size: int) -> bytes:
    return f"PUT /body HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"max_connections_per_address": 0}, "max_connections_per_address"),
     ({"max_inflight_body_bytes": -1}, "max_inflight_body_bytes"),
     ({"min_body_rate_bytes_per_s": 1.5}, "min_body_rate_bytes_per_s"), ({"lingering_s": 0}, "lingering_s")],
)
def test_config_refuses_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        HttpConfig(**kwargs)


async def test_one_address_cannot_take_every_connection_slot(net: Net) -> None:
    config = HttpConfig(max_connections=64, max_connections_per_address=8, header_timeout_s=3 * WAIT_S)
    server = await net.server(config)
    attackers = [await net.raw(server) for _ in range(100)]  # each would hold its slot for header_timeout_s
    for raw in attackers:
        await raw.send(b"GET /ok HTTP/1.1\r\n")  # a request line, then nothing
    honest = await net.raw(server, source=HONEST)

    await honest.send(GET)
    served = await honest.read_response_head()
    refusals = [await raw.read_response_head() for raw in attackers[8:]]

    assert status_of(served) == 200
    assert all(status_of(head) == 503 and b"too many connections from your address" in head for head in refusals)
    assert server.connections_open == 8 + 1 and server.refused_connections == 92


async def test_a_body_dripped_below_the_minimum_rate_is_cut_at_its_whole_body_deadline(net: Net) -> None:
    config = HttpConfig(idle_timeout_s=1.0, min_body_rate_bytes_per_s=1000, header_timeout_s=WAIT_S)
    server = await net.server(config)
    dripper = await net.raw(server)
    await dripper.send(put_head(1000))

    async with dripping(dripper, bytes(1000)):  # 50 s at 20 bytes/s; its deadline is 2 s
        await net.app.reading.wait()
        honest = await net.raw(server, source=HONEST)
        await honest.send(GET)
        served = await honest.read_response_head()
        head = await dripper.read_response_head(timeout_s=3 * WAIT_S)

    assert status_of(head) == 408 and b"deadline" in head and status_of(served) == 200
    assert net.app.outcomes == ["TransportTimeout"]
    assert server.budget.held_bytes == 0


async def test_the_body_budget_refuses_what_it_cannot_hold_and_gives_every_byte_back(net: Net) -> None:
    config = HttpConfig(max_inflight_body_bytes=1 << 20, header_timeout_s=WAIT_S, idle_timeout_s=WAIT_S)
    server = await net.server(config)
    size = 600 << 10
    first, second = await net.raw(server), await net.raw(server, source=HONEST)

    await first.send(put_head(size) + bytes(1000))
    await asyncio.wait_for(net.app.reading.wait(), WAIT_S)  # the handler holds the body's bytes from here
    held_while_receiving = server.budget.held_bytes
    await second.send(put_head(size) + bytes(size))
    refused = await second.read_response_head()
    await first.send(bytes(size - 1000))
    completed = await first.read_response_head()
    held_after = server.budget.held_bytes  # given back before the response went out
    third = await net.raw(server, source=HONEST)
    await third.send(put_head(size) + bytes(size))
    later = await third.read_response_head()

    assert (held_while_receiving, held_after) == (size, 0)
    assert status_of(refused) == 503 and b"budget" in refused
    assert status_of(completed) == 200 and status_of(later) == 200
    assert server.budget.peak_bytes == size and server.budget.held_bytes == 0


async def test_a_client_gone_mid_body_frees_its_buffer_at_once_and_costs_one_log_line(net: Net) -> None:
    config = HttpConfig(header_timeout_s=WAIT_S, idle_timeout_s=WAIT_S)
    server = await net.server(config)
    size, sent = 48 << 20, 16 << 20
    gc.disable()  # what must free the buffer is its reference count, not a collection run
    tracemalloc.start()
    try:
        with log_waiters("gossamer.transport.http_server") as ours, log_waiters("aiohttp.server") as aiohttp_log:
            line, errors = ours("went away"), aiohttp_log("")
            quitter = await RawClient.connect(server.address)
            await quitter.send(put_head(size) + bytes(sent))
            await asyncio.wait_for(net.app.reading.wait(), WAIT_S)  # the buffer is allocated from here
            allocated = tracemalloc.get_traced_memory()[0]
            await quitter.aclose()
            await asyncio.wait_for(net.app.outcome_seen.wait(), WAIT_S)
            held_after = server.budget.held_bytes
            honest = await net.raw(server, source=HONEST)
            await honest.send(GET)
            served = await honest.read_response_head()
            left_bytes = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        gc.enable()

    assert net.app.outcomes in (["ConnectionClosed"], ["CancelledError"]) and status_of(served) == 200
    assert allocated >= size and held_after == 0
    assert left_bytes < size // 4  # the 48 MiB body buffer is gone without a GC run
    assert line.seen.is_set() and [r.levelno for r in line.records] == [logging.INFO]
    assert all(r.exc_info is None for r in line.records)
    assert not [r for r in errors.records if r.levelno >= logging.WARNING]


async def test_handler_failures_are_500_and_their_tracebacks_are_throttled(net: Net) -> None:
    server = await net.server(HttpConfig(header_timeout_s=WAIT_S))
    client = await net.raw(server, source=HONEST)
    with log_waiters("gossamer.transport.http_server") as attach:
        lines = attach("handler of GET /fail failed")
        heads = []
        for _ in range(3 * DEFAULT_BURST):
            await client.send(b"GET /fail HTTP/1.1\r\nHost: x\r\n\r\n")
            heads.append(await client.read_response_head())
    await client.send(GET)
    still = await client.read_response_head()

    assert all(status_of(head) == 500 for head in heads) and status_of(still) == 200
    tracebacks = [r for r in lines.records if r.exc_info is not None]
    assert len(tracebacks) == DEFAULT_BURST
    assert server.log.suppressed == 2 * DEFAULT_BURST


async def test_aiohttps_own_bad_request_errors_are_throttled(net: Net) -> None:
    server = await net.server(HttpConfig(header_timeout_s=WAIT_S))
    with log_waiters("aiohttp.server") as attach:
        lines = attach("Error handling request")
        for _ in range(2 * DEFAULT_BURST):
            raw = await net.raw(server)
            await raw.send(GET)  # a good first request, so the next error is not logged at debug
            assert status_of(await raw.read_response_head()) == 200
            await raw.send(b"GET /ok HTTP/1.1\r\nHost: x\r\nBad\x01Header: y\r\n\r\n")
            assert status_of(await raw.read_response_head()) == 400
            await raw.aclose()

    assert len([r for r in lines.records if r.levelno >= logging.ERROR]) == DEFAULT_BURST


@pytest.mark.parametrize("text", ["9" * 5000, "%C2%B2", "-1", "1e3", "0x10", "12345678901234567890"])
async def test_a_route_int_that_is_not_a_plain_decimal_is_404_never_500(net: Net, text: str) -> None:
    server = await net.server(HttpConfig(header_timeout_s=WAIT_S))
    client = await net.raw(server, source=HONEST)

    await client.send(f"GET /round/{text} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    refused = await client.read_response_head()
    await client.send(b"GET /round/42 HTTP/1.1\r\nHost: x\r\n\r\n")
    served = await client.read_response_head()

    assert status_of(refused) == 404 and status_of(served) == 200


def test_the_throttled_log_lets_a_burst_through_per_window_and_says_how_many_it_left_out() -> None:
    now = [0.0]
    logger = logging.getLogger("tests.throttled")
    with log_waiters("tests.throttled") as attach:
        lines = attach("left out")
        throttled = ThrottledLog(logger, burst=3, window_s=10.0, clock=lambda: now[0])
        for i in range(10):
            throttled.info("line %d", i)
        now[0] = 10.0
        throttled.warning("after the window")

    assert [r.getMessage() for r in lines.records] == [
        "line 0", "line 1", "line 2", "7 more such log line(s) were left out in the last 10 s (at most 3 per window)",
        "after the window"]
