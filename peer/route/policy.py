"""Which next hops a host forwards to: live peers of the run announcing the units asked of them.

A route comes from the client, so a host never connects to an address just because a frame names
it: the next hop must be the TCP address of a live, admitted peer with ``role`` whose record
announces every unit of the hop under ``assignment[key]``.

The policy remembers every verified record it has seen (from this peer's view, and from its own
reads of the DHT) until the record's TTL runs out: one DHT read that comes back incomplete (it
happens while some node of the swarm is stalled) must not make a live host look gone. A host that
started a moment ago may not be in this peer's view yet; on a miss the run's records are read
from the DHT once more, at most every ``RELOOK_S``, before the hop is refused.
"""

from __future__ import annotations

import time

from gossamer.peer.role import RoleContext, peers_key
from gossamer.peer.route.wire import Hop
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import PeerRecord
from gossamer.peer.run.view import PeerView
from gossamer.transport.errors import TransportError

RELOOK_S = 0.5


class LiveHopPolicy:
    """``await policy(hop)`` -> None to forward, or the reason not to."""

    def __init__(self, ctx: RoleContext, *, role: str, key: str) -> None:
        self._ctx = ctx
        self._role = role
        self._key = key
        self._records: dict[str, PeerRecord] = {}
        self._looked_at = -1e9

    async def __call__(self, hop: Hop) -> str | None:
        self._remember(self._ctx.view)
        reason = self._check(hop)
        if reason is None or time.monotonic() - self._looked_at < RELOOK_S:
            return reason
        self._looked_at = time.monotonic()
        manifest = self._ctx.manifest
        fresh = PeerView(Admission(manifest), ttl_s=manifest.ttl_s)
        try:
            fresh.update(await self._ctx.membership.get_all(peers_key(manifest.run_id)), now=self._ctx.now())
        except TransportError as exc:
            return f"{reason} (and reading the DHT again failed: {exc})"
        self._remember(fresh)
        return self._check(hop)

    def _remember(self, view: PeerView) -> None:
        now, ttl_s = self._ctx.now(), self._ctx.manifest.ttl_s
        for peer in view.live(now=now):
            known = self._records.get(peer.record.peer_id)
            if known is None or peer.record.timestamp >= known.timestamp:
                self._records[peer.record.peer_id] = peer.record
        for peer_id in [p for p, record in self._records.items() if now - record.timestamp > ttl_s]:
            del self._records[peer_id]

    def _check(self, hop: Hop) -> str | None:
        for record in self._records.values():
            if record.tcp_addr == hop.addr and self._role in record.roles:
                served = record.assignment.get(self._key, [])
                missing = [u for u in hop.units if u not in served]
                return f"{hop.addr} does not announce {self._key} {missing}" if missing else None
        return f"{hop.addr} is not a live {self._role} of run {self._ctx.manifest.run_id}"
