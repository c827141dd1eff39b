"""The daemon's own HTTP endpoints: ``/healthz``, ``/status`` (JSON) and ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from gossamer.peer.metrics import CONTENT_TYPE, PeerMetrics


def daemon_routes(status: Callable[[], dict[str, Any]], metrics: PeerMetrics) -> list[web.RouteDef]:
    """Routes every daemon serves, whatever its roles."""

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def status_handler(request: web.Request) -> web.Response:
        return web.json_response(status())

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    return [web.get("/healthz", healthz), web.get("/status", status_handler), web.get("/metrics", metrics_handler)]
