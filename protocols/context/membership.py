"""``Ring``: which live cp-shards a shard would plan a step with, in peer-id order (the lowest
leads), and the peers it suspects: left out until their signed record is renewed, for longer
after each failure that is not followed by a completed step."""

from __future__ import annotations

from collections import Counter

from gossamer.peer.role import RoleContext
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.context import names

MAX_SUSPICION_S = 300.0


class Ring:
    """One shard's view of the ring: the live cp-shards, the leader, the suspects."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self.me = ctx.identity.peer_id
        self._suspects: dict[str, float] = {}  # peer -> left out while its record is no newer than this
        self._strikes: Counter[str] = Counter()  # failures of each peer since its last completed step

    def live(self, peer_id: str) -> LivePeer | None:
        """The live record of ``peer_id`` if it is a cp-shard; None otherwise."""
        live = self.ctx.view.get(peer_id)
        return live if live is not None and names.SHARD in live.record.roles else None

    def shards(self) -> list[LivePeer]:
        """The other live cp-shards, sorted by peer id."""
        return [p for p in self.ctx.view.live(now=self.ctx.now())
                if names.SHARD in p.record.roles and p.record.peer_id != self.me]

    def candidates(self) -> list[str]:
        """This shard and every live cp-shard it does not suspect, sorted by peer id."""
        ids = {self.me}
        for peer in self.shards():
            until = self._suspects.get(peer.record.peer_id)
            if until is not None and peer.record.timestamp > until:
                del self._suspects[peer.record.peer_id]  # it has renewed its record since: alive
                until = None
            if until is None:
                ids.add(peer.record.peer_id)
        return sorted(ids)

    def leader(self) -> str:
        return self.candidates()[0]

    def suspect(self, peer_id: str) -> None:
        """Leave ``peer_id`` out of plans until it renews its signed record: a dead peer never
        does, a live one within a heartbeat. A peer that fails again before it completes a step
        is left out for 1, 3, 7, ... heartbeats more (at most ``MAX_SUSPICION_S``), so a peer that
        accepts plans but never computes cannot stall every step."""
        self._strikes[peer_id] += 1
        backoff_s = min(MAX_SUSPICION_S, self.ctx.manifest.config.heartbeat_s * (2 ** (self._strikes[peer_id] - 1) - 1))
        live = self.ctx.view.get(peer_id)
        self._suspects[peer_id] = (live.record.timestamp if live is not None else self.ctx.now()) + backoff_s

    def trust(self, peer_id: str) -> None:
        """``peer_id`` was suspected wrongly (a live peer below this shard's choice leads)."""
        self._suspects.pop(peer_id, None)

    def cleared(self, members: tuple[str, ...]) -> None:
        """``members`` completed a step with this shard: their failures are forgotten."""
        for member in members:
            self._strikes.pop(member, None)
