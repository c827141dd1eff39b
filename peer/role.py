"""Roles: what a peer does in a run. ``Role`` (built from a ``RoleContext``; routes and methods
collected before the servers start, then ``start``, ``aclose``, ``checkpoint``; ``health`` for
``/healthz`` and the exit code) and ``ProtocolRole[S]``, with the run's settings ``S`` and the
helpers every protocol's roles share (README.md of peer, "role")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch
from aiohttp import web

from gossamer.crypto.identity import Identity
from gossamer.peer.cancellation import cancel_all
from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError
from gossamer.peer.events import EventSink
from gossamer.peer.kit.conditions import wait_until
from gossamer.peer.metrics import Traffic
from gossamer.peer.plugin import ProtocolPlugin
from gossamer.peer.run.manifest import Manifest
from gossamer.peer.run.publisher import StoreLog
from gossamer.peer.run.tenure import steering
from gossamer.peer.run.view import LivePeer, PeerView
from gossamer.transport.dht import DhtMembership
from gossamer.transport.frames import Frame
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.tcp import ConnectionInfo, HandlerError

log = logging.getLogger(__name__)

TcpMethod = Callable[[Frame, ConnectionInfo], Awaitable[Frame | None]]
"""``method(frame, connection)``: answers one request; ``connection`` says which TCP connection it
arrived on (a method that binds state to a connection, like ``kit.secure_link``, checks it)."""
TcpGate = Callable[[dict[str, Any], int], None]
"""``gate(header, payload_len)``: what a frame of a TCP method must pass before its payload is
allocated or read (who is calling, how big it may be); refuses by raising ``HandlerError``."""
S = TypeVar("S")

RUNNING, SERVING, FINISHED, FAILED = "running", "serving", "finished", "failed"


@dataclass(frozen=True)
class RoleHealth:
    """How a role is doing: ``running`` (working towards an end), ``serving`` (a role without an end
    of its own, e.g. the orchestrator or a block server), ``finished`` or ``failed``."""

    state: str
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"state": self.state, "detail": self.detail}


def payload_cap(max_bytes: int, method: str) -> TcpGate:
    """A gate refusing payloads above ``max_bytes`` (the largest frame ``method`` can need)."""

    def gate(header: dict[str, Any], payload_len: int) -> None:
        if payload_len > max_bytes:
            raise HandlerError(f"{method}: payload of {payload_len} bytes exceeds this method's cap of {max_bytes}")

    return gate


@dataclass(frozen=True, kw_only=True)
class RoleContext:
    """What the daemon hands every role: identity, run, settings, device, and the shared transports."""

    identity: Identity
    config: PeerConfig
    manifest: Manifest
    plugin: ProtocolPlugin
    settings: Any  # the plugin's settings for this run, parsed once (None if it has none)
    membership: DhtMembership
    http_client: HttpClient
    view: PeerView
    device: torch.device
    traffic: Traffic
    now: Callable[[], float]
    http_config: HttpConfig
    events: EventSink = field(default_factory=lambda: EventSink(enabled=False))
    announce: Callable[[], None] = lambda: None  # republish this peer's record now (e.g. a new round)
    view_refreshed: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified after each refresh
    store_log: StoreLog = field(default_factory=StoreLog)  # this daemon's DHT stores, done and failed
    fault_point: Callable[[str, int], Awaitable[None]] = field(default=lambda phase, step: _nothing())
    """Awaited by a role at a named phase of a step (e.g. ``aggregate`` of round 7) where a test may
    crash the peer (``LocalNet.crash(name, step, phase)``: it never returns, the peer is killed);
    a daemon's does nothing."""

    async def until_view(self, predicate: Callable[[], bool], *, timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds after a view refresh (or already holds); False at the timeout."""
        return await wait_until(self.view_refreshed, predicate, timeout_s=timeout_s)

    @property
    def is_run_owner(self) -> bool:
        return self.manifest.owner_public_key == self.identity.public_key


async def _nothing() -> None:
    return None


class Role:
    """Base class with the no-op defaults; subclasses override what they need."""

    name = "role"
    ends = True
    """Whether the role's work has an end (False: it serves until stopped)."""
    private_status: frozenset[str] = frozenset()
    """Keys of ``status()`` and names of ``gauges()`` that only the peer's owner reads (this host,
    or a client with the peer's status token): what a role must not show to anyone who asks, e.g.
    per-step losses or which data a step used. ``public_status``/``public_gauges`` leave them out."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.failure = ""  # set when a spawned task ended with an exception

    def routes(self) -> list[web.RouteDef]:
        return []

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return {}

    def tcp_gates(self) -> dict[str, TcpGate]:
        """Per TCP method, the check its frames pass before their payload is read (see ``TcpGate``);
        a method without one takes payloads up to ``serving.DEFAULT_TCP_PAYLOAD_BYTES``."""
        return {}

    async def start(self) -> None:
        return None

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task this role owns: ``aclose`` cancels it and waits for it."""
        task = asyncio.create_task(coro, name=f"{self.name}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._note_failure)
        return task

    def _note_failure(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("%s failed", task.get_name(), exc_info=exc)
        self.failure = self.failure or f"{task.get_name()}: {type(exc).__name__}: {exc}"

    async def drain(self) -> None:
        """Wait until every task the role has spawned so far has ended (tests, orderly shutdowns)."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel every task the role spawned and wait until they have ended, at most
        ``stopping.SETTLE_S`` (idempotent)."""
        self._closed = True
        await cancel_all(list(self._tasks), what=self.name)

    def health(self) -> RoleHealth:
        """How the role is doing (see ``RoleHealth``); subclasses say when they are finished."""
        if self.failure:
            return RoleHealth(FAILED, self.failure)
        return RoleHealth(RUNNING if self.ends else SERVING)

    async def checkpoint(self) -> str | None:
        """Write what a restart of this role resumes from (called on a clean shutdown, after
        ``aclose``); the file's path, or None when the role keeps no state of its own."""
        return None

    @property
    def round(self) -> int:
        return 0

    @property
    def run_round(self) -> int:
        """What this peer's record says of the whole run's progress (the orchestrator's: the
        highest round the run's members announced; 0 from every other role)."""
        return 0

    def gauges(self) -> dict[str, float]:
        """Extra numbers for ``/metrics`` (exported as ``gossamer_<name>``)."""
        return {}

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """(version, tensors) of a replicated model this role holds, served to joiners; None if none."""
        return None

    def status(self) -> dict[str, Any]:
        return {}

    def public_status(self) -> dict[str, Any]:
        """``status()`` without the ``private_status`` keys: what anyone may read."""
        return {k: v for k, v in self.status().items() if k not in self.private_status}

    def public_gauges(self) -> dict[str, float]:
        """``gauges()`` without the ``private_status`` names: what anyone may read."""
        return {k: v for k, v in self.gauges().items() if k not in self.private_status}


class ProtocolRole(Role, Generic[S]):
    """A role of one protocol: ``self.settings`` is the run's settings of type ``S``."""

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.settings: S = ctx.settings

    # -- who is in the run ------------------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.ctx.identity.peer_id

    def peers_with(self, role: str, *, include_self: bool = False) -> list[LivePeer]:
        """Live, admitted peers whose record carries ``role``, sorted by peer id."""
        return [p for p in self.ctx.view.live(now=self.ctx.now())
                if role in p.record.roles and (include_self or p.record.peer_id != self.peer_id)]

    def peer_ids_with(self, role: str, *, include_self: bool = False) -> list[str]:
        """Peer ids of ``peers_with(role)``; with ``include_self``, this peer is among them whatever
        its record says (its own record may not be in the view yet)."""
        ids = {p.record.peer_id for p in self.peers_with(role)}
        if include_self:
            ids.add(self.peer_id)
        return sorted(ids)

    def steering_peers_with(self, role: str) -> list[LivePeer]:
        """``peers_with(role)`` that may steer this peer's choices (a median, a state to adopt):
        the tenured ones, or all when none is (``run.tenure``)."""
        owner = self.ctx.view.get(self.ctx.manifest.owner_peer_id)
        return steering(self.peers_with(role), now=self.ctx.now(), tenure_s=self.ctx.manifest.tenure_s,
                        owner=owner.record if owner is not None else None)

    def live_with(self, peer_id: str, role: str) -> LivePeer | None:
        """The live record of ``peer_id`` if it carries ``role``; None otherwise."""
        live = self.ctx.view.get(peer_id)
        return live if live is not None and role in live.record.roles else None

    def require_run_owner(self) -> None:
        """ConfigError unless this peer holds the key that signed the manifest."""
        if not self.ctx.is_run_owner:
            raise ConfigError(f"the {self.name} role needs the run owner's identity (the key that signed the manifest)")

    # -- this peer's share of the work ------------------------------------------------------------

    def shard_index(self, num_shards: int) -> int:
        """This peer's data shard: its peer id modulo ``num_shards`` (stable across restarts)."""
        return int(self.peer_id[:8], 16) % num_shards

    def peer_seed(self) -> int:
        """A seed derived from the peer id: different on every peer, the same after a restart."""
        return int(self.peer_id[:15], 16)

    # -- telling the world ------------------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> None:
        """Emit ``<protocol>.<event>``; its fields must be exactly those the plugin documents."""
        schema = self.ctx.plugin.events.get(event)
        if schema is None:
            raise KeyError(f"{self.ctx.plugin.name} has no event {event!r}; document it in its plugin")
        if set(fields) != set(schema.fields):
            raise TypeError(f"event {self.ctx.plugin.name}.{event} carries {sorted(fields)}, "
                            f"its schema says {sorted(schema.fields)}")
        self.ctx.events.emit(f"{self.ctx.plugin.name}.{event}", **fields)
