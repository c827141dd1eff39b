"""``Listener``: the relay's own accept loop. Each accepted socket goes to a callback that keeps or
closes it at once (the caps are the relay's); a failed accept (EMFILE: out of descriptors) is one
throttled log line and a backoff, never a traceback, and accepting goes on."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable

from gossamer.transport.logs import ThrottledLog
from gossamer.transport.slots import address_key

log = ThrottledLog(logging.getLogger(__name__))

BACKOFF_S = 0.05  # first pause after a failed accept; it doubles up to MAX_BACKOFF_S
MAX_BACKOFF_S = 1.0
BACKLOG = 128
PER_WAKEUP = 64  # most connections accepted per wake-up, so a flood cannot hold the loop
_PASSING = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM)  # the connection went before we took it


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket; OSError when it cannot listen."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    sock.setblocking(False)
    return sock


class Listener:
    """Accepts on ``sock`` and hands each connection, with its address key, to ``on_socket``;
    ``close`` stops at once (synchronously: the socket is closed when it returns)."""

    def __init__(self, sock: socket.socket, on_socket: Callable[[socket.socket, str], None], *, what: str) -> None:
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self._on_socket = on_socket
        self._what = what
        self._loop = asyncio.get_running_loop()
        self._backoff = BACKOFF_S
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        self.failed_accepts = 0
        self._loop.add_reader(sock.fileno(), self._ready)

    def _ready(self) -> None:
        for _ in range(PER_WAKEUP):
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _PASSING:
                    continue
                self._pause(exc)
                return
            self._backoff = BACKOFF_S
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._on_socket(conn, address_key(peer))
            if self._closed:
                return

    def _pause(self, exc: OSError) -> None:
        self.failed_accepts += 1
        log.warning("relay %s port %d: accept failed: %s (pausing %.2f s)", self._what, self.port,
                    exc.strerror or exc, self._backoff)
        self._loop.remove_reader(self.sock.fileno())
        self._retry = self._loop.call_later(self._backoff, self._resume)
        self._backoff = min(2 * self._backoff, MAX_BACKOFF_S)

    def _resume(self) -> None:
        self._retry = None
        if not self._closed:
            self._loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        else:
            self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
