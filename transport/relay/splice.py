"""Zero-copy splicing of two connected sockets through kernel pipes (Linux ``os.splice``): a relayed
byte never enters Python, under the copy path's pace, flow control and half-close rules;
``usable`` says where it applies (README.md, "Splicing")."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from gossamer.transport.logs import ThrottledLog

if TYPE_CHECKING:
    from gossamer.transport.relay.wire import Pace, Pipe

log = ThrottledLog(logging.getLogger(__name__))

PIPE_BYTES = 1 << 20  # kernel pipe capacity asked for (the default 64 KiB means 16x the syscalls)
PACED_BYTES = 256 * 1024  # most one read moves under a cap: what the copy path reads at once (wire.CHUNK_BYTES)
READ_BUDGET_BYTES = 8 << 20  # most one way moves per wake-up, so one busy way cannot starve the loop
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_GONE = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN, errno.ETIMEDOUT, errno.EHOSTUNREACH)


def usable(*transports: asyncio.BaseTransport | None) -> bool:
    """Whether ``transports`` can be spliced now: ``os.splice`` exists, each is an open TCP socket
    transport with nothing left in its write buffer."""
    if not hasattr(os, "splice"):
        return False
    for transport in transports:
        if not isinstance(transport, asyncio.Transport) or transport.is_closing() \
                or transport.get_write_buffer_size() != 0:
            return False
        sock = transport.get_extra_info("socket")
        if sock is None or sock.type != socket.SOCK_STREAM or transport.get_extra_info("sslcontext") is not None:
            return False
    return True


class _Way:
    """One direction: ``source`` socket -> kernel pipe -> ``sink`` socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, source: socket.socket, sink: socket.socket, pace: Pace,
                 prefix: bytes, source_ended: bool, on_end: Callable[[], None], on_fail: Callable[[str], None]) -> None:
        self._loop = loop
        self._source, self._sink = source, sink
        self._pace = pace
        self._prefix = memoryview(prefix)
        self._ended = source_ended  # the source sent its end of stream
        self._on_end, self._on_fail = on_end, on_fail
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # a user over its pipe-buffer quota keeps the default
            fcntl.fcntl(self._w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._read_bytes = PIPE_BYTES if pace.rate <= 0 else PACED_BYTES  # a capped way overshoots no more than copying
        self._in_pipe = 0  # bytes read from the source not yet written to the sink
        self._reading = self._writing = self._paced = self._stopped = False
        self.done = False  # the end of stream went out

    def start(self) -> None:
        delay = self._pace.debit(len(self._prefix))  # bytes held before the pair count like any others
        if delay > 0:
            self._paced = True
            self._loop.call_later(delay, self._unpace)
        self._on_writable()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._set_reading(False)
        self._set_writing(False)
        for fd in (self._r, self._w):
            os.close(fd)

    def _on_readable(self) -> None:
        budget = READ_BUDGET_BYTES
        while budget > 0 and not self._stopped:
            try:
                moved = os.splice(self._source.fileno(), self._w, self._read_bytes, flags=_FLAGS)
            except BlockingIOError:
                return  # nothing more to read now
            except OSError as exc:
                self._fail(exc)
                return
            if moved == 0:
                self._ended = True
                self._set_reading(False)
                self._on_writable()
                return
            self._in_pipe += moved
            delay = self._pace.debit(moved)
            if delay > 0:  # the pause runs from now, whether or not the sink takes the chunk at once
                self._paced = True
                self._loop.call_later(delay, self._unpace)
            if not self._drain():
                self._set_reading(False)
                self._set_writing(True)
                return
            if self._paced:
                self._set_reading(False)
                return
            budget -= moved

    def _on_writable(self) -> None:
        if self._stopped:
            return
        if not self._drain():
            self._set_writing(True)
            return
        self._set_writing(False)
        if self._ended:
            if not self.done:
                self.done = True
                self._shutdown_sink()
            return
        self._set_reading(not self._paced)

    def _unpace(self) -> None:
        self._paced = False
        if not self._stopped and not self._writing and not self._ended:
            self._set_reading(True)

    def _drain(self) -> bool:
        """Write the prefix, then what the kernel pipe holds; False when the sink is full."""
        try:
            while self._prefix:
                self._prefix = self._prefix[self._sink.send(self._prefix):]
            while self._in_pipe:
                self._in_pipe -= os.splice(self._r, self._sink.fileno(), self._in_pipe, flags=_FLAGS)
        except BlockingIOError:
            return False
        except OSError as exc:
            self._fail(exc)
            return False
        return True

    def _shutdown_sink(self) -> None:
        try:
            self._sink.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._fail(exc)
            return
        self._on_end()

    def _fail(self, exc: OSError) -> None:
        if exc.errno not in _GONE:
            log.warning("relay splice failed: %r", exc)
        self._on_fail(str(exc))

    def _set_reading(self, on: bool) -> None:
        on = on and not self._stopped
        if on != self._reading:
            self._reading = on
            if on:
                self._loop.add_reader(self._source.fileno(), self._on_readable)
            else:
                self._loop.remove_reader(self._source.fileno())

    def _set_writing(self, on: bool) -> None:
        on = on and not self._stopped
        if on != self._writing:
            self._writing = on
            if on:
                self._loop.add_writer(self._sink.fileno(), self._on_writable)
            else:
                self._loop.remove_writer(self._sink.fileno())


class Splice:
    """Two paired ``Pipe`` ends spliced both ways; see the module docstring. ``stop`` is idempotent."""

    def __init__(self, a: Pipe, b: Pipe) -> None:
        self._ends = (a, b)
        self._socks: list[socket.socket] = []
        self._ways: list[_Way] = []
        self._stopped = False

    @classmethod
    def start(cls, a: Pipe, b: Pipe, *, held: tuple[bytes, bytes], ended: tuple[bool, bool]) -> Splice:
        """Take over ``a`` and ``b`` (``usable`` said yes); ``held``: bytes each end read before the
        pair, ``ended``: whether each end's peer already half-closed. OSError (out of descriptors)
        with nothing left behind."""
        splice = cls(a, b)
        try:
            splice._build(held, ended)
        except OSError:
            splice.stop()
            raise
        for way in splice._ways:
            way.start()
        return splice

    def _build(self, held: tuple[bytes, bytes], ended: tuple[bool, bool]) -> None:
        loop = asyncio.get_running_loop()
        for end in self._ends:
            assert end.transport is not None
            end.transport.pause_reading()
            sock = end.transport.get_extra_info("socket")
            dup = socket.socket(fileno=os.dup(sock.fileno()))
            dup.setblocking(False)
            self._socks.append(dup)
        for i, (source, sink) in enumerate(((0, 1), (1, 0))):
            self._ways.append(_Way(loop, source=self._socks[source], sink=self._socks[sink],
                                   pace=self._ends[source].pace, prefix=held[i], source_ended=ended[i],
                                   on_end=self._one_way_ended, on_fail=self._failed))

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for way in self._ways:
            way.stop()
        for sock in self._socks:
            sock.close()

    def _one_way_ended(self) -> None:
        if all(way.done for way in self._ways):
            self._close()

    def _failed(self, why: str) -> None:
        log.debug("relayed connection ended: %s", why)
        self._close()

    def _close(self) -> None:
        self.stop()
        for end in self._ends:
            end.close()
