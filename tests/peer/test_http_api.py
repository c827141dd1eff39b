"""The daemon's own endpoints (issue 10): ``/status`` and ``/metrics`` list every live peer's
addresses, ledgers with remote error text and traffic. A peer with a status token serves them to
this host (loopback) and the token's holders only; one without serves them to anyone (the swarm
page reads every peer's ``/status``), but only its owner sees the fields its roles mark private
(issue 21: a role's per-step losses and batch makeup); ``/healthz`` answers anyone."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gossamer.peer.http_api import OWNER, PUBLIC, daemon_routes, status_allowed, status_reader
from gossamer.peer.metrics import PeerMetrics, Snapshot
from gossamer.peer.serving import role_app
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from tests.transport.support import RawClient


@pytest.mark.parametrize(("remote", "authorization", "token", "allowed"), [
    ("127.0.0.1", "", "s3cret", True),
    ("127.0.0.2", "", "s3cret", True),
    ("::1", "", "s3cret", True),
    ("::ffff:127.0.0.1", "", "s3cret", True),
    ("203.0.113.5", "", "s3cret", False),
    ("2001:db8::5", "", "s3cret", False),
    ("::ffff:203.0.113.5", "", "s3cret", False),
    ("203.0.113.5", "Bearer s3cret", "s3cret", True),
    ("203.0.113.5", "Bearer s3cre", "s3cret", False),
    ("203.0.113.5", "s3cret", "s3cret", False),
    (None, "", "s3cret", False),
    ("not an address", "", "s3cret", False),
    ("203.0.113.5", "", "", True),
    ("203.0.113.5", "Bearer ", "", True),
    (None, "", "", True),
])
def test_status_with_a_token_answers_this_host_or_its_holders_only(remote: str | None, authorization: str, token: str,
                                                                   allowed: bool) -> None:
    assert status_allowed(remote, authorization, token) is allowed


@pytest.mark.parametrize(("remote", "authorization", "token", "reader"), [
    ("127.0.0.1", "", "", OWNER),
    ("::1", "", "", OWNER),
    ("203.0.113.5", "", "", PUBLIC),
    ("203.0.113.5", "Bearer guess", "", PUBLIC),
    (None, "", "", PUBLIC),
    ("203.0.113.5", "Bearer s3cret", "s3cret", OWNER),
    ("127.0.0.1", "", "s3cret", OWNER),
    ("203.0.113.5", "", "s3cret", None),
])
def test_only_this_host_or_the_token_holder_reads_as_the_owner(remote: str | None, authorization: str, token: str,
                                                               reader: str | None) -> None:
    assert status_reader(remote, authorization, token) == reader


@pytest.fixture
async def served() -> AsyncIterator[HttpServer]:
    metrics = PeerMetrics(lambda owner: Snapshot(uptime_s=1.0, live_peers=2, round=3, bytes_sent={}, bytes_received={},
                                           records_rejected={}))
    routes = daemon_routes(lambda owner: {"live_peers": [{"http_addr": "198.51.100.7:8080"}], "owner": owner}, metrics,
                           lambda: {"state": "running", "roles": {}}, status_token="s3cret")
    server = await HttpServer.create(role_app([], None, extra=routes))
    yield server
    await server.aclose()


async def test_status_and_metrics_are_served_over_loopback_as_gossamer_swarm_reads_them(served: HttpServer) -> None:
    client = await HttpClient.create()
    try:
        status = await client.get_json(served.url("/status"))
        health = await client.get_json(served.url("/healthz"))
    finally:
        await client.aclose()
    raw = await RawClient.connect(served.address)
    try:
        await raw.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        metrics = await raw.read_response_head()
    finally:
        await raw.aclose()

    assert status == {"live_peers": [{"http_addr": "198.51.100.7:8080"}], "owner": True} and health == {"ok": True, "state": "running", "roles": {}}
    assert metrics.startswith(b"HTTP/1.1 200")
