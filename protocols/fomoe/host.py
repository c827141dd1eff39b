"""Role ``expert-host``: a FoMoE peer holding the dense layers, the routers and a resident subset
of the experts. Every round it trains on its shard (skipping pairs routed to experts it does not
hold), exchanges updates and commits with the members, mixes what they agreed on, and re-places
the experts when members leave or join; ``README.md`` walks a round and joining.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from aiohttp import web

from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.download_events import downloading_fields
from gossamer.peer.kit.inbox import Inbox
from gossamer.peer.kit.ledger import Exchange, History
from gossamer.peer.kit.messaging import SignedMessenger
from gossamer.peer.kit.rounds import collect_from_live, finish_sends, send_each
from gossamer.peer.kit.state_join import download_state
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import Failure
from gossamer.protocols.core.text_data import BatchSampler, load_text, shard, split_text
from gossamer.protocols.fomoe import names
from gossamer.protocols.fomoe.core import (
    ExpertState,
    FomoeReplica,
    FomoeUpdate,
    MixedRound,
    PairLimits,
    Placement,
    StepReport,
    addressed_to,
    build_moe_model,
    place_experts,
    update_bytes,
    update_problem,
)
from gossamer.protocols.fomoe.core import mix_round as mix
from gossamer.protocols.fomoe.core.boundary import Boundary, Commit, admit, agree, plan_boundary
from gossamer.protocols.fomoe.coverage import expert_coverage
from gossamer.protocols.fomoe.ledger import RoundLedger
from gossamer.protocols.fomoe.settings import FomoeSettings
from gossamer.protocols.fomoe.wire import (
    COMMIT,
    EXPERT,
    JOIN,
    KINDS,
    MOMENTUM,
    PARAM,
    UPDATE,
    ExpertMessageRefused,
    ModelShape,
    experts_payload,
    params_digest,
    read_experts,
    read_update,
    update_payload,
)

log = logging.getLogger(__name__)
MAX_SERIES = 2000  # points per loss curve kept for the swarm page
JOIN_WAIT_ROUNDS = 4
"""A joiner waits for round t's commits at most this many rounds' deadlines (the members' inner
phase has no deadline of its own; the wait ends as soon as every member has moved on)."""
Part = tuple[int, dict[str, torch.Tensor], tuple[int, ...]]
"""(round, the dense part's and the resident experts' parameters, the resident experts)."""


class ExpertHostRole(ProtocolRole[FomoeSettings]):
    """A FoMoE expert host: its rounds, how it becomes a member, and the experts it holds."""

    name = names.EXPERT_HOST

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        s, text = self.settings, self.settings.text
        split = split_text(load_text(ctx.config.data or text.data_source), heldout_fraction=text.heldout_fraction)
        self.shard = self.shard_index(text.num_shards)
        self.heldout = split.heldout
        model = build_moe_model(s.model, seed=text.seed, device=ctx.device)
        self.replica = FomoeReplica(self.peer_id, model, (), diloco=s.diloco, fomoe=s.fomoe)
        self.shape = ModelShape(self.replica.layout, {n: p.dtype for n, p in model.named_parameters()})
        self.sampler = BatchSampler(shard(split.train, index=self.shard, count=text.num_shards),
                                    batch_size=text.batch_size, context=s.model.context,
                                    generator=torch.Generator().manual_seed(self.peer_seed()))
        self.messenger = SignedMessenger(identity=ctx.identity, run_id=ctx.manifest.run_id, client=ctx.http_client,
                                         view=ctx.view, now=ctx.now, limits=ctx.http_config.limits,
                                         max_body_bytes=min(ctx.http_config.max_body_bytes,
                                                            self.shape.max_message_bytes))
        self.dense_aggregator, self.expert_aggregator = s.aggregators()
        self.pair_limits: PairLimits | None = s.pair_limits()  # an update claiming more pairs than a host can run is refused
        self.inbox: Inbox[Any] = Inbox()
        self.history: History[int, RoundLedger] = History()
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id, format="gossamer/fomoe")
        self.placement: Placement | None = None  # None while joining
        self.synced = [0] * s.model.n_experts  # per expert: the round at whose start our copy was in sync
        self.lost: tuple[int, ...] = ()  # experts the last re-placement found without an agreed holder
        self.tokens = [0] * s.model.n_experts  # pairs each expert ran in the last round, all members
        self._donated = (0, self._dense_state())
        self._received_bytes: dict[int, int] = {}
        self.finished = False
        self.checkpoint_path = ""
        self.series: dict[str, list[list[float]]] = {"train_loss": [], "heldout_loss": []}  # the swarm page's curves
        self._boundary: Part | None = None  # at the round's start

    # -- role interface -------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.put("/fomoe/{kind}/{round}", self._receive)]

    async def start(self) -> None:
        self.spawn(self._run(), name="rounds")

    @property
    def round(self) -> int:
        return self.replica.round

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]]:
        return self._donated

    def status(self) -> dict[str, Any]:
        last = self.history.last(1)
        placement = self.placement
        assignment: dict[str, Any] = {"experts": sorted(self.replica.resident) if placement else [],
                                      "n_experts": self.settings.model.n_experts,
                                      "replication": self.settings.fomoe.replication,
                                      "placement_round": placement.round if placement else -1,
                                      "members": len(placement.peers) if placement else 0,
                                      "tokens": list(self.tokens), "lost": list(self.lost)}
        return {"round": self.round, "shard": self.shard, "member": placement is not None,
                "assignment": assignment, "finished": self.finished, "checkpoint": self.checkpoint_path,
                "coverage": expert_coverage(placement, self.tokens, self.lost) if placement else [],
                "train_loss": last[0]["train_loss"] if last else None,
                "heldout_loss": last[0]["heldout_loss"] if last else None, "ledgers": self.history.last(3),
                "rounds": self.settings.rounds, "series": self.series}

    def health(self) -> RoleHealth:
        health = super().health()
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"{self.replica.round} rounds; checkpoint {self.checkpoint_path}")
        return health

    def gauges(self) -> dict[str, float]:
        last = self.history.last(1)
        return {"expert_host_heldout_loss": last[0]["heldout_loss"]} if last else {}

    # -- receiving ------------------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> web.Response:
        kind, round_text = request.match_info["kind"], request.match_info["round"]
        if kind not in KINDS or not round_text.isdigit():
            raise web.HTTPNotFound(text="unknown message kind or round")
        round = int(round_text)
        received = await self.messenger.receive(request, sender_role=names.EXPERT_HOST, round=round,
                                                max_body_bytes=self.shape.max_message_bytes)
        sender = received.envelope.sender
        self.ctx.traffic.add_received(kind, received.size_bytes)
        self._received_bytes[round] = self._received_bytes.get(round, 0) + received.size_bytes
        reason = self.inbox.refusal(kind, round, sender)
        if reason is None:
            try:
                item = await asyncio.to_thread(self._read, kind, sender, received.tensors, received.metadata)
            except ExpertMessageRefused as exc:
                reason = str(exc)
            else:
                reason = await self.inbox.put(kind, round, sender, item, size=received.size_bytes)
        if reason is not None:
            self.inbox.note_refusal(kind, round, sender, reason)
            return web.json_response({"accepted": False, "reason": reason}, status=409)
        return web.json_response({"accepted": True})

    def _read(self, kind: str, sender: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Any:
        if kind == UPDATE:
            return read_update(sender, tensors, self.shape)
        if kind == EXPERT:
            return read_experts(tensors, self.shape)
        if tensors:
            raise ExpertMessageRefused(f"{kind}: carries no tensors")
        return Commit.from_metadata(metadata, n_experts=self.settings.model.n_experts) if kind == COMMIT else True

    # -- becoming a member ----------------------------------------------------------------------

    async def _enter(self) -> bool:
        """Become a member: at round 0 with the others, or as a joiner. False: the run is over."""
        if self._swarm_started():
            return await self._join(why="joined")
        await self._wait_for_hosts()
        if self._swarm_started():
            return await self._join(why="joined")
        self._genesis()
        await self._until_placed()
        return True

    async def _until_placed(self) -> None:
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

    def _members_seen(self) -> list[LivePeer]:
        """The other live expert hosts that say they are members of a placement."""
        return [p for p in self.peers_with(names.EXPERT_HOST) if _count(p.record.assignment.get("members")) > 0]

    def _swarm_started(self) -> bool:
        return any(p.record.round >= 1 for p in self._members_seen())

    async def _wait_for_hosts(self) -> None:
        """Round 0 starts once ``min_hosts`` expert hosts (this one included) are live."""
        wanted = self.settings.min_hosts

        def enough() -> bool:
            return len(self.peer_ids_with(names.EXPERT_HOST, include_self=True)) >= wanted

        while not enough():
            self.emit("waiting", hosts=len(self.peer_ids_with(names.EXPERT_HOST, include_self=True)), wanted=wanted)
            await self.ctx.until_view(enough, timeout_s=10.0)

    async def _join(self, *, why: str) -> bool:
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

    async def _until_past(self, t: int) -> None:
        """After a try at round ``t`` failed: wait until the members' median round is past ``t``
        (or none is left), so the next try is at the next round and not at ``t`` again."""
        s = self.settings

        def moved_on() -> bool:
            rounds = [p.record.round for p in self._members_seen()]
            return not rounds or statistics.median_high(rounds) > t

        await self.ctx.until_view(moved_on, timeout_s=JOIN_WAIT_ROUNDS * (s.update_deadline_s + s.commit_deadline_s))

    async def _try_join(self, t: int, ids: Sequence[str], *, why: str) -> bool:
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
                         round=t, seed=s.text.seed)
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

    async def _download_dense(self, version: int,
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

    def _adopt(self, version: int, tensors: Mapping[str, torch.Tensor], boundary: Boundary,
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

    # -- rounds ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        member = await self._enter()
        while member and not self._done():
            if self.placement is None:
                member = await self._join(why="cut off from the swarm")
                continue
            ledger = await self._one_round()
            self.history.add(ledger.round, ledger)
            for key, points in self.series.items():
                points.append([ledger.round, getattr(ledger, key)])
                del points[:-MAX_SERIES]
            self.emit("round", round=ledger.round, rounds=self.settings.rounds, train_loss=ledger.train_loss,
                      heldout_loss=ledger.heldout_loss, skip_fraction=ledger.skip_fraction, experts=ledger.experts, members=len(ledger.members),
                      used=len(ledger.updates.used), timed_out=ledger.updates.timed_out,
                      rejected=ledger.updates.rejected, bytes_sent=ledger.bytes_sent,
                      bytes_received=ledger.bytes_received, note=ledger.note)
        await self._finish()

    def _done(self) -> bool:
        return bool(self.settings.rounds) and self.replica.round >= self.settings.rounds

    def _genesis(self) -> None:
        """Round 0 (or a lone restart): place the experts on the live hosts, from the run's seed."""
        members = self.peer_ids_with(names.EXPERT_HOST, include_self=True)
        s = self.settings
        placement = place_experts(members, n_experts=s.model.n_experts, replication=s.fomoe.replication,
                                  round=self.replica.round, seed=s.text.seed)
        self._hold(placement, {}, lost=())

    async def _one_round(self) -> RoundLedger:
        started, t, me = time.monotonic(), self.replica.round, self.peer_id
        placement = self.placement
        assert placement is not None
        others = [p for p in placement.peers if p != me]
        self.inbox.advance(t)
        for old in [r for r in self._received_bytes if r < t]:
            del self._received_bytes[old]
        ledger = RoundLedger(round=t, members=list(placement.peers), experts=sorted(self.replica.resident))
        self.replica.begin_round()
        self._donated = (t, self._dense_state())
        self._boundary = self._part()
        self.ctx.announce()  # the record's round and state version are t from now on
        digests, reports = await asyncio.to_thread(self._inner_phase)
        ledger.compute_s = time.monotonic() - started
        _summarize_steps(ledger, reports)
        update = self.replica.end_inner()
        own = FomoeUpdate(me, {n: v.detach().cpu() for n, v in update.delta.items()}, update.tokens)
        payloads = {p: update_payload(addressed_to(own, p, placement, self.replica.layout)) for p in others}
        ledger.update_bytes_sent = sum(update_bytes(payload) for payload in payloads.values())
        sending = [self._post(UPDATE, t, payloads, ledger, ledger.updates)]
        commits_due = time.monotonic() + self.settings.update_deadline_s + self.settings.commit_deadline_s
        valid = await self._collect_updates(t, others, placement)
        joiners = sorted(j for j in self.inbox.senders(JOIN, t)
                         if j not in placement.peers and self.live_with(j, names.EXPERT_HOST))
        commit = Commit(placement.peers, tuple(sorted({me, *valid})), tuple(joiners), placement.resident(me),
                        tuple(self.synced), digests[0], digests[1])
        sending.append(self._post(COMMIT, t, {p: {} for p in [*others, *joiners]}, ledger, ledger.commits,
                                  metadata=commit.to_metadata()))
        # a member that waited out the whole update deadline commits that much later: wait for it
        commits = {**await self._collect(COMMIT, t, others, commits_due - time.monotonic()), me: commit}
        outcome = agree(me, placement, commits)
        _settle(ledger, others, valid, commits, outcome, self.inbox.refused(UPDATE, t), self.inbox.refused(COMMIT, t))
        if outcome.cut_off:
            self._skip_round()
            ledger.note = (f"cut off: {len(outcome.agreed)} of {len(placement.peers)} members agreed"
                           f"{'' if me in outcome.agreed else ', without this peer'}; joining again")
            self.placement = None
        else:
            updates = [own, *(valid[p] for p in outcome.agreed if p != me)]
            failures = [Failure(p, "not agreed") for p in placement.peers if p not in outcome.agreed]
            ledger.note = await asyncio.to_thread(self._mix_and_step, updates, failures, placement, ledger)
            for expert in self.replica.resident:
                self.synced[expert] = t + 1
            ledger.tokens = [int(x) for x in sum(u.tokens for u in updates).sum(dim=0)]
            self.tokens = ledger.tokens
            boundary = plan_boundary(placement, outcome, commits, round=t + 1, seed=self.settings.text.seed)
            if boundary.changed:
                await self._move_experts(boundary, ledger, sending)
        ledger.heldout_loss = await asyncio.to_thread(self._evaluate)
        await finish_sends(sending, timeout_s=self.settings.update_deadline_s)
        if ledger.updates.send_failures:
            failed = ledger.updates.send_failures
            peer, reason = next(iter(failed.items()))
            ledger.note += f" update not delivered to {len(failed)} member(s) ({peer[:12]}: {reason[:120]})"
        ledger.bytes_received = self._received_bytes.get(t, 0)
        ledger.wall_s = time.monotonic() - started
        return ledger

    def _inner_phase(self) -> tuple[tuple[str, tuple[str, ...]], list[StepReport]]:
        """Digests of the round's start (dense, each resident expert), then the H inner steps."""
        x, layout = self.replica.diloco.snapshot, self.replica.layout
        digests = (params_digest(x, layout.dense),
                   tuple(params_digest(x, [n for key in layout.units_of((e,)) for n in layout.units[key]])
                         for e in sorted(self.replica.resident)))
        return digests, [self.replica.inner_step(*self.sampler.sample(self.ctx.device))
                         for _ in range(self.settings.diloco.inner_steps)]

    async def _collect(self, kind: str, round: int, senders: Sequence[str], timeout_s: float) -> dict[str, Any]:
        return await collect_from_live(self.inbox, kind, round, senders, timeout_s=timeout_s,
                                       is_live=lambda p: self.live_with(p, names.EXPERT_HOST) is not None,
                                       until_view=self.ctx.until_view)

    async def _collect_updates(self, t: int, others: Sequence[str], placement: Placement) -> dict[str, FomoeUpdate]:
        """The members' updates that came in time and fit the placement (the rest noted as refused)."""
        valid = {}
        for sender, update in (await self._collect(UPDATE, t, others, self.settings.update_deadline_s)).items():
            problem = update_problem(update, placement, self.replica.layout, self.pair_limits)
            if problem is None:
                valid[sender] = update
            else:
                self.inbox.note_refusal(UPDATE, t, sender, problem)
        return valid

    def _post(self, kind: str, round: int, payloads: Mapping[str, Mapping[str, torch.Tensor]], ledger: RoundLedger,
              exchange: Any, *, metadata: dict[str, str] | None = None) -> asyncio.Task[None]:
        async def post() -> None:
            sent = await send_each(self.messenger, self.ctx.view, payloads, path=f"/fomoe/{kind}/{round}", round=round,
                                   exchange=exchange, metadata=dict.fromkeys(payloads, metadata) if metadata else None)
            for size in sent.values():
                ledger.bytes_sent += size
                self.ctx.traffic.add_sent(kind, size)

        return self.spawn(post(), name=f"{kind} {round}")

    def _mix_and_step(self, updates: list[FomoeUpdate], failures: list[Failure], placement: Placement,
                      ledger: RoundLedger) -> str:
        """mix_round over the agreed updates and the outer step; a round the aggregators cannot
        close (too few usable contributions for a robust rule) is skipped alike by every member."""
        try:
            mixed: MixedRound = mix(updates, placement, self.replica.layout, experts=self.replica.resident,
                                    failures=failures, dense_aggregator=self.dense_aggregator,
                                    expert_aggregator=self.expert_aggregator, limits=self.pair_limits)
        except (NotEnoughUpdates, InvalidSetting) as exc:
            self._skip_round()
            return f"round skipped: {exc}"
        self.replica.finish_round(mixed)
        ledger.idle_units = len(mixed.idle)
        left_out = {f.sender for f in failures}
        rejected = [f.sender for f in mixed.dense_result.rejected if f.sender not in left_out]
        return f"dense aggregator rejected {rejected}" if rejected else ""

    def _skip_round(self) -> None:
        """Close the round without an outer step: every parameter goes back to the round's start."""
        self.replica.diloco.finish_round({}, {}, frozen=set(self.replica.layout.size_bytes))

    def _evaluate(self) -> float:
        return self.replica.heldout_loss(self.heldout, context=self.settings.model.context,
                                         max_batches=self.settings.text.eval_batches, device=self.ctx.device)

    # -- holding experts ------------------------------------------------------------------------

    def _hold(self, placement: Placement, states: Mapping[int, ExpertState], *,
              lost: tuple[int, ...]) -> None:
        """Hold what ``placement`` gives this peer: ``states`` for the experts that came from others,
        this peer's own copy for the rest of its new experts."""
        mine = placement.resident(self.peer_id)
        new = set(mine) - self.replica.resident
        self.replica.set_resident(mine, {e: states[e] if e in states else self._own_copy(e) for e in new})
        for expert in states:
            self.synced[expert] = self.replica.round
        self.placement = placement
        self.lost = lost
        self.emit("placement", round=self.replica.round, members=len(placement.peers), experts=list(mine),
                  holders=[len(h) for h in placement.holders], lost=list(lost))
        self.ctx.announce()

    def _own_copy(self, expert: int) -> ExpertState:
        """This peer's copy of ``expert`` as it is (the weights it last synced, or the initial ones)."""
        if expert in self.replica.resident:
            return self.replica.expert_state(expert)
        layout = self.replica.layout
        names_ = {n for key in layout.units_of((expert,)) for n in layout.units[key]}
        params = {n: p.detach().clone() for n, p in self.replica.module.named_parameters() if n in names_}
        momentum = {n: u for n, u in self.replica.diloco.outer.state_dict().items() if n in names_}
        return ExpertState(expert, params, momentum)

    def _dense_state(self) -> dict[str, torch.Tensor]:
        """What this peer donates to joiners at a round's start: the dense part and its momentum."""
        dense = set(self.replica.layout.dense)
        params = {PARAM + n: p.detach().clone() for n, p in self.replica.module.named_parameters() if n in dense}
        momentum = {MOMENTUM + n: u for n, u in self.replica.diloco.outer.state_dict().items() if n in dense}
        return {**params, **momentum}

    async def _move_experts(self, boundary: Boundary, ledger: RoundLedger,
                            sending: list[asyncio.Task[None]]) -> None:
        """Hand the experts this peer is a source of to their new holders; take its own new ones."""
        me, round = self.peer_id, self.replica.round
        outgoing: dict[str, list[ExpertState]] = {}
        for move in boundary.outgoing(me):
            outgoing.setdefault(move.peer, []).append(self._own_copy(move.expert))
        if outgoing:
            payloads = {peer: experts_payload(states) for peer, states in outgoing.items()}
            sending.append(self._post(EXPERT, round, payloads, ledger, ledger.transfers))
        states = await self._take_experts(boundary, round, ledger)
        ledger.next_experts = list(boundary.placement.resident(me))
        ledger.lost = list(boundary.lost)
        self._hold(boundary.placement, states, lost=boundary.lost)

    async def _take_experts(self, boundary: Boundary, round: int,
                            ledger: RoundLedger | None) -> dict[int, ExpertState]:
        """The states of this peer's new experts at ``round``'s start, each from the first of its
        sources that sent it (a member's transfers go into its ``ledger``; a joiner has none)."""
        incoming = boundary.incoming(self.peer_id)
        sources = sorted({s for move in incoming for s in move.sources})
        got = await self._collect(EXPERT, round, sources, self.settings.commit_deadline_s) if sources else {}
        states, used = {}, set()
        for move in incoming:
            source = next((s for s in move.sources if move.expert in got.get(s, {})), None)
            if source is None:
                log.warning("expert %d: none of its sources sent it; keeping this peer's copy", move.expert)
                if ledger is not None:
                    ledger.note += f" expert {move.expert}: no source sent it, kept this peer's copy;"
                continue
            states[move.expert] = got[source][move.expert]
            used.add(source)
        if ledger is not None:
            ledger.transfers.expect(sources)
            ledger.transfers.settle(got, refused=self.inbox.refused(EXPERT, round))
            ledger.transfers.use(used)
        return states

    def _part(self) -> Part:
        """This host's part as it is now."""
        held = self.replica.layout.names_held(self.replica.resident)
        params = {n: p.detach().cpu().clone() for n, p in self.replica.module.named_parameters() if n in held}
        return self.replica.round, params, tuple(sorted(self.replica.resident))

    async def _write_part(self, part: Part) -> str:
        round, params, experts = part
        name = f"{self.ctx.manifest.config.name}-{self.peer_id[:12]}-round{round}"
        path = await self.checkpoints.write_async(name, params, round=str(round), experts=",".join(map(str, experts)))
        return str(path)

    async def checkpoint(self) -> str | None:
        """On a clean shutdown: write this host's part as it was at the start of the round under
        way, a state every holder of those experts had too. Returns None: nothing resumes from
        it (a host that starts again joins the swarm afresh and takes its part from the members);
        the file keeps the weights, e.g. when the whole swarm stops. A finished host already
        wrote its part."""
        if self.finished or self._boundary is None:
            return None
        self.checkpoint_path = await self._write_part(self._boundary)
        log.info("this host's part (dense layers, routers, experts %s) written to %s; started again, the host "
                 "joins afresh and takes its part from the members", list(self._boundary[2]), self.checkpoint_path)
        return None

    # -- the end --------------------------------------------------------------------------------

    async def _finish(self) -> None:
        path = await self._write_part(self._part())
        self.checkpoint_path = path
        self.finished = True
        last = self.history.last(1)
        self.emit("finished", round=self.replica.round, checkpoint=str(path), experts=sorted(self.replica.resident),
                  heldout_loss=last[0]["heldout_loss"] if last else None)
        log.info("finished %d rounds; checkpoint %s", self.replica.round, path)


