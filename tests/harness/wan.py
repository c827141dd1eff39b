"""WAN emulation (``WanProxy``): an asyncio TCP proxy that shapes each connection like an internet
link between two loopback endpoints, with latency, jitter, a bandwidth cap (per connection, or one
peer's shared ``AccessLink``), drops, resets, refusals and slicing; a ``Pipe`` per direction
(``wan_link``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from dataclasses import dataclass

from gossamer.transport.errors import TransportError
from gossamer_harness.wan_link import AccessLink, DirectionCounters, InjectedReset, LinkProfile, Pipe

__all__ = ["AccessLink", "DirectionStats", "LinkProfile", "ProxyOptions", "WanProxy", "WanStats", "listen_socket"]

logger = logging.getLogger(__name__)
CANCEL_AGAIN_S = 1.0
"""How long ``cancel_until_done`` waits for cancelled tasks before cancelling the ones left again."""


async def cancel_until_done(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks``, again every ``CANCEL_AGAIN_S`` while any is left (a task can lose a
    cancellation: Python 3.11's ``asyncio.wait_for`` drops one that comes as its awaitable
    completes), until all are done; a cancellation of the caller meanwhile is raised after."""
    cancelled = False
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        try:
            await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


@dataclass(frozen=True, kw_only=True)
class ProxyOptions:
    """Proxy-wide settings (per-direction behaviour lives in ``LinkProfile``).

    Attributes:
        max_connections: connections forwarded at once; more are refused (aborted at once).
        queue_chunks: most chunks queued per direction of one connection.
        queue_bytes: most bytes queued per direction of one connection; None sizes it from the
            profile (``LinkProfile.default_queue_bytes``: twice the bandwidth-delay product).
        connect_timeout_s: deadline to connect to the target; on timeout the client is aborted.
    """

    max_connections: int = 64
    queue_chunks: int = 4096
    queue_bytes: int | None = None
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "queue_chunks", "queue_bytes"):
            value = getattr(self, name)
            if name == "queue_bytes" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WanProxy {name} must be an int >= 1, got {value!r}")
        timeout = self.connect_timeout_s
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
            raise ValueError(f"WanProxy connect_timeout_s must be a finite number > 0, got {timeout!r}")


@dataclass(frozen=True)
class DirectionStats:
    """What one direction forwarded, over all connections; ``writes`` counts the sends to the
    destination socket: one per chunk, or one per slice when the profile sets ``slice_bytes``."""

    bytes_forwarded: int
    chunks_forwarded: int
    chunks_dropped: int
    writes: int


@dataclass(frozen=True)
class WanStats:
    """A snapshot of a proxy's counters.

    ``connections_accepted`` counts connections forwarded to the target; ``connections_refused``
    those aborted at once; ``connections_reset`` those reset by the profile; ``connections_failed``
    those whose target could not be reached.
    """

    up: DirectionStats
    down: DirectionStats
    connections_accepted: int
    connections_refused: int
    connections_reset: int
    connections_failed: int


@dataclass
class _ConnectionCounters:
    accepted: int = 0
    refused: int = 0
    reset: int = 0
    failed: int = 0


