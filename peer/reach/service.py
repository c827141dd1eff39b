"""``Reach``: what one daemon does about reachability, in one object: it answers dial-backs, tests
this peer, volunteers or keeps a relay, and says what the record announces and ``/status`` shows."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from gossamer.crypto.identity import Identity
from gossamer.peer.cancellation import cancel_all
from gossamer.peer.reach.dialback import DialBack, DialBackLimits, TcpHandler
from gossamer.peer.reach.relaying import Relaying, volunteer
from gossamer.peer.reach.selftest import SelfTest, private_line
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import PRIVATE, RELAYED, PeerRecord, seal_record
from gossamer.peer.run.tenure import is_tenured
from gossamer.peer.run.view import PeerView
from gossamer.transport.http_client import HttpClient
from gossamer.transport.relay import RelayConfig, RelayServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Volunteer:
    """Where this peer's relay listens and what it offers (``--relay``)."""

    host: str
    port: int
    config: RelayConfig


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r (this peer's reachability is no longer checked or kept)", task.get_name(),
                  task.exception())


class Reach:
    """One daemon's dial-back service, self-test and relays; ``start`` runs them, ``aclose`` ends them."""

    def __init__(self, *, identity: Identity, admission: Admission, ttl_s: float, now: Callable[[], float],
                 http_client: HttpClient, view: PeerView, view_refreshed: asyncio.Condition,
                 direct_record: Callable[[], PeerRecord], announce: Callable[[], None],
                 targets: Callable[[], list[tuple[str, int]]], volunteer_as: Volunteer | None = None,
                 notify: Callable[[dict], None] = lambda status: None, every_s: float = 300.0,
                 limits: DialBackLimits = DialBackLimits(), tenure_s: float = float("inf"), owner_id: str = "") -> None:
        self._identity = identity
        self._tenure_s = tenure_s
        self._owner_id = owner_id
        self._admission = admission
        self._ttl_s = ttl_s
        self._view = view
        self._view_refreshed = view_refreshed
        self._now = now
        self._direct_record = direct_record
        self._announce = announce
        self._notify = notify
        self._volunteer_as = volunteer_as
        self._changed = asyncio.Event()
        self.dialback = DialBack(peer_id=identity.peer_id, admission=admission, ttl_s=ttl_s, now=now,
                                 http_client=http_client, limits=limits)
        self.selftest = SelfTest(http_client=http_client, probe=self._probe, candidates=self._candidates,
                                 on_change=self._verdict_changed, trusted=self.trusted, every_s=every_s)
        self.relaying = Relaying(identity=identity, candidates=self._candidates, auth=lambda: self._probe()[1],
                                 targets=targets, on_change=self._announce_change, now=now)
        self.relay_server: RelayServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def reachability(self) -> str:
        return RELAYED if self.relaying.addresses else self.selftest.verdict.kind

    def addresses(self, http_addr: str, tcp_addr: str) -> tuple[str, str]:
        """What the record announces: the relay's addresses while this peer has one, else its own."""
        return self.relaying.addresses or (http_addr, tcp_addr)

    def relay_addr(self, host: str) -> str:
        """The relay service this peer volunteers, as ``host:port`` ("" if none)."""
        return f"{host}:{self.relay_server.address[1]}" if self.relay_server is not None else ""

    def routes(self) -> list[web.RouteDef]:
        return self.dialback.routes()

    def tcp_methods(self) -> dict[str, TcpHandler]:
        return self.dialback.tcp_methods()

    async def start(self) -> None:
        if self._volunteer_as is not None:
            self.relay_server = await volunteer(name=self._identity.peer_id, host=self._volunteer_as.host, port=self._volunteer_as.port,
                                                admission=self._admission, ttl_s=self._ttl_s, now=self._now,
                                                config=self._volunteer_as.config, trusted=self.trusted)
        self._tasks = [asyncio.create_task(self.selftest.run(self._someone_to_ask), name="reach-selftest"),
                       asyncio.create_task(self.relaying.hold(self._private, self._not_private, self._view_change),
                                           name="reach-relaying")]
        for task in self._tasks:
            task.add_done_callback(_log_failure)

    async def aclose(self) -> None:
        await cancel_all(self._tasks, what="reach")
        await self.relaying.release()
        if self.relay_server is not None:
            await self.relay_server.aclose()

    def status(self) -> dict:
        verdict = self.selftest.verdict
        record = self._direct_record()
        hint = private_line(verdict, http_addr=record.http_addr, tcp_addr=record.tcp_addr) \
            if verdict.kind == PRIVATE else ""
        relayed = self.relaying.addresses
        return {**verdict.to_json(), "announced": self.reachability, "hint": hint,
                "dialbacks_answered": self.dialback.answered,
                "relayed_by": {"peer_id": self.relaying.relay_id, "http": relayed[0], "tcp": relayed[1]}
                if relayed else None,
                "relaying_for": self.relay_server.stats() if self.relay_server is not None else None}

    def trusted(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is the run owner, or live in this peer's view for the run's tenure, or
        vouched for by the owner's record (``run.tenure``): whom the self-test asks and a relay
        keeps places for."""
        if peer_id == self._owner_id:
            return True
        live = self._view.get(peer_id)
        if live is None:
            return False
        owner = self._view.get(self._owner_id) if self._owner_id else None
        vouched = frozenset(owner.record.tenured) if owner is not None else frozenset()
        return is_tenured(live, now=self._now(), tenure_s=self._tenure_s, vouched=vouched)

    def _probe(self) -> tuple[PeerRecord, bytes]:
        record = self._direct_record()
        return record, seal_record(self._identity, record)

    def _candidates(self) -> list[PeerRecord]:
        return [p.record for p in self._view.live(now=self._now()) if p.record.peer_id != self._identity.peer_id]

    def _verdict_changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        self._announce_change()

    def _announce_change(self) -> None:
        self._announce()
        relayed = self.relaying.addresses
        self._notify({"reachability": self.reachability, "verdict": self.selftest.verdict.kind,
                      "relayed_by": self.relaying.relay_id if relayed else ""})

    async def _until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def _private(self) -> None:
        await self._until(lambda: self.selftest.verdict.kind == PRIVATE)

    async def _not_private(self) -> None:
        await self._until(lambda: self.selftest.verdict.kind != PRIVATE)

    async def _someone_to_ask(self) -> None:
        async with self._view_refreshed:
            await self._view_refreshed.wait_for(lambda: bool(self._candidates()))

    async def _view_change(self) -> None:
        async with self._view_refreshed:
            await self._view_refreshed.wait()
