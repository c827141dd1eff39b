"""Helpers shared by the socket tests: leak checks, a raw socket client, log waiting, TCP set-up."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from gossamer.transport.errors import DecodeError
from gossamer.transport.frames import (
    PREFIX_BYTES,
    Frame,
    FrameType,
    decode_frame,
    encode_prefix,
    parse_prefix,
)
from gossamer.transport.header import pack_header
from gossamer.transport.limits import Limits
from gossamer.transport.tcp import TcpConfig, TcpConnection, TcpServer, tcp_connect

WAIT_S = 10.0
"""Upper bound on any wait in these tests; only reached when something is broken."""
FAST = TcpConfig(idle_timeout_s=5.0, read_timeout_s=5.0, request_timeout_s=10.0)


def open_fds() -> dict[str, str]:
    """This process's open file descriptors and what they point to."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the fd listdir itself used
            pass
    return fds


class LeakCheck:
    """Snapshot of running tasks and open fds; ``verify()`` fails if either grew since. Only fds
    opened since count: one that closed meanwhile is not a leak (an earlier test's pipe or socket
    that the garbage collector closes during this one; seen in a full run)."""

    def __init__(self) -> None:
        gc.collect()  # what earlier tests left for the collector closes now, not during the test
        self.tasks = asyncio.all_tasks()
        self.fds = open_fds()

    def verify(self) -> None:
        leaked = {t for t in asyncio.all_tasks() - self.tasks if t is not asyncio.current_task()}
        assert not leaked, f"tasks leaked: {leaked}"
        opened = {fd: target for fd, target in open_fds().items() if self.fds.get(fd) != target}
        assert not opened, f"file descriptors leaked: {opened}"


class RawClient:
    """A plain non-blocking socket for sending bytes no well-behaved client would send."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def connect(cls, address: tuple[str, int], *, source: str | None = None) -> RawClient:
        """A connected socket; ``source`` picks the local address (e.g. "127.0.0.2": another host
        on loopback, as far as a server's per-address counting goes)."""
        sock = socket.socket()
        sock.setblocking(False)
        try:
            if source is not None:
                sock.bind((source, 0))
            await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def read_until_eof(self, timeout_s: float = WAIT_S) -> bytes:
        chunks = []
        async with asyncio.timeout(timeout_s):
            while chunk := await self.loop.sock_recv(self.sock, 65536):
                chunks.append(chunk)
        return b"".join(chunks)

    async def read_some(self, timeout_s: float = WAIT_S) -> bytes:
        """The next bytes that arrive (b"" at EOF)."""
        async with asyncio.timeout(timeout_s):
            return await self.loop.sock_recv(self.sock, 65536)

    async def read_frame(self, timeout_s: float = WAIT_S) -> Frame:
        """One whole gossamer frame."""
        data = b""
        async with asyncio.timeout(timeout_s):
            while True:
                if len(data) >= PREFIX_BYTES:
                    _, header_len, payload_len = parse_prefix(data[:PREFIX_BYTES], limits=Limits())
                    end = PREFIX_BYTES + header_len + payload_len
                    if len(data) >= end:
                        return decode_frame(data[:end])
                chunk = await self.loop.sock_recv(self.sock, 65536)
                assert chunk, f"connection closed after {data!r}"
                data += chunk

    async def read_response_head(self, timeout_s: float = WAIT_S) -> bytes:
        """Read until the end of an HTTP response head."""
        data = b""
        async with asyncio.timeout(timeout_s):
            while b"\r\n\r\n" not in data:
                chunk = await self.loop.sock_recv(self.sock, 65536)
                assert chunk, f"connection closed after {data!r}"
                data += chunk
        return data

    async def aclose(self) -> None:
        self.sock.close()


class LogWaiter(logging.Handler):
    """Collects the messages of a logger and sets ``seen`` when one contains ``needle``."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.seen = asyncio.Event()
        self.messages: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.messages.append(record.getMessage())
        if self.needle in record.getMessage():
            self.seen.set()


@contextlib.contextmanager
def log_waiters(logger_name: str) -> Iterator[Callable[[str], LogWaiter]]:
    """Within the block, ``attach(needle)`` hooks a LogWaiter on ``logger_name`` (at DEBUG)."""
    logger = logging.getLogger(logger_name)
    attached: list[LogWaiter] = []

    def attach(needle: str) -> LogWaiter:
        attached.append(LogWaiter(needle))
        logger.addHandler(attached[-1])
        return attached[-1]

    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield attach
    finally:
        logger.setLevel(old_level)
        for waiter in attached:
            logger.removeHandler(waiter)


class TcpNet:
    """Creates TCP servers, connections and raw clients for one test and closes them at its end."""

    def __init__(self) -> None:
        self.closers: list[Callable[[], Awaitable[None]]] = []

    async def server(self, handler, config: TcpConfig = FAST, **kwargs) -> TcpServer:
        server = await TcpServer.create(handler, config=config, **kwargs)
        self.closers.append(server.aclose)
        return server

    async def connect(self, server: TcpServer, config: TcpConfig = FAST) -> TcpConnection:
        conn = await tcp_connect(*server.address, config=config)
        self.closers.append(conn.aclose)
        return conn

    async def raw(self, server, *, source: str | None = None) -> RawClient:
        raw = await RawClient.connect(server.address, source=source)
        self.closers.append(raw.aclose)
        return raw

    async def aclose(self) -> None:
        for close in reversed(self.closers):
            await close()


@contextlib.asynccontextmanager
async def dripping(raw: RawClient, data: bytes, *, every_s: float = 0.05) -> AsyncIterator[None]:
    """Within the block, ``raw`` sends ``data`` one byte every ``every_s`` (20 bytes/s by
    default: each byte well inside any idle or progress timeout of these tests, the message
    never done before its whole-message deadline); the dripping stops when the block ends."""

    async def drip() -> None:
        for byte in data:
            await raw.send(bytes([byte]))
            await asyncio.sleep(every_s)  # the attacker's pace, not a synchronisation

    task = asyncio.create_task(drip())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def frame_head(header: dict, payload_len: int, frame_type: FrameType = FrameType.REQUEST) -> bytes:
    """The prefix and header of a frame announcing ``payload_len`` payload bytes (none follow)."""
    packed = pack_header(header)
    return encode_prefix(frame_type, len(packed), payload_len) + packed


async def echo(frame: Frame, info) -> Frame:
    """A handler answering with the request's ``x`` header and its payload."""
    return Frame(FrameType.RESPONSE, {"echo": frame.header.get("x")}, bytes(frame.payload))


OUTCOMES = ("decoded", "refused")


def outcome(decode: Callable[[], object]) -> str:
    """What a decoder did with some bytes: "decoded", or "refused" with a DecodeError. Any other
    exception propagates and fails the calling test: that is the contract fuzz tests check."""
    try:
        decode()
    except DecodeError:
        return "refused"
    return "decoded"
