"""The daemon's own HTTP endpoints: ``/healthz``, ``/status`` (JSON) and ``/metrics``.

``/healthz`` answers anyone. ``/status`` lists every live peer's addresses, this peer's ledgers
(with the error text of remote peers) and its traffic, and ``/metrics`` the same numbers for
Prometheus: both answer only requests from this host (a loopback address: ``curl
127.0.0.1:PORT/status``, ``gossamer swarm``) unless the peer has a ``status_token``, which a
remote client sends as ``Authorization: Bearer TOKEN``. Anyone else gets 403. Behind a reverse
proxy on the same host every request looks local: set a token there.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gossamer.peer.metrics import CONTENT_TYPE, PeerMetrics


def status_allowed(remote: str | None, authorization: str, token: str) -> bool:
    """Whether a request from ``remote`` with this Authorization header may read /status and /metrics."""
    if token and hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode()):
        return True
    try:
        address = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def daemon_routes(status: Callable[[], dict[str, Any]], metrics: PeerMetrics, *,
                  status_token: str = "") -> list[web.RouteDef]:
    """Routes every daemon serves, whatever its roles."""

    def check(request: web.Request) -> None:
        if not status_allowed(request.remote, request.headers.get("Authorization", ""), status_token):
            raise web.HTTPForbidden(text="/status and /metrics answer this host only, or a client sending "
                                         "Authorization: Bearer <the peer's --status_token>")

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def status_handler(request: web.Request) -> web.Response:
        check(request)
        return web.json_response(status())

    async def metrics_handler(request: web.Request) -> web.Response:
        check(request)
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    return [web.get("/healthz", healthz), web.get("/status", status_handler), web.get("/metrics", metrics_handler)]
