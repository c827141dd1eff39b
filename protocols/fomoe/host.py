"""Role ``expert-host``: a FoMoE peer. It holds the MoE LM's dense layers and routers and a resident
subset of its experts, trains on its shard skipping the pairs routed to experts it does not hold,
and synchronises every H steps: the dense part with every member, each expert only with its
holders.

One round t, for a member of the round's placement (``protocols.fomoe.core``, ``boundary``)::

    begin_round; H inner steps (a worker thread)            -> its update
    PUT /fomoe/update/t to every other member               (the dense part + the experts both hold)
    wait for theirs (update_deadline_s, or until the missing ones leave the view)
    PUT /fomoe/commit/t to every other member and joiner    (what arrived, who asked to join)
    wait for theirs (commit_deadline_s, idem); agree on what counts
    mix_round over the agreed members' updates; the outer step; held-out loss
    if the members change: re-place the experts; each source PUTs /fomoe/expert/t+1 to each new
    holder; a new holder waits commit_deadline_s for them

Its record carries its resident experts, the placement's round and size, and the pairs every
expert ran in the last round (``gossamer status`` shows the coverage from them); its donated
state (``/state/...``, for joiners) is the dense part and its outer momentum at the round's
start. Joining (a new peer, or one that was cut off) is ``joining``; taking and handing over
experts and writing its part, ``holding``; messages are ``wire``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from aiohttp import web
from torch import nn

from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.inbox import Inbox
from gossamer.peer.kit.ledger import History
from gossamer.peer.kit.messaging import SignedMessenger
from gossamer.peer.kit.rounds import collect_from_live, finish_sends, send_each
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import Failure
from gossamer.protocols.core.text_data import BatchSampler, evaluate, load_text, shard, split_text
from gossamer.protocols.fomoe import names
from gossamer.protocols.fomoe.core import (
    FomoeReplica,
    FomoeUpdate,
    MixedRound,
    Placement,
    StepReport,
    addressed_to,
    build_moe_model,
    place_experts,
    update_bytes,
    update_problem,
)
from gossamer.protocols.fomoe.core import mix_round as mix
from gossamer.protocols.fomoe.core.boundary import Commit, agree, plan_boundary
from gossamer.protocols.fomoe.coverage import expert_coverage
from gossamer.protocols.fomoe.holding import Holding, Part
from gossamer.protocols.fomoe.joining import Joining
from gossamer.protocols.fomoe.ledger import RoundLedger
from gossamer.protocols.fomoe.settings import FomoeSettings
from gossamer.protocols.fomoe.wire import (
    COMMIT,
    EXPERT,
    JOIN,
    KINDS,
    UPDATE,
    ExpertMessageRefused,
    ModelShape,
    params_digest,
    read_experts,
    read_update,
    update_payload,
)

log = logging.getLogger(__name__)
MAX_SERIES = 2000  # points per loss curve kept for the swarm page


class _Resident(nn.Module):
    """The model as this peer runs it: only its resident experts (for ``text_data.evaluate``)."""

    def __init__(self, model: nn.Module, resident: Sequence[int]) -> None:
        super().__init__()
        self.model = model
        self.resident = tuple(resident)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, resident=self.resident)


class ExpertHostRole(Joining, Holding, ProtocolRole[FomoeSettings]):
    """A FoMoE expert host (see the module docstring)."""

    name = names.EXPERT_HOST

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        s = self.settings
        split = split_text(load_text(ctx.config.data or s.data_source), heldout_fraction=s.heldout_fraction)
        self.shard = self.shard_index(s.num_shards)
        self.heldout = split.heldout
        model = build_moe_model(s.model, seed=s.seed, device=ctx.device)
        self.replica = FomoeReplica(self.peer_id, model, (), diloco=s.diloco, fomoe=s.fomoe)
        self.shape = ModelShape(self.replica.layout, {n: p.dtype for n, p in model.named_parameters()})
        self.sampler = BatchSampler(shard(split.train, index=self.shard, count=s.num_shards),
                                    batch_size=s.batch_size, context=s.model.context,
                                    generator=torch.Generator().manual_seed(self.peer_seed()))
        self.messenger = SignedMessenger(identity=ctx.identity, run_id=ctx.manifest.run_id, client=ctx.http_client,
                                         view=ctx.view, now=ctx.now, limits=ctx.http_config.limits,
                                         max_body_bytes=min(ctx.http_config.max_body_bytes,
                                                            self.shape.max_message_bytes))
        self.dense_aggregator, self.expert_aggregator = s.aggregators()
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
                                  round=self.replica.round, seed=s.seed)
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
            boundary = plan_boundary(placement, outcome, commits, round=t + 1, seed=self.settings.seed)
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
            problem = update_problem(update, placement, self.replica.layout)
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
                                    expert_aggregator=self.expert_aggregator)
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
        model = _Resident(self.replica.module, sorted(self.replica.resident))
        return evaluate(model, self.heldout, context=self.settings.model.context,
                        max_batches=self.settings.eval_batches, device=self.ctx.device)

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
