"""HTTP server: an aiohttp application behind a connection cap and deadlines, plus body helpers.

``HttpServer.create(app, config=...)`` serves ``app`` (adding one middleware, so pass an app
that has not been started yet) with these protections:

- header deadline (slowloris): aiohttp's keep-alive timer, set to ``header_timeout_s``, closes a
  connection that is waiting for a request whose line and headers are not complete that long
  after the connection opened or the previous response finished (tested byte by byte);
- ``max_connections``: the listener's protocol factory counts live connections; beyond the cap a
  connection gets ``503`` and is closed;
- ``request_timeout_s``: a middleware bounds every handler (``504`` if nothing was sent yet,
  otherwise the connection is dropped), and maps transport errors raised inside a handler:
  DecodeError -> ``400`` with its message, TransportTimeout -> ``408``;
- body helpers read and write with ``idle_timeout_s`` per chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

import torch
from aiohttp import web

from gossamer.transport.errors import DecodeError, TransportError, TransportTimeout
from gossamer.transport.http import HttpConfig, read_exactly
from gossamer.transport.limits import Limits
from gossamer.transport.safetensors_stream import decode_safetensors, encode_safetensors

log = logging.getLogger(__name__)

CONFIG_KEY = web.AppKey("gossamer_http_config", HttpConfig)
OVERLOADED_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                       b"Content-Length: 35\r\nConnection: close\r\n\r\noverloaded: connection cap reached\n")


def _config(request: web.Request) -> HttpConfig:
    return request.config_dict.get(CONFIG_KEY) or HttpConfig()


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    """Bound the handler by request_timeout_s; map transport errors to HTTP statuses."""
    try:
        async with asyncio.timeout(_config(request).request_timeout_s):
            return await handler(request)
    except DecodeError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    except TransportTimeout as exc:
        raise web.HTTPRequestTimeout(text=str(exc)) from exc


class _Counted(asyncio.Protocol):
    """Forwards every protocol event to aiohttp's handler and reports when the connection ends."""

    def __init__(self, inner: asyncio.Protocol, on_lost: Callable[[], None]) -> None:
        self._inner = inner
        self._on_lost = on_lost

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            self._on_lost()


class _Refuse(asyncio.Protocol):
    """Answers 503, half-closes, discards what the client still sends, closes (bounded in time)."""

    def __init__(self, timeout_s: float, on_lost: Callable[[_Refuse], None]) -> None:
        self._timeout_s = timeout_s
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(OVERLOADED_RESPONSE)
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self.abort)

    def data_received(self, data: bytes) -> None:
        return None  # the request of a refused connection is not read

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._on_lost(self)


