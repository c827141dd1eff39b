"""How a learner gets in step with the swarm: round 0 waits until ``min_learners`` learners are live
(or ends at once when the run owner's record says the run had finished, ``run_round``); a learner
that joins mid-run downloads the swarm's state; one that finds itself ``catch_up_rounds`` behind
the median round of its peers adopts their state, and one that raced ahead waits for them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gossamer.peer.kit.download_events import downloading_fields
from gossamer.peer.kit.state_join import download_state
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.core.models import flat_parameters
from gossamer.protocols.diloco.steering import out_of_step

if TYPE_CHECKING:
    from gossamer.protocols.diloco.learner import LearnerRole

log = logging.getLogger(__name__)


class Joining:
    """The joining half of ``LearnerRole`` (see the module docstring)."""

    async def _join_mid_run(self: LearnerRole) -> None:
        """Download the swarm's state when it is past round 0. Records lag the rounds they
        describe (a store takes a while on a loaded host, and rounds can be shorter), so a donor
        may have moved on from the version its record offers before the download ends: then try
        again once the records change, for up to ``catch_up_rounds`` W2 deadlines, rather than
        start from round 0 and drag the swarm's rounds back until a catch-up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.catch_up_rounds * self.settings.w2_deadline_s
        while True:
            offers = self._offered_versions()
            if not any(version > 0 for version in offers.values()):
                return
            last_try = loop.time() >= deadline
            if await self._adopt_state(self._other_learners(), why="joined", last_try=last_try) or last_try:
                return
            await self.ctx.until_view(lambda offers=offers: self._offered_versions() != offers,
                                      timeout_s=max(0.0, deadline - loop.time()))

    def _offered_versions(self: LearnerRole) -> dict[str, int]:
        """The state version each other learner's record offers."""
        return {p.record.peer_id: version for p in self._other_learners()
                if isinstance(version := p.record.state.get("version", 0), int)}

    async def _wait_for_learners(self: LearnerRole) -> bool:
        """Round 0 starts once ``min_learners`` learners (this one included) are live, so learners
        started together begin in step instead of the first one racing ahead alone. False when
        the run owner's record says the run had already finished (its learners have left)."""
        wanted = self.settings.min_learners

        def ready() -> bool:
            return len(self._learners()) >= wanted or self._run_finished_at() is not None

        while not ready():
            have = len(self._learners())
            log.info("waiting for learners before round 0: %d of %d live", have, wanted)
            self.emit("waiting", learners=have, wanted=wanted)
            await self.ctx.until_view(ready, timeout_s=10.0)
        self.ended_before_join = self._run_finished_at()
        if self.ended_before_join is not None:
            self.finished = True
            log.warning("the run had finished at round %d before this learner came (its learners have left); "
                        "nothing to train", self.ended_before_join)
            return False
        return True

    def _run_finished_at(self: LearnerRole) -> int | None:
        """The round the run finished at, if its owner's record says it did (``run_round``, the
        highest round its members announced, reached ``hyper.rounds``); None otherwise."""
        owner = self.ctx.view.get(self.ctx.manifest.owner_peer_id)
        rounds = self.settings.rounds
        if rounds and owner is not None and owner.record.run_round >= rounds:
            return owner.record.run_round
        return None

    async def _catch_up(self: LearnerRole) -> None:
        """Get back in step when ``catch_up_rounds`` or more away from the median round of the
        learners. Out of step, every message a learner sends or expects is for a round its peers
        have left or not reached, and each of its rounds costs them a full W2 deadline.

        Behind (a stalled host): adopt the swarm's state. Donors are the learners at or just past
        the median, so one peer advertising a far-off round cannot pull anyone to it. Ahead (one
        that raced on alone): wait for the others to come within reach, at most ``catch_up_rounds``
        W2 deadlines, rather than throw its progress away; records lag the rounds they describe,
        so peers can look further behind than they are, and the wait ends as soon as they do not.
        """
        target = self._out_of_step()
        if target is None:
            return
        if target < self.replica.round:
            await self._wait_for_the_swarm(target)
            return
        band = range(target, target + self.settings.catch_up_rounds)
        donors = [p for p in self._other_learners()
                  if p.record.round in band and p.record.state.get("version") in band]
        await self._adopt_state(donors, why=f"caught up ({target - self.replica.round} rounds behind the median "
                                            f"of the learners)")

    async def _wait_for_company(self: LearnerRole) -> None:
        """Mid-run with no other learner in view (this host was stalled and the records it holds
        lapsed meanwhile, or the others are restarting): wait up to ``catch_up_rounds`` W2 deadlines
        for one to show up, once per such spell, rather than race through rounds alone (each
        round then costs nothing) and come back far ahead of the swarm it was in step with."""
        if self.replica.round == 0 or self.settings.min_learners <= 1 or self._other_learners():
            self.alone_waited = False
            return
        if self.alone_waited:
            return
        self.alone_waited = True
        limit_s = self.settings.catch_up_rounds * self.settings.w2_deadline_s
        log.info("no other learner in view at round %d; waiting up to %.0f s for one", self.replica.round, limit_s)
        self.emit("waiting", learners=1, wanted=self.settings.min_learners)
        await self.ctx.until_view(lambda: bool(self._other_learners()), timeout_s=limit_s)

    def _out_of_step(self: LearnerRole) -> int | None:
        return out_of_step(self.replica.round, [p.record.round for p in self._other_learners()],
                           threshold=self.settings.catch_up_rounds)

    async def _wait_for_the_swarm(self: LearnerRole, target: int) -> None:
        limit_s = self.settings.catch_up_rounds * self.settings.w2_deadline_s
        log.info("%d rounds ahead of the median of the learners (round %d); waiting up to %.0f s for them",
                 self.replica.round - target, target, limit_s)
        self.emit("ahead", round=self.replica.round, median=target, wait_s=limit_s)
        def in_reach() -> bool:
            target = self._out_of_step()
            return target is None or target > self.replica.round

        await self.ctx.until_view(in_reach, timeout_s=limit_s)

    async def _adopt_state(self: LearnerRole, donors: list[LivePeer], *, why: str, last_try: bool = True) -> bool:
        """Download and adopt the donors' state; False (and this learner's own state kept) when
        no donor served it, which ``last_try`` logs as a warning."""
        try:
            version, tensors, report = await download_state(
                self.ctx.http_client, donors, joiner_id=self.ctx.identity.peer_id,
                progress=lambda progress: self.emit("downloading", **downloading_fields(progress)))
        except StateSyncError as exc:
            if last_try:
                log.warning("could not download the run's state, going on from our own: %s", exc)
            else:
                log.info("could not download the run's state (%s); trying again once the records change", exc)
            return False
        self.replica.adopt(tensors, version)
        self._snapshot = (version, flat_parameters(self.replica.module))
        self.ctx.announce()
        self.emit("adopted", round=version, donors=len(report.shards_served), why=why)
        log.info("%s at round %d with state from %d donor(s)", why, version, len(report.shards_served))
        return True
