"""How an expert host becomes a member of the swarm: at round 0 with the others, or later as a
joiner (a new peer, or one that was cut off and starts over).

Round 0 waits until ``min_hosts`` expert hosts are live; each places the experts on the live
hosts it sees, from the run's seed (hosts that saw different sets find out at the first commit:
the odd ones out are cut off and join), and starts once the others' records say they have placed
too (so none refuses its first update as coming from a peer it has not seen yet).

A joiner, once some host's record shows a finished round: takes the members' median round from
their records, t = that + 1 (records lag behind the rounds, and a member lists only the joiners
that asked before it committed), and sends ``PUT /fomoe/join/t`` to each member not yet past t.
The members list it in their round-t commits and send them to it too; it is admitted when every member of round t sent it a
commit listing it (``boundary.admit``), and from the commits it computes exactly what the members
compute: round t's placement (from the resident sets in the commits), the agreed members, the
placement of round t + 1 and its transfers. Its new experts arrive as ``expert`` messages from
their holders; the dense part and its outer momentum it downloads from several agreed members at
once (``kit.state_join``: the state they donate at round t + 1's start, verified against the
digest they sign into their records). It then starts round t + 1 with the others. A joiner that is
not admitted (a member missed its request) tries again at the next round.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from gossamer.peer.kit.download_events import downloading_fields
from gossamer.peer.kit.ledger import Exchange
from gossamer.peer.kit.rounds import send_each
from gossamer.peer.kit.state_join import download_state
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.fomoe import names
from gossamer.protocols.fomoe.core import ExpertState
from gossamer.protocols.fomoe.core.boundary import Boundary, admit
from gossamer.protocols.fomoe.wire import COMMIT, MOMENTUM, PARAM, ExpertMessageRefused

if TYPE_CHECKING:
    from gossamer.protocols.fomoe.host import ExpertHostRole

log = logging.getLogger(__name__)
JOIN_WAIT_ROUNDS = 4
"""A joiner waits for round t's commits at most this many rounds' deadlines (the members' inner
phase has no deadline of its own; the wait ends as soon as every member has moved on)."""


class Joining:
    """The joining half of ``ExpertHostRole`` (see the module docstring)."""

    async def _enter(self: ExpertHostRole) -> bool:
        """Become a member: at round 0 with the others, or as a joiner. False: the run is over."""
        if self._swarm_started():
            return await self._join(why="joined")
        await self._wait_for_hosts()
        if self._swarm_started():
            return await self._join(why="joined")
        self._genesis()
        await self._until_placed()
        return True

    async def _until_placed(self: ExpertHostRole) -> None:
        """Before round 0's first message: wait until every other member's record says it has
        placed the experts too. It placed only once it saw this host in its view, so it will not
        refuse this host's update as coming from an unknown peer (the last host to start sees the
        others at once and would otherwise send before they have seen it). Bounded by the update
        deadline; a member that never shows up is dealt with by the round's commits."""
        assert self.placement is not None
        others = [p for p in self.placement.peers if p != self.peer_id]

        def placed() -> bool:
            return all((live := self.live_with(p, names.EXPERT_HOST)) is None
                       or _count(live.record.assignment.get("members")) > 0 for p in others)

        await self.ctx.until_view(placed, timeout_s=self.settings.update_deadline_s)

    def _members_seen(self: ExpertHostRole) -> list[LivePeer]:
        """The other live expert hosts that say they are members of a placement."""
        return [p for p in self.peers_with(names.EXPERT_HOST) if _count(p.record.assignment.get("members")) > 0]

    def _swarm_started(self: ExpertHostRole) -> bool:
        return any(p.record.round >= 1 for p in self._members_seen())

    async def _wait_for_hosts(self: ExpertHostRole) -> None:
        """Round 0 starts once ``min_hosts`` expert hosts (this one included) are live."""
        wanted = self.settings.min_hosts

        def enough() -> bool:
            return len(self.peer_ids_with(names.EXPERT_HOST, include_self=True)) >= wanted

        while not enough():
            self.emit("waiting", hosts=len(self.peer_ids_with(names.EXPERT_HOST, include_self=True)), wanted=wanted)
            await self.ctx.until_view(enough, timeout_s=10.0)

    async def _join(self: ExpertHostRole, *, why: str) -> bool:
        """Join the running swarm (trying round after round); False when the run is over first."""
        while True:
            members = self._members_seen()
            if not members:  # nobody left to join: start over with whoever is live
                await self._wait_for_hosts()
                if not self._members_seen():
                    self._genesis()
                    return True
                continue
            median = statistics.median_high([p.record.round for p in members])
            t = median + 1  # records lag behind the rounds: ask for the next one, which is not committed yet
            if self.settings.rounds and t >= self.settings.rounds:
                log.info("the swarm is finishing its %d rounds; not joining", self.settings.rounds)
                return False
            if await self._try_join(t, [p.record.peer_id for p in members if p.record.round <= t], why=why):
                return True
            await self._until_past(t)

    async def _until_past(self: ExpertHostRole, t: int) -> None:
        """After a try at round ``t`` failed: wait until the members' median round is past ``t``
        (or none is left), so the next try is at the next round and not at ``t`` again."""
        s = self.settings

        def moved_on() -> bool:
            rounds = [p.record.round for p in self._members_seen()]
            return not rounds or statistics.median_high(rounds) > t

        await self.ctx.until_view(moved_on, timeout_s=JOIN_WAIT_ROUNDS * (s.update_deadline_s + s.commit_deadline_s))

    async def _try_join(self: ExpertHostRole, t: int, ids: Sequence[str], *, why: str) -> bool:
        s = self.settings
        self.inbox.advance(t)
        await send_each(self.messenger, self.ctx.view, {m: {} for m in ids}, path=f"/fomoe/join/{t}", round=t,
                        exchange=Exchange())

        def heard() -> bool:
            have = self.inbox.senders(COMMIT, t)
            return all(m in have or (live := self.live_with(m, names.EXPERT_HOST)) is None or live.record.round > t
                       for m in ids)

        await self.ctx.until_view(heard, timeout_s=JOIN_WAIT_ROUNDS * (s.update_deadline_s + s.commit_deadline_s))
        commits = await self.inbox.collect(COMMIT, t, ids, timeout_s=0.0)  # heard(): all came, or never will
        admitted = admit(self.peer_id, commits, n_experts=s.model.n_experts, replication=s.fomoe.replication,
                         round=t, seed=s.seed)
        if isinstance(admitted, str):
            log.info("not admitted at round %d (%s); trying the next round", t, admitted)
            return False
        outcome, boundary = admitted
        states = await self._take_experts(boundary, t + 1, None)
        downloaded = await self._download_dense(t + 1, outcome.agreed)
        if downloaded is None:
            return False
        tensors, donors = downloaded
        try:
            self._adopt(t + 1, tensors, boundary, states)
        except ExpertMessageRefused as exc:
            log.warning("the downloaded state does not fit the model, trying again: %s", exc)
            return False
        self.emit("joined", round=t + 1, donors=donors, experts=sorted(self.replica.resident), why=why)
        log.info("%s at round %d with the dense state from %d donor(s), experts %s", why, t + 1, donors,
                 sorted(self.replica.resident))
        return True

    async def _download_dense(self: ExpertHostRole, version: int,
                              agreed: Sequence[str]) -> tuple[dict[str, torch.Tensor], int] | None:
        """The dense part and its momentum at ``version``, from every agreed member offering it:
        shards from several donors (each checked against the digest they agree on), so no single
        host serves the whole state. It waits (at most an update deadline) for every agreed member
        to announce that version, then takes those that have."""
        others = {a for a in agreed if a != self.peer_id}

        def offers() -> list[LivePeer]:
            return [p for p in self.peers_with(names.EXPERT_HOST)
                    if p.record.peer_id in others and p.record.state.get("version") == version]

        await self.ctx.until_view(lambda: len(offers()) >= len(others), timeout_s=self.settings.update_deadline_s)
        try:
            got, tensors, report = await download_state(
                self.ctx.http_client, offers(), joiner_id=self.peer_id,
                progress=lambda progress: self.emit("downloading", **downloading_fields(progress)))
        except StateSyncError as exc:
            log.warning("could not download the dense state of round %d: %s", version, exc)
            return None
        if got != version:
            return None
        return tensors, sum(1 for shards in report.shards_served.values() if shards)

    def _adopt(self: ExpertHostRole, version: int, tensors: Mapping[str, torch.Tensor], boundary: Boundary,
               states: Mapping[int, ExpertState]) -> None:
        """Take the swarm's dense part and momentum at ``version`` and this peer's new experts."""
        dense = self.replica.layout.dense
        missing = [n for n in dense if PARAM + n not in tensors]
        if missing:
            raise ExpertMessageRefused(f"state: dense parameters missing: {missing[:4]}")
        for name in dense:
            self.shape.check(name, tensors[PARAM + name], "state")
            if MOMENTUM + name in tensors:
                self.shape.check(name, tensors[MOMENTUM + name], "state")
        params = self.replica.diloco.parameters_snapshot()
        params.update({n: tensors[PARAM + n] for n in dense})
        self.replica.set_resident((), {})  # whatever it held before is stale now
        self.replica.diloco.adopt(params, version)
        own = dict(self.replica.module.named_parameters())
        self.replica.diloco.outer.load_state_dict({n: tensors[MOMENTUM + n].to(own[n].device)
                                                   for n in dense if MOMENTUM + n in tensors})
        self._hold(boundary.placement, states, lost=boundary.lost)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
