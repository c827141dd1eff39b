"""``/swarm``: the live peers' page figures, fetched by the daemon that serves the page (the viewer's
browser talks to that daemon only; issue 30 item 8) from real peer servers on 127.0.0.1: a good
peer's figures, a malformed one's named fields, one that answers as another peer, one that hangs and
one that is gone each come back as figures or one opaque error; one refresh per ``refresh_s`` (on
the test's clock) whoever asks; a public daemon fetches no loopback address for a viewer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gossamer.peer.http_api import NO_STATUS, FetchBudget, SwarmFigures, daemon_routes
from gossamer.peer.metrics import PeerMetrics, Snapshot
from gossamer.peer.serving import role_app
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from tests.peer.page.test_figures import GOOD


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Peer:
    """A peer's HTTP server answering /status with ``body`` (or never); ``asked``: the queries it got."""

    def __init__(self, body: dict[str, Any] | None) -> None:
        self.body = body
        self.asked: list[dict[str, str]] = []

    async def status(self, request: web.Request) -> web.Response:
        self.asked.append(dict(request.query))
        if self.body is None:
            await asyncio.Event().wait()  # hangs
        return web.json_response(self.body)

    async def start(self, closers: list) -> str:
        app = web.Application()
        app.router.add_get("/status", self.status)
        server = await HttpServer.create(app)
        closers.append(server.aclose)
        return f"127.0.0.1:{server.address[1]}"


def gone_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def closers() -> AsyncIterator[list]:
    made: list = []
    yield made
    for close in reversed(made):
        await close()


async def serve_daemon(closers: list, rows: list[dict[str, Any]], swarm: SwarmFigures, *, own_http: str
                       ) -> tuple[HttpServer, list[bool]]:
    asked_as: list[bool] = []

    def status(owner: bool) -> dict[str, Any]:
        asked_as.append(owner)
        return {**GOOD, "peer_id": "me", "addresses": {"http": own_http}, "live_peers": rows, "secret": owner}

    metrics = PeerMetrics(lambda owner: Snapshot(uptime_s=1.0, live_peers=len(rows), round=0, bytes_sent={},
                                                 bytes_received={}, records_rejected={}))
    server = await HttpServer.create(role_app([], None, extra=daemon_routes(status, metrics, lambda: {"state": "running"},
                                                                            swarm=swarm)))
    closers.append(server.aclose)
    return server, asked_as


async def get(url: str) -> Any:
    client = await HttpClient.create()
    try:
        return await client.get_json(url)
    finally:
        await client.aclose()


async def test_the_daemon_fetches_checks_and_shares_its_peers_figures(closers: list) -> None:
    malformed = {**GOOD, "peer_id": "bad", "role_status": {"learner": {"series": {"loss": 5.0}}}}
    peers = {"good": Peer({**GOOD, "peer_id": "good"}), "bad": Peer(malformed),
             "liar": Peer({**GOOD, "peer_id": "someone else"}), "hangs": Peer(None)}
    rows = [{"peer_id": name, "http_addr": await peer.start(closers)} for name, peer in peers.items()]
    rows += [{"peer_id": "gone", "http_addr": gone_address()}, {"peer_id": "odd", "http_addr": "127.0.0.1:1/x?y"},
             {"peer_id": "me", "http_addr": "127.0.0.1:9"}, "not a row"]
    clock = Clock()
    swarm = SwarmFigures(FetchBudget(timeout_s=0.5, deadline_s=2.0), clock=clock)
    daemon, _ = await serve_daemon(closers, rows, swarm, own_http="127.0.0.1:1")

    first = (await get(daemon.url("/swarm")))["peers"]
    again = (await get(daemon.url("/swarm")))["peers"]  # within refresh_s: nothing fetched
    fetched_once = swarm.fetches
    clock.now += swarm.budget.refresh_s
    await get(daemon.url("/swarm"))

    assert first == again and set(first) == {"me", "good", "bad", "liar", "hangs", "gone", "odd"}
    assert first["good"]["state"] == "running" and first["good"]["series"][0]["points"] == [[0.0, 5.0], [1.0, 4.5]]
    assert first["me"]["series"] and first["me"]["malformed"] == []
    assert first["bad"]["malformed"] == ["role_status.learner.series.loss"] and first["bad"]["series"] == []
    assert first["liar"] == first["hangs"] == first["gone"] == {"error": NO_STATUS}
    assert "not fetched" in first["odd"]["error"]
    assert fetched_once == 5 and swarm.fetches == 10
    assert all(query == {"view": "public"} for peer in peers.values() for query in peer.asked)
    assert len(peers["good"].asked) == 2


async def test_a_public_daemon_fetches_no_loopback_address_for_a_viewer(closers: list) -> None:
    local = Peer({**GOOD, "peer_id": "local"})
    rows = [{"peer_id": "local", "http_addr": await local.start(closers)}]
    swarm = SwarmFigures(clock=Clock())
    daemon, _ = await serve_daemon(closers, rows, swarm, own_http="1.1.1.1:8080")

    peers = (await get(daemon.url("/swarm")))["peers"]

    assert "not fetched" in peers["local"]["error"] and local.asked == [] and swarm.fetches == 0


async def test_status_view_public_answers_as_to_anyone_even_this_host(closers: list) -> None:
    daemon, asked_as = await serve_daemon(closers, [], SwarmFigures(clock=Clock()), own_http="127.0.0.1:1")
    public = await get(daemon.url("/status?view=public"))
    owner = await get(daemon.url("/status"))
    assert public["secret"] is False and owner["secret"] is True and asked_as == [False, True]