class HttpServer:
    """Serves an aiohttp application; see the module docstring for its protections."""

    def __init__(self, runner: web.AppRunner, config: HttpConfig) -> None:
        self._runner = runner
        self._config = config
        self._listener: asyncio.Server | None = None
        self._open = 0
        self._refusing: set[_Refuse] = set()
        self._none_open = asyncio.Event()
        self._none_open.set()
        self._closed = False

    @classmethod
    async def create(cls, app: web.Application, *, host: str = "127.0.0.1", port: int = 0,
                     config: HttpConfig = HttpConfig()) -> HttpServer:
        """Set up ``app`` and listen on ``host:port`` (port 0: any free port)."""
        app[CONFIG_KEY] = config
        app.middlewares.append(_guard)
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               keepalive_timeout=config.header_timeout_s, read_bufsize=config.chunk_bytes,
                               lingering_time=config.idle_timeout_s, shutdown_timeout=config.shutdown_timeout_s)
        await runner.setup()
        server = cls(runner, config)
        try:
            server._listener = await asyncio.get_running_loop().create_server(
                server._protocol, host, port, backlog=max(128, config.max_connections))
        except OSError as exc:
            await runner.cleanup()
            raise TransportError(f"cannot listen on {host}:{port}: {exc}") from exc
        return server

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None
        host, port = self._listener.sockets[0].getsockname()[:2]
        return host, port

    @property
    def connections_open(self) -> int:
        return self._open

    def url(self, path: str = "/") -> str:
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/{path.lstrip('/')}"

    async def aclose(self) -> None:
        """Stop listening, let handlers finish (up to shutdown_timeout_s), close (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._listener is not None:
                self._listener.close()
                await self._listener.wait_closed()
        finally:
            await self._runner.cleanup()
            for refused in list(self._refusing):
                refused.abort()
        try:  # the transports close their sockets a loop iteration after aiohttp closed them
            async with asyncio.timeout(self._config.shutdown_timeout_s):
                await self._none_open.wait()
        except TimeoutError:
            log.warning("%d HTTP connections still open after shutdown", self._open + len(self._refusing))

    def _protocol(self) -> asyncio.Protocol:
        self._none_open.clear()
        if self._open < self._config.max_connections:
            assert self._runner.server is not None
            self._open += 1
            return _Counted(self._runner.server(), self._lost)
        timeout_s = self._config.header_timeout_s if len(self._refusing) < self._config.max_connections else 0.0
        refused = _Refuse(timeout_s, self._refused_lost)
        self._refusing.add(refused)
        return refused

    def _lost(self) -> None:
        self._open -= 1
        self._check_none_open()

    def _refused_lost(self, refused: _Refuse) -> None:
        self._refusing.discard(refused)
        self._check_none_open()

    def _check_none_open(self) -> None:
        if self._open == 0 and not self._refusing:
            self._none_open.set()


# --- handler helpers ------------------------------------------------------------------------


async def read_body_into(request: web.Request, *, max_bytes: int) -> bytearray | memoryview:
    """The request body in one buffer of exactly Content-Length bytes (411 / 413 otherwise)."""
    size = request.content_length
    if size is None:
        raise web.HTTPLengthRequired(text="Content-Length is required")
    if size > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=size,
                                            text=f"body of {size} bytes exceeds the cap of {max_bytes}")
    return await read_exactly(request.content, size, idle_timeout_s=_config(request).idle_timeout_s)


async def read_tensors(request: web.Request, *, limits: Limits, require_finite: bool = False
                       ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors request body; 400 with the reason if it is bad."""
    config = _config(request)
    cap = min(config.max_body_bytes, limits.max_payload_bytes + limits.max_header_bytes + 8)
    body = await read_body_into(request, max_bytes=cap)
    try:
        return decode_safetensors(body, limits=limits, require_finite=require_finite)
    except DecodeError as exc:
        raise web.HTTPBadRequest(text=f"bad safetensors body: {exc}") from exc


async def stream_tensors(request: web.Request, tensors: Mapping[str, torch.Tensor],
                         metadata: dict[str, str] | None = None) -> web.StreamResponse:
    """Send ``tensors`` as a safetensors body with Content-Length, in slices of chunk_bytes."""
    config = _config(request)
    total_bytes, chunks = encode_safetensors(tensors, metadata)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = total_bytes
    await response.prepare(request)
    for chunk in chunks:
        await write_slices(request, response, chunk, config)
    await response.write_eof()
    return response


async def write_slices(request: web.Request, response: web.StreamResponse, chunk: memoryview,
                       config: HttpConfig) -> None:
    """Write ``chunk`` in slices of chunk_bytes, each within idle_timeout_s.

    A client that stops reading gets its connection closed (the response is half sent, nothing
    else can follow it) and the handler a TransportTimeout.
    """
    view = chunk.cast("B") if chunk.format != "B" else chunk
    for offset in range(0, view.nbytes, config.chunk_bytes):
        try:
            async with asyncio.timeout(config.idle_timeout_s):
                await response.write(view[offset:offset + config.chunk_bytes])
        except TimeoutError:
            if request.transport is not None:
                request.transport.close()
            raise TransportTimeout(f"client stopped reading (idle_timeout_s={config.idle_timeout_s})") from None

