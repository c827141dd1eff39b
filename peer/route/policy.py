"""Which next hops a host forwards to: only the TCP address of a live, admitted, dialable peer whose
record announces the units asked of it; verified records are remembered until their TTL, and a
miss reads the DHT again at most every ``RELOOK_S`` (README.md of peer, "route.policy")."""

from __future__ import annotations

import time
from collections.abc import Callable

from gossamer.peer.route.wire import Hop
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.keys import peers_key
from gossamer.peer.run.manifest import Manifest
from gossamer.peer.run.records import PeerRecord
from gossamer.peer.run.view import PeerView
from gossamer.transport.dht import DhtMembership
from gossamer.transport.errors import TransportError

RELOOK_S = 0.5


class LiveHopPolicy:
    """``await policy(hop)`` -> None to forward, or the reason not to."""

    def __init__(self, *, view: PeerView, manifest: Manifest, membership: DhtMembership, now: Callable[[], float],
                 role: str, key: str) -> None:
        self._view = view
        self._manifest = manifest
        self._membership = membership
        self._now = now
        self._role = role
        self._key = key
        self._records: dict[str, PeerRecord] = {}
        self._looked_at = -1e9

    async def __call__(self, hop: Hop) -> str | None:
        self._remember(self._view)
        reason = self._check(hop)
        if reason is None or time.monotonic() - self._looked_at < RELOOK_S:
            return reason
        self._looked_at = time.monotonic()
        manifest = self._manifest
        fresh = PeerView(Admission(manifest), ttl_s=manifest.ttl_s)
        try:
            fresh.update(await self._membership.get_all(peers_key(manifest.run_id)), now=self._now())
        except TransportError as exc:
            return f"{reason} (and reading the DHT again failed: {exc})"
        self._remember(fresh)
        return self._check(hop)

    def _remember(self, view: PeerView) -> None:
        now, ttl_s = self._now(), self._manifest.ttl_s
        for peer in view.live(now=now):
            known = self._records.get(peer.record.peer_id)
            if known is None or peer.record.timestamp >= known.timestamp:
                self._records[peer.record.peer_id] = peer.record
        for peer_id in [p for p, record in self._records.items() if now - record.timestamp > ttl_s]:
            del self._records[peer_id]

    def _check(self, hop: Hop) -> str | None:
        for record in self._records.values():
            if record.tcp_addr == hop.addr and self._role in record.roles:
                if not record.reachable:
                    return f"{hop.addr} is a private peer and no relay reaches it: it is not dialled"
                served = record.assignment.get(self._key, [])
                missing = [u for u in hop.units if u not in served]
                return f"{hop.addr} does not announce {self._key} {missing}" if missing else None
        return f"{hop.addr} is not a live {self._role} of run {self._manifest.run_id}"


def live_hop_policy(ctx, *, role: str, key: str) -> LiveHopPolicy:
    """The policy of a role with context ``ctx`` (a ``RoleContext``) serving ``role``'s ``key`` units."""
    return LiveHopPolicy(view=ctx.view, manifest=ctx.manifest, membership=ctx.membership, now=ctx.now,
                         role=role, key=key)
