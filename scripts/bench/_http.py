"""gossamer HTTP rows of the transport benchmark: the tensor PUT as a safetensors body to an
``HttpServer`` route that decodes it (``read_tensors``) and answers; the sender times
``HttpClient.put_tensors`` until the answer, the warm-up checks a CRC-32 of what arrived."""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection
from typing import Any

from _common import BenchError, checksum, make_tensor, serve_worker
from _wan import maybe_proxy
from aiohttp import web

from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer, read_tensors
from gossamer.transport.limits import DEFAULT_LIMITS

ROUTE = "/tensors"
VERIFY_HEADER = "X-Bench-Verify"


async def _receive(conn: Connection, params: dict[str, Any]) -> None:
    handle_s: list[float] = []

    async def put(request: web.Request) -> web.Response:
        start = time.perf_counter()
        tensors, _ = await read_tensors(request, limits=DEFAULT_LIMITS)
        handle_s.append(time.perf_counter() - start)
        crc = checksum(tensors["x"]) if request.headers.get(VERIFY_HEADER) == "1" else None
        return web.json_response({"checksum": crc})

    app = web.Application()
    app.router.add_put(ROUTE, put)
    server = await HttpServer.create(app)
    proxy = await maybe_proxy(server.address, params)
    await serve_worker(conn, _noop, ready={"address": (proxy or server).address}, closers=(proxy, server),
                       done=lambda: {"read_and_decode_s": handle_s})


async def _noop(index: int) -> dict[str, Any]:
    return {}


def receiver(conn: Connection, params: dict[str, Any]) -> None:
    """Run an HttpServer with a PUT route (behind the WAN proxy when ``params["wan"]``)."""
    asyncio.run(_receive(conn, params))


async def _send(conn: Connection, params: dict[str, Any]) -> None:
    tensor = make_tensor(params["size_bytes"], params["seed"])
    host, port = params["peers"][0]["address"]
    url = f"http://{host}:{port}{ROUTE}"
    client = await HttpClient.create()
    expected = checksum(tensor)

    async def on_go(index: int) -> dict[str, Any]:
        start = time.perf_counter()
        answer = await client.put_tensors(url, {"x": tensor}, extra_headers={VERIFY_HEADER: str(int(index == 0))})
        seconds = time.perf_counter() - start
        if index == 0 and answer.get("checksum") != expected:
            raise BenchError(f"HTTP receiver decoded a different tensor (crc {answer.get('checksum')})")
        return {"seconds": seconds}

    await serve_worker(conn, on_go, ready={}, closers=(client,))


def sender(conn: Connection, params: dict[str, Any]) -> None:
    """Connect to the receiver (or its proxy) and PUT the tensor once per repetition."""
    asyncio.run(_send(conn, params))
