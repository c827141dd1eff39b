"""``RelayServer``: a public peer forwarding connections to private peers on fresh ports (TURN-style
allocations), each allocation proven by the peer's key over a fresh nonce and capped in peers (per
address, and for peers nobody vouches for), connections, rate and descriptors; strangers' first
lines have a deadline (``RelayConfig``); it never reads what it forwards (README.md, "Relay")."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gossamer.crypto.challenge import NONCE_BYTES, check_answer
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import peer_id_of
from gossamer.transport.errors import TransportError
from gossamer.transport.logs import ThrottledLog
from gossamer.transport.relay.caps import Deadlines, Unproven, once
from gossamer.transport.relay.config import SPLICE_FDS, RelayConfig, RelayRefused, descriptor_cap
from gossamer.transport.relay.listen import Listener, listen
from gossamer.transport.relay.wire import MAX_LINE_BYTES, Pace, Pipe, read_message, write_message

log = ThrottledLog(logging.getLogger(__name__))

@dataclass
class _Allocation:
    peer_id: str
    host: str  # address key of its control connection
    trusted: bool
    control: asyncio.StreamWriter
    pace: Pace
    listeners: list[Listener] = field(default_factory=list)
    pending: dict[str, Pipe] = field(default_factory=dict)
    adopting: int = 0  # connections accepted for it whose pipe is being made
    pipes: set[Pipe] = field(default_factory=set)  # connections to the relayed peer, from anyone
    attached: set[Pipe] = field(default_factory=set)  # the peer's ends of them

    @property
    def ports(self) -> list[int]:
        return [listener.port for listener in self.listeners]


class RelayServer:
    """A relay for private peers; build with ``await RelayServer.create(...)``, end with ``aclose``."""

    def __init__(self, *, host: str, name: str, config: RelayConfig, authorize: Callable[[bytes], str],
                 trusted: Callable[[str], bool], now: Callable[[], float], clock: Callable[[], float]) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a relay needs a name its peers sign for, got {name!r}")
        self._host = host
        self.name = name
        self._config = config
        self._authorize = authorize
        self._trusted = trusted
        self._now = now
        self._clock = clock
        self._control_listener: Listener | None = None
        self._attach_listener: Listener | None = None
        self._allocations: dict[str, _Allocation] = {}
        self._pending: dict[str, _Allocation] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.max_open = descriptor_cap(config.max_open)
        self._unproven = Unproven(per_address=config.max_unproven_per_address,
                                  total=max(1, min(config.max_unproven, self.max_open // 4)))
        self._attaching: dict[str, int] = {}  # address key -> unpaired attach connections from a relayed host
        self._deadlines = Deadlines(config.line_timeout_s, clock=clock)
        self._ids = itertools.count()
        self._open = 0  # accepted sockets the relay holds
        self.refused_connections = 0
        self._sweeper: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, *, name: str, authorize: Callable[[bytes], str], host: str = "127.0.0.1", port: int = 0,
                     config: RelayConfig = RelayConfig(), trusted: Callable[[str], bool] = lambda peer_id: False,
                     now: Callable[[], float] = time.time, clock: Callable[[], float] = time.monotonic) -> RelayServer:
        """A relay called ``name`` (what its peers' proofs must name: the layer above uses its peer
        id), admitting whom ``authorize`` names (``trusted`` says which of them someone vouches for:
        only ``max_untrusted_peers`` places are for the others); ``now`` is the clock proofs are
        checked against, ``clock`` the monotonic one its paces and first-line deadlines run on."""
        relay = cls(host=host, name=name, config=config, authorize=authorize, trusted=trusted, now=now, clock=clock)
        control = listen(host, port)
        try:
            attach = listen(host, 0)
        except BaseException:
            control.close()
            raise
        relay._control_listener = Listener(control, relay._on_control, what="control")
        relay._attach_listener = Listener(attach, relay._on_attach, what="attach")
        relay._sweeper = asyncio.create_task(relay._sweep(), name="relay-deadlines")
        return relay

    @property
    def address(self) -> tuple[str, int]:
        assert self._control_listener is not None
        return self._control_listener.sock.getsockname()[:2]

    @property
    def attach_port(self) -> int:
        assert self._attach_listener is not None
        return self._attach_listener.port

    def stats(self) -> dict[str, int]:
        """Relayed peers, their open connections (of which spliced in the kernel), the bytes moved
        for them, connections not proven yet, and those refused at a cap."""
        allocations = list(self._allocations.values())
        return {"peers": len(allocations), "connections": sum(len(a.pipes) for a in allocations),
                "spliced": sum(pipe.spliced for a in allocations for pipe in a.pipes),
                "bytes": sum(a.pace.moved for a in allocations), "unproven": self._unproven.held,
                "open": self._open, "refused": self.refused_connections}

    def expire(self) -> int:
        """Close the connections whose first line is past ``line_timeout_s`` (on ``clock``); how many.
        A background task calls this every fraction of the deadline."""
        return self._deadlines.expire()

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for listener in (self._control_listener, self._attach_listener):
            if listener is not None:
                listener.close()
        for allocation in list(self._allocations.values()):
            self._release(allocation)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._sweeper] if self._sweeper else []), return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self._config.line_timeout_s / 4))
            self.expire()

    # -- what a stranger may hold -------------------------------------------------------------------

    def _room(self, extra: int = 1) -> bool:
        """Whether ``extra`` more descriptors fit, counting every attached pair as spliced (an upper
        bound, and cheap: one sum over at most ``max_peers`` allocations)."""
        pairs = sum(len(a.attached) for a in self._allocations.values())
        return self._open + extra + SPLICE_FDS * pairs <= self.max_open

    def _refuse(self, sock: socket.socket) -> None:
        self.refused_connections += 1
        sock.close()

    def _spawn(self, coro: object, name: str) -> None:
        task = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- control connections ----------------------------------------------------------------------

    def _on_control(self, sock: socket.socket, key: str) -> None:
        if not self._room() or not self._unproven.take(key):
            self._refuse(sock)
            return
        self._open += 1
        token = next(self._ids)
        self._deadlines.start(token, sock.close)
        self._spawn(self._control(sock, key, token), "relay-control")

    async def _control(self, sock: socket.socket, key: str, token: int) -> None:
        writer: asyncio.StreamWriter | None = None
        proven = False
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=2 * MAX_LINE_BYTES)
            self._deadlines.start(token, writer.transport.abort)
            nonce = secrets.token_bytes(NONCE_BYTES)
            write_message(writer, {"op": "challenge", "nonce": base64.b64encode(nonce).decode()})
            first = await read_message(reader, timeout_s=self._config.control_timeout_s)  # the deadline cuts first
            self._deadlines.done(token)
            if first.get("op") != "allocate":
                return
            try:
                allocation = self._allocate(first, self._authenticate(first, nonce), key, writer)
            except RelayRefused as exc:
                write_message(writer, {"ok": False, "error": str(exc)})
                with contextlib.suppress(OSError, ConnectionError, TimeoutError):
                    async with asyncio.timeout(self._config.line_timeout_s):
                        await writer.drain()
                return
            proven = True
            self._unproven.give(key)
            await self._serve(allocation, reader, writer)
        except (TransportError, OSError, ConnectionError, ValueError) as exc:  # ValueError: cut before it began
            log.debug("relay control connection ended: %s", exc)
        finally:
            self._deadlines.done(token)
            if not proven:
                self._unproven.give(key)
            if writer is not None:
                writer.close()
            else:
                sock.close()
            self._open -= 1

    async def _serve(self, allocation: _Allocation, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        write_message(writer, {"ok": True, "ports": allocation.ports, "attach_port": self.attach_port})
        try:
            while True:
                message = await read_message(reader, timeout_s=self._config.control_timeout_s)
                if message.get("op") == "ping":
                    write_message(writer, {"op": "pong"})
                    await writer.drain()
        finally:
            self._release(allocation)

    def _authenticate(self, request: dict, nonce: bytes) -> str:
        """The peer id of a request whose ``auth`` is admitted and whose ``proof`` is that peer's
        answer to this connection's ``nonce``; RelayRefused otherwise."""
        auth, proof = _base64(request, "auth"), _base64(request, "proof")
        peer_id = self._authorize(auth)  # RelayRefused when not authorized
        try:
            public_key = check_answer(proof, nonce=nonce, audience=self.name, now=self._now(),
                                      skew_s=self._config.auth_skew_s)
        except VerificationError as exc:
            raise RelayRefused("the proof does not answer this relay's challenge (replayed, stale, "
                               "for another relay, or not signed by the peer)") from exc
        if peer_id_of(public_key) != peer_id:
            raise RelayRefused("the proof is signed by another key than the authorized peer's")
        return peer_id

    def _allocate(self, request: dict, peer_id: str, key: str, writer: asyncio.StreamWriter) -> _Allocation:
        config = self._config
        services = request.get("services")
        if isinstance(services, bool) or not isinstance(services, int) or not 1 <= services <= config.max_services:
            raise RelayRefused(f"services must be 1..{config.max_services}")
        old = self._allocations.get(peer_id)
        if old is not None:
            self._release(old)
        others = list(self._allocations.values())
        trusted = bool(self._trusted(peer_id))
        if len(others) >= config.max_peers:
            raise RelayRefused(f"this relay is full ({config.max_peers} peers)")
        if sum(a.host == key for a in others) >= config.max_peers_per_address:
            raise RelayRefused(f"this relay serves at most {config.max_peers_per_address} peers from one address")
        if not trusted and sum(not a.trusted for a in others) >= min(config.max_untrusted_peers, config.max_peers):
            raise RelayRefused(f"this relay's {config.max_untrusted_peers} places for peers nobody vouches for yet "
                               "are taken (the others are kept for tenured peers)")
        if not self._room(services):
            raise RelayRefused("this relay is out of descriptors for now")
        allocation = _Allocation(peer_id=peer_id, host=key, trusted=trusted, control=writer,
                                 pace=Pace(config.rate_bytes_per_s, clock=self._clock))
        self._allocations[peer_id] = allocation
        try:
            for service in range(services):
                allocation.listeners.append(Listener(
                    listen(self._host, 0), lambda sock, who, s=service: self._on_inbound(allocation, s, sock),
                    what="allocation"))
        except OSError as exc:
            self._release(allocation)
            raise RelayRefused(f"the relay cannot listen: {exc}") from exc
        log.info("relaying for peer %s on ports %s", peer_id[:12], allocation.ports)
        return allocation

    def _release(self, allocation: _Allocation) -> None:
        if self._allocations.get(allocation.peer_id) is allocation:
            del self._allocations[allocation.peer_id]
        for listener in allocation.listeners:
            listener.close()
        allocation.listeners = []
        for connection_id in allocation.pending:
            self._pending.pop(connection_id, None)
        for pipe in [*allocation.pipes, *allocation.attached]:
            pipe.close()
        allocation.control.close()

    # -- connections from anyone to a relayed peer, and the peer's attaching ones ------------------

    def _adopt(self, sock: socket.socket, make: Callable[[], Pipe], then: Callable[[Pipe], None], *,
               failed: Callable[[], None] = lambda: None) -> None:
        """Wrap an accepted ``sock`` in the ``Pipe`` ``make`` builds; ``then`` when it exists
        (``failed`` if it never does). Counted held until the pipe is gone."""
        self._open += 1

        async def adopt() -> None:
            try:
                _transport, pipe = await asyncio.get_running_loop().connect_accepted_socket(make, sock)
            except BaseException as exc:  # cancelled at close, or the socket was cut before it began
                sock.close()
                self._open -= 1
                failed()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.debug("relay could not take a connection: %r", exc)
                return
            pipe.done.add_done_callback(lambda _done: self._closed_one())
            then(pipe)

        self._spawn(adopt(), "relay-adopt")

    def _closed_one(self) -> None:
        self._open -= 1

    def _on_inbound(self, allocation: _Allocation, service: int, sock: socket.socket) -> None:
        if self._allocations.get(allocation.peer_id) is not allocation or not self._room() \
                or len(allocation.pipes) + allocation.adopting >= self._config.max_connections:
            self._refuse(sock)
            return
        allocation.adopting += 1  # its place is taken now; the pipe comes next

        def made(pipe: Pipe) -> None:
            allocation.adopting -= 1
            self._incoming(allocation, service, pipe)

        self._adopt(sock, lambda: Pipe(pace=allocation.pace, zero_copy=self._config.zero_copy), made,
                    failed=lambda: setattr(allocation, "adopting", allocation.adopting - 1))

    def _incoming(self, allocation: _Allocation, service: int, pipe: Pipe) -> None:
        if len(allocation.pipes) >= self._config.max_connections or \
                self._allocations.get(allocation.peer_id) is not allocation:
            pipe.close()
            return
        connection_id = secrets.token_hex(16)
        allocation.pipes.add(pipe)
        allocation.pending[connection_id] = pipe
        self._pending[connection_id] = allocation

        def forget(_done: object) -> None:
            allocation.pipes.discard(pipe)
            allocation.pending.pop(connection_id, None)
            self._pending.pop(connection_id, None)

        pipe.done.add_done_callback(forget)
        asyncio.get_running_loop().call_later(self._config.attach_timeout_s,
                                              lambda: pipe.close() if pipe.peer is None else None)
        write_message(allocation.control, {"op": "connect", "id": connection_id, "service": service})

    def _on_attach(self, sock: socket.socket, key: str) -> None:
        """An attach connection from an address a relayed peer controls from counts against those
        peers' connections; one from anywhere else against the strangers' pool."""
        relayed = sum(a.host == key for a in self._allocations.values())
        if relayed and self._attaching.get(key, 0) < relayed * self._config.max_connections:
            self._attaching[key] = self._attaching.get(key, 0) + 1
            give = once(lambda: self._attach_given(key))
        elif self._unproven.take(key):
            give = once(lambda: self._unproven.give(key))
        else:
            self._refuse(sock)
            return
        if not self._room():
            give()
            self._refuse(sock)
            return
        token, finished = next(self._ids), False
        self._deadlines.start(token, sock.close)

        def made(pipe: Pipe) -> None:
            if not finished:
                self._deadlines.start(token, pipe.close)
            pipe.done.add_done_callback(lambda _done: finish())

        def finish() -> None:
            nonlocal finished
            finished = True
            self._deadlines.done(token)
            give()

        def line(message: dict, pipe: Pipe) -> None:
            finish()
            self._attach(message, pipe)

        self._adopt(sock, lambda: Pipe(on_line=line, zero_copy=self._config.zero_copy), made, failed=finish)

    def _attach_given(self, key: str) -> None:
        left = self._attaching.get(key, 0) - 1
        if left > 0:
            self._attaching[key] = left
        else:
            self._attaching.pop(key, None)

    def _attach(self, message: dict, pipe: Pipe) -> None:
        connection_id = message.get("id")
        allocation = self._pending.pop(connection_id, None) if isinstance(connection_id, str) else None
        inbound = allocation.pending.pop(connection_id, None) if allocation is not None else None
        if message.get("op") != "attach" or allocation is None or inbound is None or inbound.transport is None \
                or inbound.transport.is_closing():
            pipe.close()
            return
        pipe.pace = allocation.pace
        allocation.attached.add(pipe)
        pipe.done.add_done_callback(lambda _done: allocation.attached.discard(pipe))
        if not self._room(0):  # splicing costs descriptors (this pair counted): near the cap, it copies
            pipe.zero_copy = inbound.zero_copy = False
        inbound.pair(pipe)


def _base64(request: dict, key: str) -> bytes:
    try:
        return base64.b64decode(str(request.get(key, "")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RelayRefused(f"{key} is not base64") from exc
