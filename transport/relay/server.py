"""``RelayServer``: a public peer forwarding connections to private peers on fresh ports (TURN-style
allocations), each allocation proven by the peer's key over a fresh nonce and capped in peers,
connections and rate (``RelayConfig``); it never reads what it forwards (README.md, "Relay")."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gossamer.crypto.challenge import NONCE_BYTES, check_answer
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import peer_id_of
from gossamer.transport.errors import TransportError
from gossamer.transport.relay.wire import MAX_LINE_BYTES, Pace, Pipe, read_message, write_message

log = logging.getLogger(__name__)

class RelayRefused(TransportError):
    """A relay refused an allocation: not authorized, full, or a bad request (the message says which)."""


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """What a relay volunteers.

    Attributes:
        max_peers: most private peers relayed at once.
        max_connections: most connections (spliced or waiting for the peer) per relayed peer.
        rate_bytes_per_s: bytes per second per relayed peer, both directions together (0: no cap).
        attach_timeout_s: how long an incoming connection waits for the private peer to attach.
        control_timeout_s: a control connection silent this long is dropped (clients ping every third).
        max_services: most ports one allocation may ask for.
        auth_skew_s: most seconds between the relay's clock and the time a peer signed its proof.
        zero_copy: splice relayed connections in the kernel (Linux ``os.splice``) rather than copy
            them through Python; the same pace and caps either way (False: the copy path).
    """

    max_peers: int = 16
    max_connections: int = 32
    rate_bytes_per_s: float = 0.0
    attach_timeout_s: float = 10.0
    control_timeout_s: float = 60.0
    max_services: int = 4
    auth_skew_s: float = 30.0
    zero_copy: bool = True

    def __post_init__(self) -> None:
        for name in ("max_peers", "max_connections", "max_services"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.rate_bytes_per_s < 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0, got {self.rate_bytes_per_s!r}")
        for name in ("attach_timeout_s", "control_timeout_s", "auth_skew_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


@dataclass
class _Allocation:
    peer_id: str
    control: asyncio.StreamWriter
    pace: Pace
    listeners: list[asyncio.Server] = field(default_factory=list)
    pending: dict[str, Pipe] = field(default_factory=dict)
    pipes: set[Pipe] = field(default_factory=set)  # connections to the relayed peer, from anyone
    attached: set[Pipe] = field(default_factory=set)  # the peer's ends of them

    @property
    def ports(self) -> list[int]:
        return [server.sockets[0].getsockname()[1] for server in self.listeners]


class RelayServer:
    """A relay for private peers; build with ``await RelayServer.create(...)``, end with ``aclose``."""

    def __init__(self, *, host: str, name: str, config: RelayConfig, authorize: Callable[[bytes], str],
                 now: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a relay needs a name its peers sign for, got {name!r}")
        self._host = host
        self.name = name
        self._config = config
        self._authorize = authorize
        self._now = now
        self._clock = clock
        self._server: asyncio.Server | None = None
        self._attach_server: asyncio.Server | None = None
        self._allocations: dict[str, _Allocation] = {}
        self._pending: dict[str, _Allocation] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def create(cls, *, name: str, authorize: Callable[[bytes], str], host: str = "127.0.0.1", port: int = 0,
                     config: RelayConfig = RelayConfig(), now: Callable[[], float] = time.time,
                     clock: Callable[[], float] = time.monotonic) -> RelayServer:
        """A relay called ``name`` (what its peers' proofs must name: the layer above uses its peer
        id), admitting whom ``authorize`` names; ``now`` is the clock proofs are checked against,
        ``clock`` the monotonic one its paces (``rate_bytes_per_s``) run on."""
        relay = cls(host=host, name=name, config=config, authorize=authorize, now=now, clock=clock)
        relay._server = await asyncio.start_server(relay._accept, host, port, limit=2 * MAX_LINE_BYTES)
        try:
            relay._attach_server = await asyncio.get_running_loop().create_server(
                lambda: Pipe(on_line=relay._attach, zero_copy=config.zero_copy), host, 0)
        except BaseException:
            relay._server.close()
            raise
        return relay

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    @property
    def attach_port(self) -> int:
        assert self._attach_server is not None
        return self._attach_server.sockets[0].getsockname()[1]

    def stats(self) -> dict[str, int]:
        """Relayed peers, their open connections (of which spliced in the kernel), and the bytes moved
        for them."""
        allocations = list(self._allocations.values())
        return {"peers": len(allocations), "connections": sum(len(a.pipes) for a in allocations),
                "spliced": sum(pipe.spliced for a in allocations for pipe in a.pipes),
                "bytes": sum(a.pace.moved for a in allocations)}

    async def aclose(self) -> None:
        for server in (self._server, self._attach_server):
            if server is not None:
                server.close()
        for allocation in list(self._allocations.values()):
            self._release(allocation)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in (self._server, self._attach_server):
            if server is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5.0):
                        await server.wait_closed()

    # -- control connections ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            nonce = secrets.token_bytes(NONCE_BYTES)
            write_message(writer, {"op": "challenge", "nonce": base64.b64encode(nonce).decode()})
            first = await read_message(reader, timeout_s=self._config.attach_timeout_s)
            if first.get("op") == "allocate":
                await self._control(first, nonce, reader, writer)
        except TransportError as exc:
            log.debug("relay control connection ended: %s", exc)
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _control(self, request: dict, nonce: bytes, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        try:
            allocation = await self._allocate(request, self._authenticate(request, nonce), writer)
        except RelayRefused as exc:
            write_message(writer, {"ok": False, "error": str(exc)})
            await writer.drain()
            return
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

    async def _allocate(self, request: dict, peer_id: str, writer: asyncio.StreamWriter) -> _Allocation:
        services = request.get("services")
        if not isinstance(services, int) or not 1 <= services <= self._config.max_services:
            raise RelayRefused(f"services must be 1..{self._config.max_services}")
        old = self._allocations.get(peer_id)
        if old is not None:
            self._release(old)
        if len(self._allocations) >= self._config.max_peers:
            raise RelayRefused(f"this relay is full ({self._config.max_peers} peers)")
        allocation = _Allocation(peer_id=peer_id, control=writer, pace=Pace(self._config.rate_bytes_per_s, clock=self._clock))
        self._allocations[peer_id] = allocation
        loop = asyncio.get_running_loop()
        try:
            for service in range(services):
                allocation.listeners.append(await loop.create_server(
                    lambda s=service: Pipe(pace=allocation.pace, zero_copy=self._config.zero_copy,
                                           on_made=lambda pipe: self._incoming(allocation, s, pipe)),
                    self._host, 0))
        except OSError as exc:
            self._release(allocation)
            raise RelayRefused(f"the relay cannot listen: {exc}") from exc
        log.info("relaying for peer %s on ports %s", peer_id[:12], allocation.ports)
        return allocation

    def _release(self, allocation: _Allocation) -> None:
        if self._allocations.get(allocation.peer_id) is allocation:
            del self._allocations[allocation.peer_id]
        for server in allocation.listeners:
            server.close()
        for connection_id in allocation.pending:
            self._pending.pop(connection_id, None)
        for pipe in [*allocation.pipes, *allocation.attached]:
            pipe.close()
        allocation.control.close()

    # -- connections from anyone to a relayed peer, and the peer's attaching ones ------------------

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
        inbound.pair(pipe)


def _base64(request: dict, key: str) -> bytes:
    try:
        return base64.b64decode(str(request.get(key, "")), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RelayRefused(f"{key} is not base64") from exc
