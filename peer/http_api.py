"""The daemon's own HTTP endpoints: ``/healthz`` (anyone), ``/status`` and ``/metrics`` (whole for the
owner: this host or the ``status_token``'s holder; without the roles' private fields, or 403 with
a token, for anyone else), the swarm page and ``/swarm``, the live peers' figures this daemon
fetched and checked for it (``SwarmFigures``; README.md of peer, "http_api")."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from gossamer.peer.metrics import CONTENT_TYPE, PeerMetrics
from gossamer.peer.page.figures import figures, status_url
from gossamer.transport.errors import TransportError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient

PAGE_FILES = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}
OPEN = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"}


OWNER, PUBLIC = "owner", "public"


def status_reader(remote: str | None, authorization: str, token: str) -> str | None:
    """Who a request from ``remote`` with this Authorization header reads /status and /metrics as:
    ``OWNER`` (this host, loopback, or the ``token``'s holder), ``PUBLIC`` (anyone else, when the
    peer has no token), or None (anyone else, when it has one: refused)."""
    if token and hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        return OWNER
    if _is_loopback(remote):
        return OWNER
    return None if token else PUBLIC


def status_allowed(remote: str | None, authorization: str, token: str) -> bool:
    """Whether a request may read /status and /metrics at all (see ``status_reader``)."""
    return status_reader(remote, authorization, token) is not None


def _is_loopback(remote: str | None) -> bool:
    try:
        address = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True, kw_only=True)
class FetchBudget:
    """What filling the swarm page may cost this daemon, whoever asks for it.

    Attributes:
        refresh_s: the live peers' ``/status`` are fetched at most once per this, for every viewer.
        timeout_s: deadline of one peer's fetch (connect, headers and body).
        deadline_s: deadline of one whole refresh (the peers not fetched by then are shown without
            figures); viewers wait at most this for a refresh.
        max_peers: most peers fetched per refresh (the others are shown without figures).
        max_status_bytes: largest ``/status`` body read from a peer.
        parallel: most fetches at once.
    """

    refresh_s: float = 2.0
    timeout_s: float = 2.0
    deadline_s: float = 5.0
    max_peers: int = 64
    max_status_bytes: int = 512 << 10
    parallel: int = 4


NO_STATUS = "no status"  # one answer for every failure: no port scan through the page


class SwarmFigures:
    """The live peers' page figures, fetched by this daemon (never by the viewer's browser) within a
    ``FetchBudget`` and checked by ``figures``; kept as encoded JSON until the next refresh."""

    def __init__(self, budget: FetchBudget = FetchBudget(), *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._lock = asyncio.Lock()
        self._at = -float("inf")
        self._encoded: dict[str, str] = {}
        self.fetches = 0  # how many peer /status requests were made (for tests and the curious)

    async def encoded(self, own: Mapping[str, Any]) -> dict[str, str]:
        """Each other live peer's figures as JSON text, by peer id; refreshed first when older than
        ``refresh_s`` (one refresh at a time; concurrent viewers share it)."""
        async with self._lock:
            if self._clock() - self._at >= self.budget.refresh_s:
                self._encoded = await self._refresh(own)
                self._at = self._clock()
            return self._encoded

    async def _refresh(self, own: Mapping[str, Any]) -> dict[str, str]:
        rows = [row for row in own.get("live_peers") or [] if isinstance(row, dict)
                and isinstance(row.get("peer_id"), str) and row["peer_id"] != own.get("peer_id")]
        own_http = str((own.get("addresses") or {}).get("http", ""))
        fetched, skipped = rows[:self.budget.max_peers], rows[self.budget.max_peers:]
        budget = self.budget
        config = HttpConfig(request_timeout_s=budget.timeout_s, connect_timeout_s=budget.timeout_s,
                            idle_timeout_s=budget.timeout_s, max_json_bytes=budget.max_status_bytes,
                            max_connections=budget.parallel)
        client = await HttpClient.create(config=config)
        tasks = [asyncio.create_task(self._one(client, row, status_url(row.get("http_addr"), own_http)))
                 for row in fetched]
        try:
            if tasks:
                await asyncio.wait(tasks, timeout=budget.deadline_s)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
        answers = [task.result() if not task.cancelled() and task.exception() is None else {"error": NO_STATUS}
                   for task in tasks]
        out = {row["peer_id"]: json.dumps(answer) for row, answer in zip(fetched, answers, strict=True)}
        out.update((row["peer_id"], json.dumps({"error": f"not fetched (over {budget.max_peers} peers)"}))
                   for row in skipped)
        return out

    async def _one(self, client: HttpClient, row: Mapping[str, Any], url: str | None) -> dict[str, Any]:
        if url is None:
            return {"error": "not fetched (its address is not one this peer may dial for a viewer)"}
        self.fetches += 1
        try:
            async with asyncio.timeout(self.budget.timeout_s):
                answer = await client.get_json(url)
        except (TransportError, ValueError, TimeoutError):  # ValueError: json's int-digits cap
            return {"error": NO_STATUS}
        if not isinstance(answer, dict) or answer.get("peer_id") != row["peer_id"]:
            return {"error": NO_STATUS}  # not a status, or another peer's
        return figures(answer)


def daemon_routes(status: Callable[[bool], dict[str, Any]], metrics: PeerMetrics, state: Callable[[], dict[str, Any]],
                  *, status_token: str = "", swarm: SwarmFigures | None = None) -> list[web.RouteDef]:
    """Routes every daemon serves, whatever its roles; ``status(owner)`` is the /status body for
    the owner or for anyone else. ``/status?view=public`` answers as to anyone, whoever asks (what
    ``SwarmFigures`` asks for: a peer on the same host must not hand it its owner's fields)."""
    page = resources.files("gossamer.peer.page")
    swarm = swarm or SwarmFigures()

    def check(request: web.Request) -> bool:
        """True for the owner, False for anyone else who may read; 403 for the rest."""
        reader = status_reader(request.remote, request.headers.get("Authorization", ""), status_token)
        if reader is None:
            raise web.HTTPForbidden(text="/status and /metrics answer this host only, or a client sending "
                                         "Authorization: Bearer <the peer's --status_token>")
        return reader == OWNER and request.query.get("view") != "public"

    async def healthz(request: web.Request) -> web.Response:
        health = state()
        failed = health["state"] == "failed"
        return web.json_response({"ok": not failed, **health}, status=503 if failed else 200, headers=OPEN)

    async def status_handler(request: web.Request) -> web.Response:
        return web.json_response(status(check(request)), headers=OPEN)

    async def swarm_handler(request: web.Request) -> web.Response:
        own = status(check(request))
        others = await swarm.encoded(own)
        entries = [f"{json.dumps(own.get('peer_id', ''))}: {json.dumps(figures(own))}",
                   *(f"{json.dumps(peer_id)}: {text}" for peer_id, text in others.items())]
        return web.Response(text="{\"peers\": {" + ", ".join(entries) + "}}", content_type="application/json",
                            headers=OPEN)

    async def metrics_handler(request: web.Request) -> web.Response:
        owner = check(request)
        return web.Response(body=metrics.render(owner=owner), headers={"Content-Type": CONTENT_TYPE})

    async def page_file(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in PAGE_FILES:
            raise web.HTTPNotFound(text=f"no page file {name[:40]!r}")
        return web.Response(body=(page / name).read_bytes(), content_type=PAGE_FILES[name])

    return [web.get("/healthz", healthz), web.get("/status", status_handler), web.get("/metrics", metrics_handler),
            web.get("/swarm", swarm_handler), web.get("/", page_file), web.get("/page/{name}", page_file)]
