"""The daemon's own HTTP endpoints: ``/healthz``, ``/status`` (JSON), ``/metrics`` and the swarm
page (``GET /`` and its files under ``/page/``, from ``gossamer.peer.page``).

``/healthz`` answers anyone: 200 with the peer's state (running, idle, finished) and each role's
health, 503 once a role has failed. ``/status`` lists every live peer's addresses, this peer's
ledgers (with the error text of remote peers) and its traffic, and ``/metrics`` the same numbers
for Prometheus. Without a ``status_token`` both answer anyone, from any origin (the swarm page of
one peer reads every live peer's ``/status``). With one, they answer requests from this host (a
loopback address: ``curl 127.0.0.1:PORT/status``, ``gossamer swarm``) or a client sending
``Authorization: Bearer TOKEN``, and anyone else gets 403. Behind a reverse proxy on the same
host every request looks local: the token does not close ``/status`` there.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from gossamer.peer.metrics import CONTENT_TYPE, PeerMetrics

PAGE_FILES = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}
OPEN = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"}


def status_allowed(remote: str | None, authorization: str, token: str) -> bool:
    """Whether a request from ``remote`` with this Authorization header may read /status and /metrics:
    anyone when the peer has no ``token``; else this host (loopback) or the token's holder."""
    if not token:
        return True
    if hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        return True
    try:
        address = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def daemon_routes(status: Callable[[], dict[str, Any]], metrics: PeerMetrics, state: Callable[[], dict[str, Any]],
                  *, status_token: str = "") -> list[web.RouteDef]:
    """Routes every daemon serves, whatever its roles."""
    page = resources.files("gossamer.peer.page")

    def check(request: web.Request) -> None:
        if not status_allowed(request.remote, request.headers.get("Authorization", ""), status_token):
            raise web.HTTPForbidden(text="/status and /metrics answer this host only, or a client sending "
                                         "Authorization: Bearer <the peer's --status_token>")

    async def healthz(request: web.Request) -> web.Response:
        health = state()
        failed = health["state"] == "failed"
        return web.json_response({"ok": not failed, **health}, status=503 if failed else 200, headers=OPEN)

    async def status_handler(request: web.Request) -> web.Response:
        check(request)
        return web.json_response(status(), headers=OPEN)

    async def metrics_handler(request: web.Request) -> web.Response:
        check(request)
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def page_file(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in PAGE_FILES:
            raise web.HTTPNotFound(text=f"no page file {name[:40]!r}")
        return web.Response(body=(page / name).read_bytes(), content_type=PAGE_FILES[name])

    return [web.get("/healthz", healthz), web.get("/status", status_handler), web.get("/metrics", metrics_handler),
            web.get("/", page_file), web.get("/page/{name}", page_file)]