def _summarize_steps(ledger: RoundLedger, reports: Sequence[StepReport]) -> None:
    ledger.train_loss = sum(r.loss for r in reports) / len(reports)
    routed = sum(r.routed_pairs for r in reports)
    ledger.skip_fraction = 1.0 - sum(r.computed_pairs for r in reports) / routed if routed else 0.0


def _settle(ledger: RoundLedger, others: Sequence[str], valid: Mapping[str, FomoeUpdate], commits: Mapping[str, Commit],
            outcome: Any, refused_updates: Mapping[str, str], refused_commits: Mapping[str, str]) -> None:
    """The round's update and commit ledgers: an update that arrived but is not agreed is rejected
    (not every member got it), so it counts nowhere."""
    ledger.updates.expect(others)
    ledger.updates.settle(valid, refused=refused_updates)
    ledger.updates.use(p for p in outcome.agreed if p in valid)
    for sender in sorted(set(valid) - set(outcome.agreed)):
        ledger.updates.reject(sender, "not every member got it")
    ledger.commits.expect(others)
    ledger.commits.settle([p for p in commits if p in others], refused=refused_commits)
    ledger.commits.use(p for p in outcome.counted if p in others)
    for sender in sorted(set(ledger.commits.arrived) - set(outcome.counted)):
        ledger.commits.reject(sender, "its members or experts differ from this peer's placement")
    ledger.agreed, ledger.joiners = list(outcome.agreed), list(outcome.joiners)
    ledger.left = sorted(set(ledger.members) - set(outcome.members))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
