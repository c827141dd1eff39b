"""What the relay attack tests share: the relay's own sockets counted from ``/proc`` (not from what
it says of itself), a raw-socket flood from another loopback address, and a fake clock."""

from __future__ import annotations

import asyncio
import os
import select
import socket
from collections.abc import Callable

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux
ATTACKER = "127.0.0.2"  # another loopback address: the relay sees a second source host


class Clock:
    """Monotonic seconds a test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


LOCAL = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


def _inodes(port: int) -> set[str]:
    """Socket inodes of TCP connections (not listening) whose local end is 127.0.0.1:``port``."""
    with open("/proc/net/tcp") as table:
        lines = table.read().splitlines()[1:]
    return {fields[9] for fields in map(str.split, lines) if fields[1] == f"{LOCAL}:{port:04X}" and fields[3] != "0A"}


def held_at(port: int, pid: int | None = None) -> int:
    """How many descriptors of process ``pid`` (this one by default) are accepted connections on ``port``."""
    inodes = _inodes(port)
    base = f"/proc/{pid or os.getpid()}/fd"
    held = 0
    for fd in os.listdir(base):
        try:
            link = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        held += link.startswith("socket:[") and link[8:-1] in inodes
    return held


def backlog(port: int) -> int:
    """Connections the kernel completed on the listening ``port`` that nobody accepted yet."""
    with open("/proc/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if fields[1] == f"{LOCAL}:{port:04X}" and fields[3] == "0A":  # 0A: LISTEN
                return int(fields[4].split(":")[1], 16)
    return 0


def flood(port: int, count: int, *, source: str = ATTACKER) -> list[socket.socket]:
    """``count`` connections to 127.0.0.1:``port`` from ``source``, not a byte sent; returns once
    every connect completed (the kernel queues them whether or not the relay accepts)."""
    socks, pending = [], {}
    poller = select.poll()
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)  # the port chosen at connect: binds stay fast
        sock.bind((source, 0))
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        socks.append(sock)
        pending[sock.fileno()] = sock
        poller.register(sock.fileno(), select.POLLOUT)
    while pending:
        for fd, _ in poller.poll(1000):
            poller.unregister(fd)
            pending.pop(fd)
    return socks


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock``: what it sent (a challenge) is read and dropped, then
    an EOF or a reset is waiting."""
    try:
        while sock.recv(65536, socket.MSG_DONTWAIT):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


async def until(condition: Callable[[], bool], *, bound_s: float = 60.0) -> None:
    """Yield to the loop (and to the relay) until ``condition`` holds; AssertionError past ``bound_s``
    (a bound on a busy machine, not a timing assertion)."""
    async with asyncio.timeout(bound_s):
        while not condition():  # noqa: ASYNC110  (the relay says through no event that it is done)
            await asyncio.sleep(0.01)
