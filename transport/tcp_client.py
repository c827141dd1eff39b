"""``TcpConnection``: one connection carrying concurrent requests (matched by a fresh request id) and
one-way frames, written whole under a lock. An ERROR frame fails its request; a bad frame or a
closed connection fails every waiting request (README.md, "The client")."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import replace

from gossamer.transport.errors import (
    ConnectionClosed,
    DecodeError,
    Overloaded,
    RemoteError,
    TransportError,
    TransportTimeout,
)
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp_stream import (
    FrameStream,
    PayloadBufferHook,
    TcpConfig,
    TcpStats,
    configure_socket,
)

log = logging.getLogger(__name__)

MAX_ERROR_MESSAGE_CHARS = 1000


class ConnectFailed(ConnectionClosed):
    """The connection could not be established (refused, unreachable, unknown host)."""


def error_from_frame(frame: Frame) -> TransportError:
    """The exception an ERROR frame stands for."""
    message = frame.header.get("message")
    text = message[:MAX_ERROR_MESSAGE_CHARS] if isinstance(message, str) else "remote error"
    if frame.header.get("code") == "overloaded":
        return Overloaded(text)
    return RemoteError(text)


def _fresh(exc: TransportError) -> TransportError:
    """A new instance of ``exc`` (an exception object is raised in one place only)."""
    if isinstance(exc, RemoteError):
        return RemoteError(str(exc), status=exc.status)
    return type(exc)(str(exc))


class TcpConnection:
    """A client connection; build it with ``tcp_connect``. See the module docstring."""

    def __init__(self, stream: FrameStream, *, config: TcpConfig, stats: TcpStats) -> None:
        self._stream = stream
        self._config = config
        self._stats = stats
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._next_rid = 1
        self._failure: TransportError | None = None
        self._closed = False
        self._reader: asyncio.Task[None] | None = None

    def _start(self) -> None:
        self._reader = asyncio.create_task(self._read_loop(), name="tcp-client-reader")

    @property
    def stats(self) -> TcpStats:
        """A snapshot of the counters."""
        return replace(self._stats)

    @property
    def closed(self) -> bool:
        return self._closed or self._failure is not None

    async def request(self, frame: Frame, *, timeout_s: float | None = None) -> Frame:
        """Send ``frame`` as a REQUEST and return the RESPONSE; RemoteError for an ERROR answer."""
        self._check_open()
        timeout = self._config.request_timeout_s if timeout_s is None else timeout_s
        rid = self._next_rid
        self._next_rid += 1
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            async with asyncio.timeout(timeout):
                await self._stream.write_frame(Frame(FrameType.REQUEST, {**frame.header, "rid": rid}, frame.payload))
                return await future
        except TimeoutError:
            raise TransportTimeout(f"no response within {timeout} s") from None
        finally:
            del self._pending[rid]
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: the write's own error may have been raised instead

    async def send(self, frame: Frame, *, timeout_s: float | None = None) -> None:
        """Send ``frame`` as a ONEWAY frame; blocks while the server pushes back."""
        self._check_open()
        try:
            async with asyncio.timeout(timeout_s):
                await self._stream.write_frame(Frame(FrameType.ONEWAY, frame.header, frame.payload))
        except TimeoutError:
            raise TransportTimeout(f"one-way send did not finish within {timeout_s} s") from None

    async def aclose(self) -> None:
        """Close the connection; waiting requests fail with ConnectionClosed (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stats.connections_open = 0
        self._stream.abort()
        try:
            if self._reader is not None:
                self._reader.cancel()
                await asyncio.gather(self._reader, return_exceptions=True)
            self._fail(ConnectionClosed("connection closed locally"))
            await self._stream.wait_writers(self._config.read_timeout_s)
        finally:
            self._stream.close()

    def _check_open(self) -> None:
        if self._failure is not None:
            raise _fresh(self._failure)
        if self._closed:
            raise ConnectionClosed("connection is closed")

    async def _read_loop(self) -> None:
        try:
            while True:
                frame = await self._stream.read_frame()
                if frame is None:
                    raise ConnectionClosed("server closed the connection")
                self._deliver(frame)
        except TransportError as exc:
            self._fail(exc)
            self._stream.abort()

    def _deliver(self, frame: Frame) -> None:
        rid = frame.header.get("rid")
        future = self._pending.get(rid) if isinstance(rid, int) else None
        if frame.type is FrameType.ERROR and rid is None:
            raise error_from_frame(frame)
        if frame.type not in (FrameType.RESPONSE, FrameType.ERROR):
            raise DecodeError(f"unexpected {frame.type.name} frame from the server")
        if future is None or future.done():
            log.debug("dropping the answer to an unknown or abandoned request %r", rid)
        elif frame.type is FrameType.ERROR:
            future.set_exception(error_from_frame(frame))
        else:
            future.set_result(frame)

    def _fail(self, exc: TransportError) -> None:
        if self._failure is None:
            self._failure = exc
        for future in self._pending.values():
            if not future.done():
                future.set_exception(_fresh(exc))


async def tcp_connect(host: str, port: int, *, config: TcpConfig = TcpConfig(),
                      payload_buffer: PayloadBufferHook | None = None) -> TcpConnection:
    """Connect to a ``TcpServer``; ConnectFailed or TransportTimeout if that is not possible."""
    try:
        async with asyncio.timeout(config.connect_timeout_s):
            sock = await _open_socket(host, port, config)
    except TimeoutError:
        raise TransportTimeout(f"connect to {host}:{port} timed out after {config.connect_timeout_s} s") from None
    except OSError as exc:
        raise ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from exc
    stats = TcpStats(connections_open=1)
    stream = FrameStream(sock, config=config, stats=stats, payload_buffer=payload_buffer)
    connection = TcpConnection(stream, config=config, stats=stats)
    connection._start()
    return connection


async def _open_socket(host: str, port: int, config: TcpConfig) -> socket.socket:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address found for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            configure_socket(sock, config)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error

