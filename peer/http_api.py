"""The daemon's own HTTP endpoints: ``/healthz``, ``/status`` (JSON), ``/metrics`` and the swarm
page (``GET /`` and its files under ``/page/``, from ``gossamer.peer.page``).

``/healthz`` answers 200 with the peer's state (running, idle, finished) and each role's health,
503 once a role has failed. ``/status`` and ``/healthz`` may be read from any origin (the swarm
page of one peer reads every live peer's ``/status``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from gossamer.peer.metrics import CONTENT_TYPE, PeerMetrics

PAGE_FILES = {"index.html": "text/html", "page.js": "text/javascript", "page.css": "text/css"}
OPEN = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"}


def daemon_routes(status: Callable[[], dict[str, Any]], metrics: PeerMetrics,
                  state: Callable[[], dict[str, Any]]) -> list[web.RouteDef]:
    """Routes every daemon serves, whatever its roles."""
    page = resources.files("gossamer.peer.page")

    async def healthz(request: web.Request) -> web.Response:
        health = state()
        failed = health["state"] == "failed"
        return web.json_response({"ok": not failed, **health}, status=503 if failed else 200, headers=OPEN)

    async def status_handler(request: web.Request) -> web.Response:
        return web.json_response(status(), headers=OPEN)

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def page_file(request: web.Request) -> web.Response:
        name = request.match_info.get("name", "index.html")
        if name not in PAGE_FILES:
            raise web.HTTPNotFound(text=f"no page file {name[:40]!r}")
        return web.Response(body=(page / name).read_bytes(), content_type=PAGE_FILES[name])

    return [web.get("/healthz", healthz), web.get("/status", status_handler), web.get("/metrics", metrics_handler),
            web.get("/", page_file), web.get("/page/{name}", page_file)]
