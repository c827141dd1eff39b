"""HTTP data plane: ``HttpConfig`` and what ``http_server`` and ``http_client`` share: reading a body
of known length into one preallocated buffer, JSON decoding with caps. Bodies are never joined
from pieces (README.md, "HTTP")."""

from __future__ import annotations

import asyncio
import json
import math
import traceback
from dataclasses import dataclass
from typing import Any

import aiohttp

from gossamer.transport.errors import ConnectionClosed, DecodeError, TransportTimeout
from gossamer.transport.frames import allocate_buffer
from gossamer.transport.limits import DEFAULT_LIMITS, Limits


@dataclass(frozen=True, kw_only=True)
class HttpConfig:
    """Caps and deadlines of the HTTP server and client.

    Attributes:
        limits: caps applied when decoding bodies (safetensors headers, tensor counts, ...).
        max_body_bytes: largest body read (request bodies on the server, responses on the client).
        max_json_bytes: largest JSON body read.
        header_timeout_s: the request line and headers must arrive within this after the
            connection opens or after the previous response (slowloris protection): a server
            closes a keep-alive connection idle this long. The client gives up its own idle
            connections at half of it (``client_keepalive_s``), so it never sends on one that
            a server with the same setting is closing.
        idle_timeout_s: most time without a byte while a body is received (or sent by
            ``stream_tensors``); also the client's per-read deadline.
        request_timeout_s: deadline of one whole request (server: the handler; client: the call).
        connect_timeout_s: deadline for a client to connect.
        max_connections: most connections a server holds (beyond: 503 and close), and most
            connections a client keeps open.
        max_connections_per_address: most connections a server holds from one IPv4 address or
            IPv6 /64 (beyond: 503 and close), so one host cannot take every slot.
        max_inflight_body_bytes: most request-body bytes a server holds at once, over all
            requests, from the moment a body is admitted until its handler ends (beyond: 503).
        min_body_rate_bytes_per_s: a request body of n bytes must arrive whole within
            ``idle_timeout_s + n / min_body_rate_bytes_per_s`` (a whole-body deadline: a peer
            dripping one byte per idle period is cut all the same).
        lingering_s: after answering a request whose body was not read (refused before it),
            how long the server discards what the client still sends before closing.
        chunk_bytes: slice size of streamed bodies and size of aiohttp's read buffers.
        shutdown_timeout_s: how long ``HttpServer.aclose`` lets running handlers finish.
    """

    limits: Limits = DEFAULT_LIMITS
    max_body_bytes: int = 4 << 30
    max_json_bytes: int = 1 << 20
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_connections: int = 256
    max_connections_per_address: int = 32
    max_inflight_body_bytes: int = 1 << 30
    min_body_rate_bytes_per_s: int = 128 << 10
    lingering_s: float = 2.0
    chunk_bytes: int = 1 << 20
    shutdown_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.limits, Limits):
            raise TypeError(f"HttpConfig.limits must be a Limits, got {type(self.limits).__name__}")
        for name in ("header_timeout_s", "idle_timeout_s", "request_timeout_s", "connect_timeout_s",
                     "shutdown_timeout_s", "lingering_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"HttpConfig.{name} must be a positive finite number, got {value!r}")
        for name in ("max_body_bytes", "max_json_bytes", "max_connections", "max_connections_per_address",
                     "max_inflight_body_bytes", "min_body_rate_bytes_per_s", "chunk_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"HttpConfig.{name} must be a positive int, got {value!r}")

    @property
    def client_keepalive_s(self) -> float:
        """How long the client keeps an idle connection for reuse: half of ``header_timeout_s``.
        aiohttp's own default (15 s) outlived the server's 10 s, so a request sent after a 10-15 s
        lull (a round's deadline, say) could go out on a connection the server was closing and be
        lost ("Server disconnected", "Connection reset by peer")."""
        return self.header_timeout_s / 2

    def body_deadline_s(self, nbytes: int) -> float:
        """How long a body of ``nbytes`` may take to arrive whole."""
        return self.idle_timeout_s + nbytes / self.min_body_rate_bytes_per_s


async def read_exactly(content: aiohttp.StreamReader, nbytes: int, *, idle_timeout_s: float,
                       deadline_s: float | None = None) -> bytearray | memoryview:
    """Read exactly ``nbytes`` of a body into one new buffer; at most one copy per byte.

    ConnectionClosed if the body ends early, TransportTimeout after ``idle_timeout_s`` without a
    byte or once the whole body took ``deadline_s``, DecodeError if the peer sends more than it
    announced. On any failure the buffer is dropped before the error leaves (a traceback must
    not keep a body's memory alive until the garbage collector happens to run).
    """
    buffer = allocate_buffer(nbytes)
    try:
        async with asyncio.timeout(deadline_s):
            await _fill(content, memoryview(buffer).cast("B"), idle_timeout_s)
    except BaseException as exc:
        del buffer
        drop_frames(exc)
        if isinstance(exc, TimeoutError):
            raise TransportTimeout(f"body of {nbytes} bytes not complete within its deadline of "
                                   f"{deadline_s} s") from None
        raise
    return buffer


def drop_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames in ``exc``'s tracebacks (and its causes' and
    contexts'), so that an error kept for logging holds no buffer those frames were using."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        todo.extend((current.__cause__, current.__context__))


async def _fill(content: aiohttp.StreamReader, view: memoryview, idle_timeout_s: float) -> None:
    nbytes, done = view.nbytes, 0
    while done < nbytes:
        try:
            async with asyncio.timeout(idle_timeout_s):
                chunk = await content.readany()
        except TimeoutError:
            raise TransportTimeout(f"body stalled after {done} of {nbytes} bytes "
                                   f"(idle_timeout_s={idle_timeout_s})") from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError) as exc:
            raise ConnectionClosed(f"body cut after {done} of {nbytes} bytes: {exc}") from exc
        if not chunk:
            raise ConnectionClosed(f"body ended after {done} of {nbytes} bytes")
        if len(chunk) > nbytes - done:
            raise DecodeError(f"body is longer than its Content-Length of {nbytes} bytes")
        view[done:done + len(chunk)] = chunk
        done += len(chunk)


def parse_json(body: bytes | bytearray | memoryview) -> Any:
    """Decode a JSON body; DecodeError for bad UTF-8, bad JSON or absurd nesting."""
    try:
        return json.loads(bytes(body))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from exc
