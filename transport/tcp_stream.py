"""``FrameStream``: whole frames over one raw non-blocking socket, the core of the TCP server and
client. Large payloads land straight in their final buffer, allocated only after the limits, the
gate and the byte budget passed; every frame has a whole-frame deadline (README.md, "The stream")."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gossamer.transport.errors import ConnectionClosed, TransportTimeout
from gossamer.transport.frames import (
    PREFIX_BYTES,
    Frame,
    FrameType,
    allocate_buffer,
    decode_header,
    encode_frame,
    parse_prefix,
)
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from gossamer.transport.slots import ByteBudget

READ_AHEAD_BYTES = 64 * 1024
"""Size of the read-ahead buffer; reads of at least this size bypass it."""
SMALL_FRAME_BYTES = 64 * 1024
"""Frames up to this size are joined into one buffer and sent with one call."""

PayloadBufferHook = Callable[[int], Any]
"""``payload_buffer(nbytes)`` returns a writable buffer of at least ``nbytes`` for a payload."""
FrameGate = Callable[[FrameType, dict[str, Any], int], None]
"""``gate(type, header, payload_len)`` runs once a frame's header is in, before its payload is
allocated or read; it refuses the frame by raising (the stream is then unusable: close it)."""


@dataclass(frozen=True, kw_only=True)
class TcpConfig:
    """Caps and deadlines of the TCP server and client.

    Attributes:
        limits: caps on every length a peer can claim in a frame.
        connect_timeout_s: deadline for a client to connect.
        first_frame_timeout_s: how long a new server connection may take to send the prefix and
            header of its first frame (a socket that never talks, or drips, is cut this soon).
        idle_timeout_s: how long a server connection may wait for the first byte of its next
            frame while no request of it is being handled.
        read_timeout_s: most time without progress once a frame has started (either direction):
            a peer that stalls mid-frame, or stops reading what we send, is cut.
        min_rate_bytes_per_s: a received frame of n bytes must be whole within
            ``read_timeout_s + n / min_rate_bytes_per_s`` of its first byte.
        request_timeout_s: default deadline of a whole request (send + response).
        max_connections: most connections a server holds; beyond, new ones get an "overloaded"
            ERROR frame and are closed.
        max_connections_per_address: most connections a server holds from one IPv4 address or
            IPv6 /64; beyond, the same "overloaded" refusal.
        max_inflight_payload_bytes: most payload bytes a server holds at once over all its
            connections, from allocation until the frame's handler is done; a frame that would
            pass it is refused ("overloaded") and its connection closed.
        max_inflight_requests: most requests of one connection handled concurrently; at the cap
            the server stops reading that socket.
        queue_maxsize: one-way frames of one connection waiting for the handler; when full the
            server stops reading that socket (TCP backpressure).
        socket_buffer_bytes: SO_SNDBUF / SO_RCVBUF of every socket; 0 (the default) leaves them
            to the kernel's autotuning, which measured faster on loopback than any fixed size
            (setting them turns autotuning off).
        write_slice_bytes: most bytes handed to one send call.
    """

    limits: Limits = DEFAULT_LIMITS
    connect_timeout_s: float = 10.0
    first_frame_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    read_timeout_s: float = 30.0
    min_rate_bytes_per_s: int = 128 << 10
    request_timeout_s: float = 60.0
    max_connections: int = 256
    max_connections_per_address: int = 32
    max_inflight_payload_bytes: int = 1 << 30
    max_inflight_requests: int = 16
    queue_maxsize: int = 16
    socket_buffer_bytes: int = 0
    write_slice_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.limits, Limits):
            raise TypeError(f"TcpConfig.limits must be a Limits, got {type(self.limits).__name__}")
        for name in ("connect_timeout_s", "first_frame_timeout_s", "idle_timeout_s", "read_timeout_s",
                     "request_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"TcpConfig.{name} must be a positive finite number, got {value!r}")
        for name in ("max_connections", "max_connections_per_address", "max_inflight_payload_bytes",
                     "min_rate_bytes_per_s", "max_inflight_requests", "queue_maxsize", "write_slice_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TcpConfig.{name} must be a positive int, got {value!r}")
        if isinstance(self.socket_buffer_bytes, bool) or not isinstance(self.socket_buffer_bytes, int) \
                or self.socket_buffer_bytes < 0:
            raise ValueError(f"TcpConfig.socket_buffer_bytes must be an int >= 0, got {self.socket_buffer_bytes!r}")


@dataclass
class TcpStats:
    """Counters of a server (all its connections) or of one client connection."""

    connections_open: int = 0
    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    oneway_queue_peak: int = 0


def configure_socket(sock: socket.socket, config: TcpConfig) -> None:
    """Non-blocking, TCP_NODELAY, and fixed kernel buffers only when configured (before connect/listen)."""
    sock.setblocking(False)
    if config.socket_buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, config.socket_buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, config.socket_buffer_bytes)
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def error_frame(message: str, *, code: str, rid: Any = None) -> Frame:
    """An ERROR frame; ``code`` is one of "handler", "decode", "internal", "overloaded"."""
    header: dict[str, Any] = {"code": code, "message": message}
    if rid is not None:
        header["rid"] = rid
    return Frame(FrameType.ERROR, header)


class FrameStream:
    """Whole frames in and out of one connected non-blocking socket.

    One reader at a time; writers are serialised by a lock. ``abort()`` wakes every pending read
    and write; ``close()`` releases the socket and must only be called once no task awaits on it.
    """

    def __init__(self, sock: socket.socket, *, config: TcpConfig, stats: TcpStats,
                 payload_buffer: PayloadBufferHook | None = None, gate: FrameGate | None = None,
                 budget: ByteBudget | None = None) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._limits = config.limits
        self._progress_s = config.read_timeout_s
        self._min_rate = config.min_rate_bytes_per_s
        self._gate = gate
        self._budget = budget
        self._frame_start = 0.0
        self._frame_deadline = math.inf
        self._slice_bytes = config.write_slice_bytes
        self._stats = stats
        self._payload_buffer = payload_buffer
        self._ahead = memoryview(bytearray(READ_AHEAD_BYTES))
        self._start = 0
        self._end = 0
        self._write_lock = asyncio.Lock()
        self._broken = False

    @property
    def broken(self) -> bool:
        """True once the stream was aborted or a write failed part way."""
        return self._broken

    # --- reading ----------------------------------------------------------------------------

    async def wait_for_frame(self, timeout_s: float | None) -> bool:
        """Wait for the first byte of the next frame; False on a clean EOF between frames."""
        if self._end > self._start:
            return True
        try:
            async with asyncio.timeout(timeout_s):
                got = await self._loop.sock_recv_into(self._sock, self._ahead)
        except TimeoutError:
            raise TransportTimeout(f"no frame within idle_timeout_s={timeout_s}") from None
        except OSError as exc:
            raise ConnectionClosed(f"connection lost between frames: {exc}") from exc
        self._start, self._end = 0, got
        self._stats.bytes_in += got
        return got > 0

    async def read_frame(self, *, head_by: float | None = None) -> Frame | None:
        """Read one whole frame; None on a clean EOF before its first byte. ``head_by`` (a loop
        time) is when its prefix and header must be in at the latest (a server gives a new
        connection's first frame ``first_frame_timeout_s``). With a budget, the caller owns the
        payload's bytes in it and gives them back when done."""
        if not await self.wait_for_frame(None):
            return None
        self._frame_start = self._loop.time()
        self._frame_deadline = min(self._frame_start + self._progress_s, math.inf if head_by is None else head_by)
        try:
            async with asyncio.timeout_at(self._frame_deadline) as deadline:
                frame = await self._read_parts(deadline, head_by)
        except TimeoutError:
            if self._loop.time() >= self._frame_deadline:
                raise TransportTimeout(f"frame not whole within its deadline (read_timeout_s={self._progress_s} + "
                                       f"bytes / min_rate_bytes_per_s={self._min_rate}, the first frame's head "
                                       "within first_frame_timeout_s)") from None
            raise TransportTimeout(f"peer stalled mid-frame: no bytes for read_timeout_s={self._progress_s}") from None
        self._stats.frames_in += 1
        return frame

    async def _read_parts(self, deadline: asyncio.Timeout, head_by: float | None) -> Frame:
        prefix = bytearray(PREFIX_BYTES)
        await self._read_into(memoryview(prefix), "prefix", deadline)
        frame_type, header_len, payload_len = parse_prefix(prefix, limits=self._limits)
        whole = self._frame_start + self._progress_s + (PREFIX_BYTES + header_len + payload_len) / self._min_rate
        self._frame_deadline = whole if head_by is None else min(whole, head_by)
        deadline.reschedule(min(self._loop.time() + self._progress_s, self._frame_deadline))
        header_bytes = bytearray(header_len)
        await self._read_into(memoryview(header_bytes), "header", deadline)
        header = decode_header(header_bytes, limits=self._limits)
        self._frame_deadline = whole
        deadline.reschedule(min(self._loop.time() + self._progress_s, self._frame_deadline))
        if self._gate is not None:
            self._gate(frame_type, header, payload_len)
        if payload_len == 0:
            return Frame(frame_type, header, b"")
        if self._budget is not None:
            self._budget.reserve(payload_len)  # Overloaded: nothing allocated
        try:
            payload = self._allocate(payload_len)
            await self._read_into(memoryview(payload).cast("B")[:payload_len], "payload", deadline)
        except BaseException:
            payload = None
            if self._budget is not None:
                self._budget.release(payload_len)
            raise
        return Frame(frame_type, header, payload)

    def _allocate(self, nbytes: int) -> Any:
        if self._payload_buffer is None:
            return allocate_buffer(nbytes)
        view = memoryview(self._payload_buffer(nbytes)).cast("B")
        if view.readonly or view.nbytes < nbytes:
            raise ValueError(f"payload_buffer returned a read-only or short buffer for {nbytes} bytes")
        return view[:nbytes]

    async def _read_into(self, target: memoryview, what: str, deadline: asyncio.Timeout) -> None:
        total = target.nbytes
        done = self._take(target)
        while done < total:
            if total - done < READ_AHEAD_BYTES:
                self._start, self._end = 0, await self._recv(self._ahead, what, done, total)
                done += self._take(target[done:])
            else:
                done += await self._recv(target[done:], what, done, total)
            deadline.reschedule(min(self._loop.time() + self._progress_s, self._frame_deadline))

    def _take(self, target: memoryview) -> int:
        count = min(self._end - self._start, target.nbytes)
        target[:count] = self._ahead[self._start:self._start + count]
        self._start += count
        return count

    async def _recv(self, view: memoryview, what: str, done: int, total: int) -> int:
        try:
            got = await self._loop.sock_recv_into(self._sock, view)
        except OSError as exc:
            raise ConnectionClosed(f"connection lost after {done} of {total} {what} bytes: {exc}") from exc
        if got == 0:
            raise ConnectionClosed(f"peer closed the connection after {done} of {total} {what} bytes")
        self._stats.bytes_in += got
        return got

    # --- writing ----------------------------------------------------------------------------

    async def write_frame(self, frame: Frame) -> None:
        """Send one frame; TypeError/ValueError (before any byte) if it cannot be encoded."""
        parts = encode_frame(frame)
        if len(parts) > 1 and sum(memoryview(part).nbytes for part in parts) <= SMALL_FRAME_BYTES:
            parts = [b"".join(parts)]
        async with self._write_lock:
            if self._broken:
                raise ConnectionClosed("connection is closed")
            try:
                await self._send_parts(parts)
            except BaseException:
                self.abort()  # a partial frame is on the wire: nothing can follow it
                raise
        self._stats.frames_out += 1

    async def _send_parts(self, parts: list[bytes | memoryview]) -> None:
        try:
            async with asyncio.timeout(None) as deadline:
                for part in parts:
                    view = memoryview(part)
                    for offset in range(0, view.nbytes, self._slice_bytes):
                        deadline.reschedule(self._loop.time() + self._progress_s)
                        piece = view[offset:offset + self._slice_bytes]
                        await self._loop.sock_sendall(self._sock, piece)
                        self._stats.bytes_out += piece.nbytes
        except TimeoutError:
            raise TransportTimeout(f"peer stopped reading: no progress for read_timeout_s={self._progress_s}") from None
        except OSError as exc:
            raise ConnectionClosed(f"connection lost while sending: {exc}") from exc

    async def wait_writers(self, timeout_s: float) -> None:
        """Wait (bounded) until no task is inside ``write_frame``; used before ``close()``."""
        try:
            async with asyncio.timeout(timeout_s), self._write_lock:
                pass
        except TimeoutError:
            raise TransportTimeout(f"a writer did not finish within {timeout_s} s") from None

    # --- ending -----------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Half-close our side, then discard what the peer still sends until EOF or ``timeout_s``.

        Used after sending a final ERROR frame, so that closing does not reset the connection
        (and destroy that frame) while the peer's unread bytes sit in our receive buffer.
        """
        try:
            self._sock.shutdown(socket.SHUT_WR)
            async with asyncio.timeout(timeout_s):
                while await self._loop.sock_recv_into(self._sock, self._ahead):
                    pass
        except (TimeoutError, OSError):
            return  # best effort: the connection is being dropped either way
        finally:
            self._start = self._end = 0

    def abort(self) -> None:
        """Mark the stream broken and shut the socket down, waking every pending read and write."""
        self._broken = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more: nothing to wake

    def close(self) -> None:
        """Release the socket (idempotent)."""
        self._broken = True
        self._sock.close()
