"""``HttpServer``: an aiohttp application behind a header deadline (slowloris), connection caps in all
and per address shared fairly among addresses (``FairSlots``), a per-request deadline and a body
budget; a middleware translates what handlers raise into status codes (README.md, "HTTP")."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Mapping

import torch
from aiohttp import web
from aiohttp.log import server_logger

from gossamer.transport.errors import (
    ConnectionClosed,
    DecodeError,
    Overloaded,
    TransportError,
    TransportTimeout,
)
from gossamer.transport.http import HttpConfig, drop_frames, read_exactly
from gossamer.transport.limits import Limits
from gossamer.transport.logs import ThrottledLog
from gossamer.transport.safetensors_stream import decode_safetensors, encode_safetensors
from gossamer.transport.slots import ADDRESS_FULL, FULL, ByteBudget, FairSlots, address_key

log = logging.getLogger(__name__)

CONFIG_KEY = web.AppKey("gossamer_http_config", HttpConfig)
BUDGET_KEY = web.AppKey("gossamer_http_body_budget", ByteBudget)
LOG_KEY = web.AppKey("gossamer_http_log", ThrottledLog)
_DECIMAL = re.compile(r"[0-9]{1,18}")
_HELD = web.RequestKey("gossamer_body_bytes_held", int)  # bytes this request holds in the body budget


def _overloaded_response(reason: str) -> bytes:
    body = f"overloaded: {reason}\n".encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


OVERLOADED_RESPONSE = _overloaded_response(FULL)
ADDRESS_CAP_RESPONSE = _overloaded_response(ADDRESS_FULL)


def _config(request: web.Request) -> HttpConfig:
    return request.config_dict.get(CONFIG_KEY) or HttpConfig()


def _log(request: web.Request) -> logging.Logger | ThrottledLog:
    return request.config_dict.get(LOG_KEY) or log


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    """Bound the handler by request_timeout_s; map what it raises to HTTP statuses (see the module
    docstring); give back the body bytes it held; let no error keep a body alive."""
    try:
        async with asyncio.timeout(_config(request).request_timeout_s):
            return await handler(request)
    except asyncio.CancelledError:
        if request.transport is None or request.transport.is_closing():
            _log(request).info("%s %s from %s: the client went away", request.method, request.path[:80],
                               request.remote)
        raise
    except (web.HTTPException, TimeoutError):
        raise
    except DecodeError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    except TransportTimeout as exc:
        _log(request).info("%s %s from %s: %s", request.method, request.path[:80], request.remote, exc)
        raise web.HTTPRequestTimeout(text=str(exc)) from None
    except Overloaded as exc:
        raise web.HTTPServiceUnavailable(text=str(exc)) from None
    except ConnectionClosed as exc:
        _log(request).info("%s %s from %s: the client went away: %s", request.method, request.path[:80],
                           request.remote, exc)
        raise web.HTTPBadRequest(text="request body cut short") from None
    except Exception:
        _log(request).exception("handler of %s %s failed on a request from %s", request.method,
                                request.path[:80], request.remote)
        raise web.HTTPInternalServerError(text="internal error") from None
    finally:
        _release_body(request)
        exc = sys.exc_info()[1]
        if exc is not None:
            drop_frames(exc)


def _release_body(request: web.Request) -> None:
    held = request.get(_HELD, 0)
    if held:
        request[_HELD] = 0
        request.config_dict[BUDGET_KEY].release(held)


class _Gate(asyncio.Protocol):
    """Decides, once the peer's address is known, whether aiohttp serves the connection or it is
    refused (``_Refuse``); forwards every protocol event to that one and tells the server when the
    connection ends."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self.key = ""

    @property
    def busy(self) -> bool:
        """Whether aiohttp is handling a request of this connection (best effort: a private field)."""
        return getattr(self._inner, "_current_request", None) is not None

    def evict(self) -> None:
        """Close at once: the connection's slot went to an address holding fewer."""
        if self._transport is not None:
            self._transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self.key = address_key(transport.get_extra_info("peername"))
        self._inner = self._server._assign(self)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        assert self._inner is not None
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        assert self._inner is not None
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        assert self._inner is not None
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        assert self._inner is not None
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            if self._inner is not None:
                self._inner.connection_lost(exc)
        finally:
            self._server._lost(self)


class _Refuse(asyncio.Protocol):
    """Answers 503, half-closes, discards what the client still sends, closes (bounded in time)."""

    def __init__(self, response: bytes, timeout_s: float) -> None:
        self._response = response
        self._timeout_s = timeout_s
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._response)
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


