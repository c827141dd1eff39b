"""Relays from the peer's side: ``volunteer`` serves a relay for the run's own, proven, private peers
(``--relay``); ``Relaying`` keeps a private peer reachable through a volunteer, tries another when
one goes, and falls back to its direct addresses meanwhile (README.md of peer, "reach.relaying")."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from gossamer.crypto.identity import Identity
from gossamer.peer.errors import RecordRejected
from gossamer.peer.reach.dialback import claimed_peer_id, split_addr
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import PRIVATE, PUBLIC, RELAYED, UNKNOWN, PeerRecord, open_record
from gossamer.transport.errors import TransportError
from gossamer.transport.logs import ThrottledLog
from gossamer.transport.relay import RelayClient, RelayConfig, RelayRefused, RelayServer

log = logging.getLogger(__name__)
refusals = ThrottledLog(log)


async def volunteer(*, name: str, host: str, port: int, admission: Admission, ttl_s: float,
                    now: Callable[[], float], config: RelayConfig,
                    trusted: Callable[[str], bool] = lambda peer_id: False) -> RelayServer:
    """A relay called ``name`` (the volunteer's peer id) for the run's private peers (each allocation
    carries the peer's signed, admitted record, whose self-test says ``private``, and its key's answer
    to the relay's challenge); ``trusted`` (tenured or vouched for) may take the places that peers
    nobody vouches for cannot (``RelayConfig.max_untrusted_peers``)."""

    def authorize(auth: bytes) -> str:
        try:
            record = open_record(auth, subkey=claimed_peer_id(auth), now=now(), ttl_s=ttl_s)
            admission.check(record, now=now())
        except RecordRejected as exc:
            raise RelayRefused(f"not a peer of this run: {exc}") from exc
        if record.reachability not in (PRIVATE, RELAYED):
            raise RelayRefused(f"this relay serves only peers whose own self-test says private; your record says "
                               f"{record.reachability!r}")
        return record.peer_id

    return await RelayServer.create(name=name, host=host, port=port, config=config, authorize=authorize,
                                    trusted=trusted, now=now)


class Relaying:
    """A private peer's hold on one relay at a time; see the module docstring."""

    def __init__(self, *, identity: Identity, candidates: Callable[[], list[PeerRecord]], auth: Callable[[], bytes],
                 targets: Callable[[], list[tuple[str, int]]], on_change: Callable[[], None],
                 now: Callable[[], float] = time.time, rest_s: float = 30.0) -> None:
        self._identity = identity
        self._my_id = identity.peer_id
        self._now = now
        self._candidates = candidates
        self._auth = auth
        self._targets = targets
        self._on_change = on_change
        self._rest_s = rest_s
        self._failed: dict[str, float] = {}
        self._rng = random.Random()
        self.client: RelayClient | None = None
        self.relay_id = ""
        self._relay_host = ""

    @property
    def addresses(self) -> tuple[str, str] | None:
        """(http_addr, tcp_addr) through the relay, or None while this peer has no relay."""
        if self.client is None or self.client.closed.done():
            return None
        http_port, tcp_port = self.client.ports
        return f"{self._relay_host}:{http_port}", f"{self._relay_host}:{tcp_port}"

    def relays(self) -> list[PeerRecord]:
        """Volunteers to try now: not known to be private, not this peer, not resting after a failure
        (a volunteer whose own reachability is not checked yet is tried: a run's first peer often is)."""
        now = time.monotonic()
        return [r for r in self._candidates() if r.relay and r.reachability in (PUBLIC, UNKNOWN)
                and r.peer_id != self._my_id
                and now - self._failed.get(r.peer_id, -1e9) >= self._rest_s]

    async def hold(self, wanted: Callable[[], Awaitable[None]], unwanted: Callable[[], Awaitable[None]],
                   someone_new: Callable[[], Awaitable[None]]) -> None:
        """Forever: once ``wanted`` returns, keep a relay until ``unwanted`` returns."""
        while True:
            await wanted()
            if not await self._acquire():
                await someone_new()
                continue
            assert self.client is not None
            lost = asyncio.ensure_future(self.client.closed)
            done = asyncio.ensure_future(unwanted())
            try:
                await asyncio.wait([lost, done], return_when=asyncio.FIRST_COMPLETED)
            finally:
                done.cancel()
            if lost.done():
                log.warning("relay %s went away; looking for another", self.relay_id[:12])
                self._failed[self.relay_id] = time.monotonic()
            await self.release()

    async def _acquire(self) -> bool:
        for record in sorted(self.relays(), key=lambda _r: self._rng.random()):
            host, port = split_addr(record.relay)
            try:
                client = await RelayClient.connect((host, port), relay_name=record.peer_id, identity=self._identity,
                                                   auth=self._auth(), targets=self._targets(), now=self._now)
            except TransportError as exc:  # any record may name a relay: throttled
                refusals.info("relay %s (%s) refused or unreachable: %s", record.peer_id[:12], record.relay, exc)
                self._failed[record.peer_id] = time.monotonic()
                continue
            self.client, self.relay_id, self._relay_host = client, record.peer_id, host
            log.info("reachable through relay %s at %s", record.peer_id[:12], ", ".join(self.addresses or ()))
            self._on_change()
            return True
        return False

    async def release(self) -> None:
        client, self.client, self.relay_id = self.client, None, ""
        if client is not None:
            await client.aclose()
            self._on_change()