def _abort(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a reset, not an orderly EOF."""
    with contextlib.suppress(OSError):  # already closed or never connected: nothing to linger
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def listen_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on (host, port) (port 0: chosen by the OS), for
    ``WanProxy.create(..., listener=...)``; TransportError if it cannot be opened."""
    try:
        return _listen(host, port)
    except OSError as exc:
        raise TransportError(f"cannot listen on {host}:{port}: {exc}") from exc


def _listen(host: str, port: int) -> socket.socket:
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class WanProxy:
    """A TCP proxy to one target that shapes each connection like a WAN link: latency, jitter, a
    bandwidth cap, drops, resets and slicing (a stream delivered a few bytes, or one byte, per write).

    The kernels the tests and benchmarks run on have no ``netem``, so a ``WanProxy`` stands in for an
    internet link between two loopback endpoints::

        proxy = await WanProxy.create("127.0.0.1", server_port, up=LinkProfile.from_mbit(100, 50))
        host, port = proxy.address          # connect here instead of to the server
        ...
        await proxy.aclose()

    ``up`` shapes bytes from the connecting client to the target, ``down`` the way back (default: the
    same profile). Each accepted connection gets one ``Pipe`` per direction (see ``wan_link``).
    ``LinkProfile(slice_bytes=1)`` forwards a direction one byte per write, so the endpoint's frame
    and body parsers see every partial read there is (``wan_link``: what slicing costs).

    When the proxy's port must be known before its target exists (a peer that announces the proxy's
    port as its own from its first record), open the listening socket first and hand it over later::

        listener = listen_socket("127.0.0.1", 0)       # its port goes into the peer's --announce_http_port
        ...                                            # start the peer, learn where it listens
        proxy = await WanProxy.create("127.0.0.1", peer_port, up=..., listener=listener)

    Connections that arrive in between wait in the listen backlog and are served once the proxy runs.

    By default every connection is its own link at the profile's rate. Proxies in front of one peer's
    ports can share that peer's access link instead (``AccessLink``: one token bucket per direction
    for all their connections), so a peer with several neighbours divides its bandwidth among them::

        access = AccessLink.from_mbit(100)
        http = await WanProxy.create("127.0.0.1", http_port, up=profile, access=access)
        tcp = await WanProxy.create("127.0.0.1", tcp_port, up=profile, access=access)

    Connection semantics: EOF from one side is forwarded (after the link's latency) as
    ``shutdown(SHUT_WR)`` to the other, so half-closed request/response exchanges work; the proxy
    closes both sockets once both directions have reached EOF. Any socket error (a reset, a write to a
    closed peer) or an injected reset aborts both sides with SO_LINGER 0, so each endpoint sees a
    reset. A refused connection (``up.refuse_probability``, or ``max_connections`` reached) is
    aborted at once and never reaches the target.
    """

    def __init__(self, listener: socket.socket, target: tuple[int, tuple], *, up: LinkProfile,
                 down: LinkProfile, options: ProxyOptions, access: AccessLink | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._listener = listener
        self._target_family, self._target_address = target
        self._up, self._down, self._options, self._access = up, down, options, access
        self._up_rng, self._down_rng = random.Random(up.seed), random.Random(down.seed)
        self._up_counters, self._down_counters = DirectionCounters(), DirectionCounters()
        self._counts = _ConnectionCounters()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accept_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def create(cls, target_host: str, target_port: int, *, up: LinkProfile,
                     down: LinkProfile | None = None, listen_host: str = "127.0.0.1", listen_port: int = 0,
                     max_connections: int = 64, queue_chunks: int = 4096, queue_bytes: int | None = None,
                     connect_timeout_s: float = 5.0, listener: socket.socket | None = None,
                     access: AccessLink | None = None) -> WanProxy:
        """Listen on (listen_host, listen_port), or serve ``listener`` (a ``listen_socket``; the
        proxy owns it from now on), and forward every connection to the target. With ``access``,
        the connections' bandwidth is the target's shared access link (``AccessLink``) instead of
        the profiles' rate per connection."""
        if not isinstance(access, AccessLink | None):
            raise ValueError(f"WanProxy access must be an AccessLink, got {access!r}")
        options = ProxyOptions(max_connections=max_connections, queue_chunks=queue_chunks,
                               queue_bytes=queue_bytes, connect_timeout_s=connect_timeout_s)
        for name, profile in (("up", up), ("down", down)):
            if not isinstance(profile, LinkProfile | None) or (name == "up" and profile is None):
                raise ValueError(f"WanProxy {name} must be a LinkProfile, got {profile!r}")
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target_host, target_port, type=socket.SOCK_STREAM)
            listener = listener if listener is not None else _listen(listen_host, listen_port)
        except OSError as exc:
            if listener is not None:
                listener.close()
            raise TransportError(f"WAN proxy to {target_host}:{target_port} cannot start: {exc}") from exc
        target = (infos[0][0], infos[0][4])
        proxy = cls(listener, target, up=up, down=up if down is None else down, options=options, access=access)
        proxy._accept_task = loop.create_task(proxy._accept_loop())
        proxy._accept_task.add_done_callback(proxy._task_done)
        return proxy

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect: (host, port)."""
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def stats(self) -> WanStats:
        """A snapshot of the counters."""
        def direction(c: DirectionCounters) -> DirectionStats:
            return DirectionStats(c.bytes_forwarded, c.chunks_forwarded, c.chunks_dropped, c.writes)

        c = self._counts
        return WanStats(direction(self._up_counters), direction(self._down_counters),
                        c.accepted, c.refused, c.reset, c.failed)

    async def __aenter__(self) -> WanProxy:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop accepting, cancel and await every task, close every socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await cancel_until_done([task for task in (self._accept_task, *self._tasks) if task is not None])
        self._listener.close()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("WAN proxy task %s failed", task.get_name(), exc_info=task.exception())

    async def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = await self._loop.sock_accept(self._listener)
            except ConnectionAbortedError:  # the client gave up before we accepted: nothing to do
                continue
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        refuse_p = self._up.refuse_probability
        if len(self._tasks) >= self._options.max_connections or (refuse_p > 0 and self._up_rng.random() < refuse_p):
            self._counts.refused += 1
            _abort(sock)
            return
        self._counts.accepted += 1
        task = self._loop.create_task(self._serve(sock))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _connect(self) -> socket.socket:
        sock = socket.socket(self._target_family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that comes as
            # the connect completes, and a relay through an hour-long blackhole then held aclose for good
            async with asyncio.timeout(self._options.connect_timeout_s):
                await self._loop.sock_connect(sock, self._target_address)
        except BaseException:  # closed here on any failure (cancel included), then re-raised
            sock.close()
            raise
        return sock

    async def _serve(self, client: socket.socket) -> None:
        try:
            target = await self._connect()
        except (OSError, TimeoutError) as exc:
            self._counts.failed += 1
            logger.debug("WAN proxy cannot reach target %s: %s", self._target_address, exc)
            _abort(client)
            return
        except BaseException:
            _abort(client)
            raise
        clean = False
        try:
            clean = await self._relay(client, target)
        finally:
            for sock in (client, target):
                if clean:
                    sock.close()
                else:
                    _abort(sock)

    async def _relay(self, client: socket.socket, target: socket.socket) -> bool:
        """Run both pipes; True when both ended in an orderly EOF, False after a reset or error.
        The pipes are ended with ``cancel_until_done``, not a TaskGroup: a TaskGroup cancels its
        tasks once, and a pipe that lost that cancellation held the relay (and ``aclose``) for good."""
        for sock in (client, target):
            with contextlib.suppress(OSError):  # a peer already gone shows up in the pipes below
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipes = (self._pipe(client, target, self._up, self._up_rng, self._up_counters, "inbound"),
                 self._pipe(target, client, self._down, self._down_rng, self._down_counters, "outbound"))
        tasks = [self._loop.create_task(loop) for pipe in pipes for loop in (pipe.read_loop(), pipe.write_loop())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            await cancel_until_done(tasks)
        errors = [task.exception() for task in tasks if not task.cancelled() and task.exception() is not None]
        if any(isinstance(error, InjectedReset) for error in errors):
            self._counts.reset += 1
            return False
        for error in errors:
            if not isinstance(error, OSError):
                raise error  # type: ignore[misc]
        if errors:
            logger.debug("WAN proxy connection ended by a socket error: %s", errors[0])
            return False
        return True

    def _pipe(self, src: socket.socket, dst: socket.socket, profile: LinkProfile, rng: random.Random,
              counters: DirectionCounters, direction: str) -> Pipe:
        queue_bytes = self._options.queue_bytes or profile.default_queue_bytes()
        bucket = None if self._access is None else self._access.bucket(direction, self._loop.time())
        return Pipe(src, dst, profile, rng=rng, counters=counters, queue_bytes=queue_bytes,
                    queue_chunks=self._options.queue_chunks, bucket=bucket)