class HttpServer:
    """Serves an aiohttp application; see the module docstring for its protections."""

    def __init__(self, runner: web.AppRunner, config: HttpConfig, budget: ByteBudget, log: ThrottledLog) -> None:
        self._runner = runner
        self._config = config
        self.budget = budget
        self.log = log
        self._listener: asyncio.Server | None = None
        self._slots: FairSlots[_Gate] = FairSlots(config.max_connections, config.max_connections_per_address)
        self._gates: set[_Gate] = set()  # every connection not yet lost: served, evicted or refused
        self._refusing: dict[_Gate, _Refuse] = {}
        self.refused_connections = 0
        self._none_open = asyncio.Event()
        self._none_open.set()
        self._closed = False

    @classmethod
    async def create(cls, app: web.Application, *, host: str = "127.0.0.1", port: int = 0,
                     config: HttpConfig = HttpConfig()) -> HttpServer:
        """Set up ``app`` and listen on ``host:port`` (port 0: any free port)."""
        budget = ByteBudget(config.max_inflight_body_bytes, what="request body")
        throttled = ThrottledLog(log)
        app[CONFIG_KEY] = config
        app[BUDGET_KEY] = budget
        app[LOG_KEY] = throttled
        app.middlewares.append(_guard)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, logger=ThrottledLog(server_logger),
                               keepalive_timeout=config.header_timeout_s, read_bufsize=config.chunk_bytes,
                               lingering_time=config.lingering_s, shutdown_timeout=config.shutdown_timeout_s,
                               handler_cancellation=True)
        await runner.setup()
        server = cls(runner, config, budget, throttled)
        try:
            server._listener = await asyncio.get_running_loop().create_server(
                lambda: _Gate(server), host, port, backlog=max(128, config.max_connections))
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
        """Connections holding a slot now."""
        return len(self._slots)

    @property
    def evicted_connections(self) -> int:
        """Connections closed so far to give their slot to an address holding fewer (``FairSlots``)."""
        return self._slots.evictions

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
            for refused in list(self._refusing.values()):
                refused.abort()
        try:  # the transports close their sockets a loop iteration after aiohttp closed them
            async with asyncio.timeout(self._config.shutdown_timeout_s):
                await self._none_open.wait()
        except TimeoutError:
            log.warning("%d HTTP connections still open after shutdown", len(self._gates))

    def _assign(self, gate: _Gate) -> asyncio.Protocol:
        """aiohttp's protocol for a connection ``FairSlots`` admits (closing the one it evicts, if
        any); a ``_Refuse`` for any other."""
        self._none_open.clear()
        self._gates.add(gate)
        config = self._config
        admission = self._slots.admit(gate.key, gate, busy=lambda held: held.busy)
        if admission.admitted:
            if admission.evicted is not None:
                admission.evicted.evict()
            assert self._runner.server is not None
            return self._runner.server()
        self.refused_connections += 1
        response = OVERLOADED_RESPONSE if admission.refused == FULL else ADDRESS_CAP_RESPONSE
        timeout_s = config.header_timeout_s if len(self._refusing) < config.max_connections else 0.0
        refused = _Refuse(response, timeout_s)
        self._refusing[gate] = refused
        return refused

    def _lost(self, gate: _Gate) -> None:
        self._slots.release(gate)
        self._refusing.pop(gate, None)
        self._gates.discard(gate)
        if not self._gates:
            self._none_open.set()


# --- handler helpers ------------------------------------------------------------------------


async def read_body_into(request: web.Request, *, max_bytes: int) -> bytearray | memoryview:
    """The request body in one buffer of exactly Content-Length bytes: 411 without one, 413
    above ``max_bytes``, 503 when the server's body budget cannot hold it (held until the handler
    ends); TransportTimeout past the whole-body deadline. Check the sender before calling this."""
    size = request.content_length
    if size is None:
        raise web.HTTPLengthRequired(text="Content-Length is required")
    if size > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=size,
                                            text=f"body of {size} bytes exceeds the cap of {max_bytes}")
    config = _config(request)
    budget = request.config_dict.get(BUDGET_KEY)
    if budget is not None:
        budget.reserve(size)  # Overloaded -> 503
        request[_HELD] = request.get(_HELD, 0) + size
    return await read_exactly(request.content, size, idle_timeout_s=config.idle_timeout_s,
                              deadline_s=config.body_deadline_s(size))


def path_int(request: web.Request, name: str, *, below: int | None = None) -> int:
    """The route parameter ``name`` as a non-negative decimal int (at most 18 digits, ASCII only;
    below ``below`` when given); 404 for anything else, never a 500."""
    text = request.match_info.get(name, "")
    if not _DECIMAL.fullmatch(text) or (below is not None and int(text) >= below):
        bound = f" below {below}" if below is not None else ""
        raise web.HTTPNotFound(text=f"{name} {text[:20]!r} is not a decimal number{bound}")
    return int(text)


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

