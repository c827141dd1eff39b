"""The daemon's own HTTP endpoints: ``/healthz`` (anyone), ``/status`` and ``/metrics`` (whole for the
owner: this host or the ``status_token``'s holder; without the roles' private fields, or 403 with
a token, for anyone else) and the swarm page (README.md of peer, "http_api")."""

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


def daemon_routes(status: Callable[[bool], dict[str, Any]], metrics: PeerMetrics, state: Callable[[], dict[str, Any]],
                  *, status_token: str = "") -> list[web.RouteDef]:
    """Routes every daemon serves, whatever its roles; ``status(owner)`` is the /status body for
    the owner or for anyone else."""
    page = resources.files("gossamer.peer.page")

    def check(request: web.Request) -> bool:
        """True for the owner, False for anyone else who may read; 403 for the rest."""
        reader = status_reader(request.remote, request.headers.get("Authorization", ""), status_token)
        if reader is None:
            raise web.HTTPForbidden(text="/status and /metrics answer this host only, or a client sending "
                                         "Authorization: Bearer <the peer's --status_token>")
        return reader == OWNER

    async def healthz(request: web.Request) -> web.Response:
        health = state()
        failed = health["state"] == "failed"
        return web.json_response({"ok": not failed, **health}, status=503 if failed else 200, headers=OPEN)

    async def status_handler(request: web.Request) -> web.Response:
        return web.json_response(status(check(request)), headers=OPEN)

    async def metrics_handler(request: web.Request) -> web.Response:
        owner = check(request)
        return web.Response(body=metrics.render(owner=owner), headers={"Content-Type": CONTENT_TYPE})

    async def page_file(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in PAGE_FILES:
            raise web.HTTPNotFound(text=f"no page file {name[:40]!r}")
        return web.Response(body=(page / name).read_bytes(), content_type=PAGE_FILES[name])

    return [web.get("/healthz", healthz), web.get("/status", status_handler), web.get("/metrics", metrics_handler),
            web.get("/", page_file), web.get("/page/{name}", page_file)]
