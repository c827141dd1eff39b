"""``TcpServer``: answers REQUEST frames with a handler and feeds ONEWAY frames through a bounded
queue. Against peers that never authenticate, every header passes the ``gate`` before its payload
is allocated, frames have deadlines, payloads a shared budget and connections fair slots per address
(``FairSlots``; README.md, "The server")."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from gossamer.transport.errors import DecodeError, Overloaded, TransportError, TransportTimeout
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.logs import ThrottledLog
from gossamer.transport.slots import ByteBudget, FairSlots, address_key
from gossamer.transport.tcp_stream import (
    FrameGate,
    FrameStream,
    PayloadBufferHook,
    TcpConfig,
    TcpStats,
    configure_socket,
    error_frame,
)

log = logging.getLogger(__name__)

ACCEPT_BACKOFF_S = 0.05
"""Pause after a failed accept (e.g. EMFILE) so that the loop does not spin."""


class HandlerError(Exception):
    """Raised by a handler to refuse a request; its message is sent to the peer."""


@dataclass(frozen=True)
class ConnectionInfo:
    """Which connection a frame arrived on."""

    connection_id: int
    peer: tuple[str, int]


Handler = Callable[[Frame, ConnectionInfo], Awaitable[Frame | None]]


class _Held:
    """The budget bytes of one frame, given back once, by whichever comes first: its handler
    finishing, or its task ending (even if cancelled before it started)."""

    def __init__(self, budget: ByteBudget, nbytes: int) -> None:
        self._budget = budget
        self._nbytes = nbytes

    def release(self) -> None:
        nbytes, self._nbytes = self._nbytes, 0
        if nbytes:
            self._budget.release(nbytes)


class _Connection:
    """Server-side state of one accepted socket: its stream, tasks, queue and request slots."""

    def __init__(self, info: ConnectionInfo, stream: FrameStream, config: TcpConfig) -> None:
        self.info = info
        self.stream = stream
        self.queue: asyncio.Queue[Frame] = asyncio.Queue(maxsize=config.queue_maxsize)
        self.slots = asyncio.Semaphore(config.max_inflight_requests)
        self.tasks: set[asyncio.Task[None]] = set()
        self.consumer: asyncio.Task[None] | None = None
        self.handling_oneway = False

    @property
    def busy(self) -> bool:
        return bool(self.tasks) or self.handling_oneway or not self.queue.empty()

    def spawn(self, coro: Coroutine[Any, Any, None], on_done: Callable[[], None]) -> None:
        """Run ``coro``; ``on_done`` runs when it ends, even if it is cancelled before it starts."""
        task = asyncio.create_task(coro, name=f"tcp-request-{self.info.connection_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda _: on_done())

    async def stop_tasks(self) -> list[Frame]:
        """Cancel and await every task; the one-way frames still queued, never handled."""
        tasks = [*self.tasks, *([self.consumer] if self.consumer else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        left = []
        while not self.queue.empty():
            left.append(self.queue.get_nowait())
        return left


class TcpServer:
    """Accepts connections and answers their frames with ``handler``; see the module docstring."""

    def __init__(self, handler: Handler, sock: socket.socket, *, config: TcpConfig,
                 payload_buffer: PayloadBufferHook | None, gate: FrameGate | None) -> None:
        self._handler = handler
        self._sock = sock
        self._config = config
        self._payload_buffer = payload_buffer
        self._gate = gate
        self.budget = ByteBudget(config.max_inflight_payload_bytes, what="receive")
        self.log = ThrottledLog(log)
        self._slots: FairSlots[int] = FairSlots(config.max_connections, config.max_connections_per_address)
        self._serving: dict[int, _Connection] = {}  # by connection id, while its stream is served
        self.refused_connections = 0
        self._stats = TcpStats()
        self._connections: dict[int, asyncio.Task[None]] = {}
        self._rejects: set[asyncio.Task[None]] = set()
        self._next_id = 0
        self._accept_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def create(cls, handler: Handler, *, host: str = "127.0.0.1", port: int = 0,
                     config: TcpConfig = TcpConfig(), payload_buffer: PayloadBufferHook | None = None,
                     gate: FrameGate | None = None) -> TcpServer:
        """Listen on ``host:port`` (port 0: any free port) and start accepting; ``gate`` sees every
        frame's header before its payload is read (see the module docstring)."""
        sock = await _listen(host, port, config)
        server = cls(handler, sock, config=config, payload_buffer=payload_buffer, gate=gate)
        server._accept_task = asyncio.create_task(server._accept_loop(), name=f"tcp-accept-{port}")
        return server

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    @property
    def evicted_connections(self) -> int:
        """Connections closed so far to give their slot to an address holding fewer (``FairSlots``)."""
        return self._slots.evictions

    @property
    def stats(self) -> TcpStats:
        """A snapshot of the counters."""
        return replace(self._stats)

    async def aclose(self) -> None:
        """Stop accepting, cancel and await every task, close every socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        tasks = [task for task in (self._accept_task, *self._connections.values(), *self._rejects) if task]
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._sock.close()

    # --- accepting --------------------------------------------------------------------------

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(self._sock)
            except OSError as exc:
                log.warning("accept on %s failed: %s", self.address, exc)
                await asyncio.sleep(ACCEPT_BACKOFF_S)
                continue
            configure_socket(sock, self._config)
            info = ConnectionInfo(self._next_id, tuple(addr[:2]))
            self._next_id += 1
            admission = self._slots.admit(address_key(addr), info.connection_id, busy=self._busy)
            if not admission.admitted:
                self._reject(sock, f"overloaded: {admission.refused}")
                continue
            if admission.evicted is not None:
                self._evict(admission.evicted)
            self._admit(sock, info)

    def _busy(self, connection_id: int) -> bool:
        conn = self._serving.get(connection_id)
        return conn is not None and conn.busy

    def _evict(self, connection_id: int) -> None:
        """Close a connection whose slot went to an address holding fewer (its task ends it)."""
        task = self._connections.get(connection_id)
        if task is not None:
            self.log.info("closing connection %d: its slot went to an address holding fewer", connection_id)
            task.cancel()

    def _admit(self, sock: socket.socket, info: ConnectionInfo) -> None:
        task = asyncio.create_task(self._serve(sock, info), name=f"tcp-conn-{info.connection_id}")
        self._connections[info.connection_id] = task

        def ended(_: asyncio.Task[None]) -> None:
            self._connections.pop(info.connection_id, None)
            self._slots.release(info.connection_id)
            sock.close()  # a no-op unless the task was cancelled (evicted) before it started

        task.add_done_callback(ended)

    def _reject(self, sock: socket.socket, reason: str) -> None:
        self.refused_connections += 1
        if len(self._rejects) >= self._config.max_connections:
            sock.close()
            return
        task = asyncio.create_task(self._send_overloaded(sock, reason), name="tcp-reject")
        self._rejects.add(task)
        task.add_done_callback(self._rejects.discard)

    async def _send_overloaded(self, sock: socket.socket, reason: str) -> None:
        stream = FrameStream(sock, config=self._config, stats=self._stats)
        try:
            await stream.write_frame(error_frame(reason, code="overloaded"))
            await stream.drain(self._config.read_timeout_s)
        except TransportError as exc:
            log.debug("could not refuse a connection cleanly: %s", exc)
        finally:
            stream.close()

    # --- serving one connection -------------------------------------------------------------

    async def _serve(self, sock: socket.socket, info: ConnectionInfo) -> None:
        stream = FrameStream(sock, config=self._config, stats=self._stats, payload_buffer=self._payload_buffer,
                             gate=self._gate, budget=self.budget)
        conn = _Connection(info, stream, self._config)
        self._serving[info.connection_id] = conn
        self._stats.connections_open += 1
        try:
            await self._read_loop(conn)
        except (DecodeError, HandlerError, Overloaded) as exc:
            code = _refusal_code(exc)
            self.log.info("closing connection %d from %s: %s: %s", info.connection_id, info.peer, code, exc)
            self._release_all(await conn.stop_tasks())
            await self._send_final_error(conn, error_frame(str(exc), code=code))
        except TransportError as exc:
            self.log.info("closing connection %d from %s: %s", info.connection_id, info.peer, exc)
        except Exception:
            self.log.exception("connection %d from %s failed", info.connection_id, info.peer)
        finally:
            stream.abort()
            try:
                self._release_all(await conn.stop_tasks())
            finally:
                stream.close()
                self._stats.connections_open -= 1
                self._serving.pop(info.connection_id, None)

    def _release_all(self, frames: list[Frame]) -> None:
        for frame in frames:
            self.budget.release(self._held(frame))

    def _held(self, frame: Frame) -> int:
        return memoryview(frame.payload).nbytes if frame.payload else 0

    async def _send_final_error(self, conn: _Connection, frame: Frame) -> None:
        try:
            await conn.stream.write_frame(frame)
            await conn.stream.drain(self._config.read_timeout_s)
        except TransportError as exc:
            log.debug("could not send the final error to connection %d: %s", conn.info.connection_id, exc)

    async def _read_loop(self, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        head_by: float | None = loop.time() + self._config.first_frame_timeout_s  # the first frame's head
        wait_s = self._config.first_frame_timeout_s
        while True:
            try:
                if not await conn.stream.wait_for_frame(wait_s):
                    return
            except TransportTimeout:
                if conn.busy:
                    continue
                raise
            frame = await conn.stream.read_frame(head_by=head_by)
            if frame is None:
                return
            head_by, wait_s = None, self._config.idle_timeout_s
            await self._dispatch(conn, frame)
            del frame  # do not keep this payload alive while the next one is being received

    async def _dispatch(self, conn: _Connection, frame: Frame) -> None:
        """Hand ``frame`` on; its budget bytes go with it, or are given back here."""
        held = self._held(frame)
        try:
            if frame.type is FrameType.REQUEST:
                await conn.slots.acquire()
                ticket = _Held(self.budget, held)
                held = 0
                conn.spawn(self._answer(conn, frame, ticket), on_done=functools.partial(self._finished, conn, ticket))
            elif frame.type is FrameType.ONEWAY:
                if conn.consumer is None:
                    conn.consumer = asyncio.create_task(self._consume(conn),
                                                        name=f"tcp-oneway-{conn.info.connection_id}")
                await conn.queue.put(frame)
                held = 0
                self._stats.oneway_queue_peak = max(self._stats.oneway_queue_peak, conn.queue.qsize())
            else:
                raise DecodeError(f"unexpected {frame.type.name} frame from a client")
        finally:
            self.budget.release(held)

    @staticmethod
    def _finished(conn: _Connection, ticket: _Held) -> None:
        conn.slots.release()
        ticket.release()

    async def _answer(self, conn: _Connection, frame: Frame, ticket: _Held) -> None:
        rid = frame.header.get("rid")
        try:
            reply = await self._reply(frame, conn.info, rid)
            del frame
            try:
                await conn.stream.write_frame(reply)
            except (TypeError, ValueError):
                self.log.exception("handler returned a frame that cannot be encoded")
                await conn.stream.write_frame(error_frame("internal error", code="internal", rid=rid))
        except TransportError as exc:
            log.debug("could not answer on connection %d: %s", conn.info.connection_id, exc)
            conn.stream.abort()
        finally:
            ticket.release()  # the reply (which may view the request's payload) is sent

    async def _reply(self, frame: Frame, info: ConnectionInfo, rid: Any) -> Frame:
        try:
            reply = await self._handler(frame, info)
        except HandlerError as exc:
            return error_frame(str(exc), code="handler", rid=rid)
        except DecodeError as exc:
            return error_frame(str(exc), code="decode", rid=rid)
        except Exception:
            self.log.exception("handler failed on a request from %s", info.peer)
            return error_frame("internal error", code="internal", rid=rid)
        if reply is None:
            return Frame(FrameType.RESPONSE, {"rid": rid})
        return Frame(FrameType.RESPONSE, {**reply.header, "rid": rid}, reply.payload)

    async def _consume(self, conn: _Connection) -> None:
        while True:
            frame = await conn.queue.get()
            conn.handling_oneway = True
            try:
                await self._handler(frame, conn.info)
            except HandlerError as exc:
                self.log.info("one-way frame from %s refused: %s", conn.info.peer, exc)
            except Exception:
                self.log.exception("handler failed on a one-way frame from %s", conn.info.peer)
            finally:
                conn.handling_oneway = False
                self.budget.release(self._held(frame))
                del frame


def _refusal_code(exc: Exception) -> str:
    """The ERROR frame code of a frame the server refused before handling it."""
    if isinstance(exc, DecodeError):
        return "decode"
    return "overloaded" if isinstance(exc, Overloaded) else "refused"


async def _listen(host: str, port: int, config: TcpConfig) -> socket.socket:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        sock = socket.create_server(infos[0][4], family=infos[0][0], backlog=max(128, config.max_connections))
    except OSError as exc:
        raise TransportError(f"cannot listen on {host}:{port}: {exc}") from exc
    configure_socket(sock, config)
    return sock
