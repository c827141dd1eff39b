"""Role ``learner``: a gossip-DiLoCo replica trained on this peer's shard, mixed with its peers.
One class: its rounds (README.md, "A round, step by step"), how it gets in step with the swarm
(round 0, joining mid-run, catching up) and its checkpoints. It does the I/O; what to wait for and
how long comes from ``core.pacing``, the mixes from ``core.aggregate``. Every contribution of a
round ends in the round's ledger: used, rejected with a reason, or timed out."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import torch
from aiohttp import web

from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.download_events import downloading_fields
from gossamer.peer.kit.inbox import Inbox, size_bytes
from gossamer.peer.kit.ledger import Exchange, History
from gossamer.peer.kit.messaging import SignedMessenger, body_cap
from gossamer.peer.kit.rounds import collect_from_live, finish_sends, send_each
from gossamer.peer.kit.state_join import NoQuorum, download_state
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.peer.run.tenure import steering
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.core.models import build_model, flat_parameters, generate
from gossamer.protocols.core.text_data import (
    BatchSampler,
    evaluate,
    load_text,
    next_byte_loss,
    shard,
    split_text,
)
from gossamer.protocols.diloco import names
from gossamer.protocols.diloco.contributions import KINDS, MOMENTUM, expected_tensors, shape_problem
from gossamer.protocols.diloco.core.aggregate import mix_parameters, parse_attack
from gossamer.protocols.diloco.core.mixing import neighbours
from gossamer.protocols.diloco.core.pacing import LearnerPacing, Wait, catch_up_limit_s
from gossamer.protocols.diloco.core.replica import DilocoReplica, Params
from gossamer.protocols.diloco.keeping import KeptState
from gossamer.protocols.diloco.ledger import RoundLedger
from gossamer.protocols.diloco.settings import DilocoSettings
from gossamer.protocols.diloco.steering import (
    Evidence,
    claimed_rounds,
    inbox_budget,
    out_of_step,
    reach_rounds,
)
from gossamer.transport.http_server import path_int

log = logging.getLogger(__name__)
T = TypeVar("T")


class LearnerRole(ProtocolRole[DilocoSettings]):
    """A gossip-DiLoCo learner (see the module docstring)."""

    name = names.LEARNER

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        text = self.settings.text
        split = split_text(load_text(ctx.config.data or text.data_source), heldout_fraction=text.heldout_fraction)
        self.shard = self.shard_index(text.num_shards)
        self.heldout = split.heldout
        model = build_model(self.settings.model, seed=text.seed, device=ctx.device)
        self.replica = DilocoReplica(model, self.settings.diloco)
        generator = torch.Generator().manual_seed(self.peer_seed())
        self.sampler = BatchSampler(shard(split.train, index=self.shard, count=text.num_shards),
                                    batch_size=text.batch_size, context=self.settings.model.context,
                                    generator=generator)
        self.messenger = SignedMessenger(identity=ctx.identity, run_id=ctx.manifest.run_id, client=ctx.http_client,
                                         view=ctx.view, now=ctx.now, limits=ctx.http_config.limits,
                                         max_body_bytes=ctx.http_config.max_body_bytes)
        self.aggregator = self.settings.w2_aggregator(me=ctx.identity.peer_id)
        self.attack = parse_attack(ctx.config.attack, self.aggregator) if ctx.config.attack else None
        reach = reach_rounds(self.settings.catch_up_rounds)
        self.inbox = Inbox(window_rounds=reach)
        self.pacing = LearnerPacing(self.settings.w2_deadline_s, adaptive=self.settings.pacing == "adaptive",
                                    floor_s=self.settings.w2_floor_s, ahead=reach)
        self.catch_up_limit_s = catch_up_limit_s(self.settings.catch_up_rounds, self.settings.w2_deadline_s)
        self.history: History[int, RoundLedger] = History()
        self.evidence = Evidence()  # whose pseudo-gradients this learner used lately: they steer it
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id, format="gossamer/diloco")
        self._snapshot: tuple[int, dict[str, torch.Tensor]] = (0, flat_parameters(model))
        self._received_bytes: dict[int, int] = {}  # round -> accepted body bytes; pruned every round
        self.finished = False
        self.alone_waited = False  # this learner found itself alone mid-run and has waited once
        self.ended_before_join: int | None = None  # the round the run had finished at when this one came
        self.checkpoint_path = ""
        self.kept = KeptState(self.checkpoints, f"{ctx.manifest.config.name}-{self.peer_id[:12]}-state",
                              model_json=json.dumps(self.settings.model.to_dict()))
        self.resumed_from = self.kept.resume(self.replica, self.sampler)
        if self.resumed_from:
            self._snapshot = (self.replica.round, flat_parameters(self.replica.module))
            log.info("resumed from %s at round %d", self.resumed_from, self.replica.round)
        self.kept.take(self.replica, self.sampler)

    # -- role interface -------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.put("/diloco/{kind}/{round}", self._receive)]

    async def start(self) -> None:
        self._advance_inbox(self.replica.round)  # sized before anything arrives
        if not self.resumed_from:
            await self._join_mid_run()
        self.spawn(self._run(), name="rounds")

    @property
    def round(self) -> int:
        return self.replica.round

    @property
    def series(self) -> dict[str, list[list[float]]]:
        return self.kept.series

    async def checkpoint(self) -> str | None:
        """Write the state of the last finished round (what a restart resumes from)."""
        return await self.kept.write()

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]]:
        return self._snapshot

    def status(self) -> dict[str, Any]:
        last = self.history.last(1)
        return {"round": self.round, "shard": self.shard, "finished": self.finished,
                "checkpoint": self.checkpoint_path, "aggregator": self.settings.aggregator,
                "train_loss": last[0]["train_loss"] if last else None,
                "heldout_loss": last[0]["heldout_loss"] if last else None, "ledgers": self.history.last(3),
                "rounds": self.settings.rounds, "series": self.series, "resumed_from": self.resumed_from,
                "pacing": self.pacing.status()}

    def health(self) -> RoleHealth:
        health = super().health()
        if health.state != FAILED and self.ended_before_join is not None:
            return RoleHealth(FINISHED, f"the run had finished at round {self.ended_before_join} before this "
                                        f"learner came; nothing to train")
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"{self.replica.round} rounds; checkpoint {self.checkpoint_path}")
        return health

    def gauges(self) -> dict[str, float]:
        last = self.history.last(1)
        return {"learner_heldout_loss": last[0]["heldout_loss"]} if last else {}

    def _learners(self) -> list[str]:
        return self.peer_ids_with(names.LEARNER, include_self=True)

    def _other_learners(self) -> list[LivePeer]:
        """The other learners that may steer this one: the tenured ones, or all (``steering``)."""
        return self.steering_peers_with(names.LEARNER)

    def _steering_learners(self) -> tuple[list[LivePeer], dict[str, int]]:
        """The other learners its median round and the state it adopts follow: those whose
        pseudo-gradients it used lately (the tenured ones among them), else the tenured ones
        (``run.tenure``); and that evidence (peer -> the last round its work was used)."""
        evidence = self.evidence.recent(self.replica.round)
        owner = self.ctx.view.get(self.ctx.manifest.owner_peer_id)
        peers = steering(self.peers_with(names.LEARNER), now=self.ctx.now(), tenure_s=self.ctx.manifest.tenure_s,
                         owner=owner.record if owner is not None else None, contributed=evidence)
        return peers, evidence

    def _vouched(self) -> tuple[str, ...]:
        """The id prefixes the run owner's record vouches for (``PeerRecord.tenured``)."""
        owner = self.ctx.view.get(self.ctx.manifest.owner_peer_id)
        return owner.record.tenured if owner is not None else ()

    def _advance_inbox(self, round: int) -> None:
        self.inbox.advance(round)
        self.inbox.max_bytes = inbox_budget(size_bytes(self._snapshot[1]), window_rounds=self.inbox.window_rounds,
                                            steering_learners=len(self._other_learners()))

    # -- receiving ------------------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> web.Response:
        kind, round = request.match_info["kind"], path_int(request, "round")
        if kind not in KINDS:
            raise web.HTTPNotFound(text="unknown contribution kind")
        expected = expected_tensors(kind, round, self._snapshot[1], mixing=self.settings.mixing,
                                    aggregator=self.aggregator)
        received = await self.messenger.receive(request, sender_role=names.LEARNER, round=round,
                                                max_body_bytes=body_cap(expected))
        sender = received.envelope.sender
        if kind == "pgrad":
            self.pacing.arrived(round, sender, time.monotonic())
        reason = shape_problem(kind, expected, received.tensors) or await self.inbox.put(
            kind, round, sender, received.tensors,
            priority=any(p.record.peer_id == sender for p in self._other_learners()))
        self.ctx.traffic.add_received(kind, received.size_bytes)
        if reason is not None:
            self.inbox.note_refusal(kind, round, sender, reason)
            return web.json_response({"accepted": False, "reason": reason}, status=409)
        self._received_bytes[round] = self._received_bytes.get(round, 0) + received.size_bytes
        return web.json_response({"accepted": True})

    # -- rounds ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        if self.replica.round == 0 and not await self._wait_for_learners():
            return
        while not self.settings.rounds or self.replica.round < self.settings.rounds:
            await self._wait_for_company()
            await self._catch_up()
            if self.settings.rounds and self.replica.round >= self.settings.rounds:
                break
            ledger = await self._one_round()
            self.history.add(ledger.round, ledger)
            self.emit("round", **ledger.summary(), rounds=self.settings.rounds)
            self.kept.add_losses(ledger.round, ledger.train_loss, ledger.heldout_loss)
            self.kept.take(self.replica, self.sampler)
            every = self.ctx.config.checkpoint_every
            if every and self.replica.round % every == 0:
                await self.checkpoint()
        await self._finish()

    async def _one_round(self) -> RoundLedger:
        started, t = time.monotonic(), self.replica.round
        self._advance_inbox(t)
        learners = self._learners()
        me, plan, seed = learners.index(self.peer_id), self.settings.mixing, self.settings.text.seed
        w1 = plan.w1_weights(len(learners), round=t, seed=seed)
        w2 = plan.w2_weights(len(learners), round=t, seed=seed)
        n1 = [learners[j] for j in neighbours(w1[me]) if j != me]
        n2 = [learners[j] for j in neighbours(w2[me]) if j != me]
        ledger = RoundLedger(round=t, learners=learners)
        self.pacing.begin(t, started)
        self.pacing.keep_only(learners)
        x = self.replica.begin_round()
        u = self.replica.momentum_snapshot() if plan.mixes_momentum(t) else {}
        self._snapshot = (t, x)
        self.ctx.announce()  # the record's round and state version are t from now on
        outgoing = {**x, **{MOMENTUM + name: tensor for name, tensor in u.items()}}
        sending = [asyncio.create_task(self._send("params", t, outgoing, n1, ledger.params, ledger))]
        ledger.train_loss, ledger.compute_s = await self._timed(asyncio.to_thread(self._inner_phase))
        d = self.replica.end_inner()
        arrived, ledger.w1_wait_s = await self._timed(
            self._collect("params", t, self.pacing.w1_wait(n1, grace_s=self.settings.w1_grace_s)))
        self._settle(ledger.params, "params", t, arrived)
        ledger.params.use(arrived)  # every parameter set that arrived (shape- and finite-checked) is mixed
        m, u_mixed = self._mix1(x, u, arrived, weights=w1, me=me, learners=learners)
        sent_d = self.attack(d) if self.attack else d
        if sent_d is not None:  # None: a Byzantine learner (--attack withhold) that never sends
            sending.append(asyncio.create_task(self._send(
                "pgrad", t, self.aggregator.subset_of(sent_d, round=t), n2, ledger.pseudo_gradients, ledger)))
        wait = self.pacing.w2_wait(t, time.monotonic(), n2)
        ledger.w2_deadline_s, ledger.not_waited_for = wait.timeout_s, wait.not_waited_for
        arrived_d, ledger.w2_wait_s = await self._timed(self._collect("pgrad", t, wait))
        ledger.slow = sorted(self.pacing.settle(t, n2))
        self._settle(ledger.pseudo_gradients, "pgrad", t, arrived_d)
        silent = {s: "timed out" for s in ledger.pseudo_gradients.timed_out} | ledger.pseudo_gradients.rejected
        d_mixed = self.aggregator.aggregate(d, arrived_d, weights=w2, me=me, index_of=learners.index,
                                            silent=silent, round=t)
        ledger.record_w2(d_mixed)
        self.evidence.saw(ledger.pseudo_gradients.used, t)
        await self.ctx.fault_point("aggregate", t)  # a test's crash mid-aggregate: received, not applied
        self.replica.finish_round(m, d_mixed.value, u_mixed)
        await finish_sends(sending, timeout_s=self.pacing.ceiling_s)
        ledger.heldout_loss, ledger.eval_s = await self._timed(asyncio.to_thread(self._evaluate))
        ledger.bytes_received = self._received_bytes.pop(t, 0)
        for old in [r for r in self._received_bytes if r < t]:
            del self._received_bytes[old]
        ledger.wall_s = time.monotonic() - started
        return ledger

    @staticmethod
    async def _timed(work: Awaitable[T]) -> tuple[T, float]:
        """What ``work`` gave, and the seconds it took."""
        started = time.monotonic()
        result = await work
        return result, time.monotonic() - started

    async def _collect(self, kind: str, t: int, wait: Wait) -> dict[str, Params]:
        """What ``wait.expected`` sent for (kind, t), blocking on ``wait.wait_for`` for at most
        ``wait.timeout_s``; with ``wait.follow_view``, no longer on a sender whose record left the view."""
        if not wait.follow_view:
            return await self.inbox.collect(kind, t, wait.expected, timeout_s=wait.timeout_s, wait_for=wait.wait_for)
        return await collect_from_live(self.inbox, kind, t, wait.expected, timeout_s=wait.timeout_s,
                                       wait_for=wait.wait_for, is_live=lambda s: self.ctx.view.get(s) is not None,
                                       until_view=self.ctx.until_view)

    def _settle(self, exchange: Exchange, kind: str, round: int, arrived: Mapping[str, Any]) -> None:
        """Close ``exchange``: what arrived in time, what the inbox or the shape checks refused, the rest timed out."""
        exchange.settle(list(arrived), refused=self.inbox.refused(kind, round))

    async def _send(self, kind: str, round: int, tensors: Mapping[str, torch.Tensor], to: list[str],
                    exchange: Exchange, ledger: RoundLedger) -> None:
        exchange.expected = sorted(to)
        sent = await send_each(self.messenger, self.ctx.view, dict.fromkeys(to, tensors),
                               path=f"/diloco/{kind}/{round}", round=round, exchange=exchange)
        for size in sent.values():
            ledger.bytes_sent += size
            self.ctx.traffic.add_sent(kind, size)

    def _mix1(self, x: Params, u: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
              learners: list[str]) -> tuple[Params, Params | None]:
        """Mix1: the parameters m and, when this round mixes it (``u`` not empty), the outer
        momentum u~, over the same neighbours with the same weights (and the same clipping)."""
        def mixed(own: Params, part: Callable[[Params], Params]) -> Params:
            return mix_parameters(own, {s: part(v) for s, v in arrived.items()}, weights=weights, me=me,
                                  index_of=learners.index, clip_tau=self.settings.w1_clip_tau,
                                  clip_ratio=self.settings.w1_clip_ratio, max_norm=self.settings.text.max_norm)

        m = mixed(x, lambda v: {name: v[name] for name in x})
        return m, (mixed(u, lambda v: {name: v[MOMENTUM + name] for name in u}) if u else None)

    def _inner_phase(self) -> float:
        losses = [self.replica.inner_step(*self.sampler.sample(self.ctx.device), next_byte_loss)
                  for _ in range(self.settings.diloco.inner_steps)]
        return float(sum(losses) / len(losses))

    def _evaluate(self) -> float:
        return evaluate(self.replica.module, self.heldout, context=self.settings.model.context,
                        max_batches=self.settings.text.eval_batches, device=self.ctx.device)

    # -- in step with the swarm: round 0, joining mid-run, catching up --------------------------

    async def _wait_for_learners(self) -> bool:
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

    def _run_finished_at(self) -> int | None:
        """The round the run finished at, if its owner's record says it did (``run_round``, the
        highest round its members announced, reached ``hyper.rounds``); None otherwise."""
        owner = self.ctx.view.get(self.ctx.manifest.owner_peer_id)
        rounds = self.settings.rounds
        if rounds and owner is not None and owner.record.run_round >= rounds:
            return owner.record.run_round
        return None

    async def _join_mid_run(self) -> None:
        """Download the swarm's state when it is past round 0. Records lag the rounds they
        describe, so a donor may have moved on from the version its record offers before the
        download ends: then try again once the records change, for up to ``catch_up_limit_s``,
        rather than start from round 0 and drag the swarm's rounds back until a catch-up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.catch_up_limit_s
        while True:
            offers = self._offered_versions()
            if not any(version > 0 for version in offers.values()):
                return
            last_try = loop.time() >= deadline
            if await self._adopt_state(self._steering_learners()[0], why="joined", last_try=last_try) or last_try:
                return
            await self.ctx.until_view(lambda offers=offers: self._offered_versions() != offers,
                                      timeout_s=max(0.0, deadline - loop.time()))

    def _offered_versions(self) -> dict[str, int]:
        """The state version each other learner's record offers."""
        return {p.record.peer_id: version for p in self._other_learners()
                if isinstance(version := p.record.state.get("version", 0), int)}

    async def _catch_up(self) -> None:
        """Get back in step when ``catch_up_rounds`` or more away from the median round of the
        learners. Behind: adopt the state a majority of the steering learners offer at or just past
        the median (so one peer advertising a far-off round pulls nobody). Ahead: wait for the others to come within
        reach, up to ``catch_up_limit_s``, rather than throw the progress away."""
        target = self._out_of_step()
        if target is None:
            return
        if target < self.replica.round:
            await self._wait_for_the_swarm(target)
            return
        band = range(target, target + self.settings.catch_up_rounds)
        await self._adopt_state(self._steering_learners()[0], versions=band,
                                why=f"caught up ({target - self.replica.round} rounds behind the median of the "
                                    f"learners)")

    async def _wait_for_company(self) -> None:
        """Mid-run with no other learner in view (this host was stalled and the records it holds
        lapsed meanwhile, or the others are restarting): wait up to ``catch_up_limit_s`` for one to
        show up, once per such spell, rather than race through rounds alone and come back far
        ahead of the swarm it was in step with."""
        if self.replica.round == 0 or self.settings.min_learners <= 1 or self._other_learners():
            self.alone_waited = False
            return
        if self.alone_waited:
            return
        self.alone_waited = True
        log.info("no other learner in view at round %d; waiting up to %.0f s for one", self.replica.round,
                 self.catch_up_limit_s)
        self.emit("waiting", learners=1, wanted=self.settings.min_learners)
        await self.ctx.until_view(lambda: bool(self._other_learners()), timeout_s=self.catch_up_limit_s)

    def _out_of_step(self) -> int | None:
        peers, evidence = self._steering_learners()
        rounds = claimed_rounds({p.record.peer_id: p.record.round for p in peers}, evidence)
        return out_of_step(self.replica.round, rounds, threshold=self.settings.catch_up_rounds)

    async def _wait_for_the_swarm(self, target: int) -> None:
        log.info("%d rounds ahead of the median of the learners (round %d); waiting up to %.0f s for them",
                 self.replica.round - target, target, self.catch_up_limit_s)
        self.emit("ahead", round=self.replica.round, median=target, wait_s=self.catch_up_limit_s)

        def in_reach() -> bool:
            target = self._out_of_step()
            return target is None or target > self.replica.round

        await self.ctx.until_view(in_reach, timeout_s=self.catch_up_limit_s)

    async def _adopt_state(self, donors: list[LivePeer], *, why: str, last_try: bool = True,
                           versions: range | None = None) -> bool:
        """Download and adopt the state a majority of the donors agree on (``kit.state_join``);
        False (and this learner's own state kept) when none has a majority (a ``no_quorum``
        event says what was offered) or no donor served it, which ``last_try`` logs as a warning."""
        try:
            version, tensors, report = await download_state(
                self.ctx.http_client, donors, joiner_id=self.ctx.identity.peer_id, versions=versions,
                tenure_s=self.ctx.manifest.tenure_s, vouched=self._vouched(),
                progress=lambda progress: self.emit("downloading", **downloading_fields(progress)))
        except NoQuorum as exc:
            self.emit("no_quorum", offering=exc.offering, quorum=exc.quorum, reason=str(exc), retry=not last_try)
            log.log(logging.WARNING if last_try else logging.INFO, "not adopting a state (%s): %s%s", why, exc,
                    "" if last_try else "; trying again once the records change")
            return False
        except StateSyncError as exc:
            if last_try:
                log.warning("could not download the run's state, going on from our own: %s", exc)
            else:
                log.info("could not download the run's state (%s); trying again once the records change", exc)
            return False
        self.replica.adopt(tensors, version)
        self._snapshot = (version, flat_parameters(self.replica.module))
        failed = {failure.peer_id for failure in report.failures}
        self.evidence.saw([p for p in report.shards_served if p not in failed], version)  # a majority's state
        self.ctx.announce()
        self.emit("adopted", round=version, donors=len(report.shards_served), why=why)
        blend = f" (the median of {report.sources} states)" if report.sources > 1 else ""
        log.info("%s at round %d with state from %d donor(s)%s", why, version, len(report.shards_served), blend)
        return True

    # -- the end --------------------------------------------------------------------------------

    async def _finish(self) -> None:
        params = flat_parameters(self.replica.module)
        self._snapshot = (self.replica.round, params)
        name = f"{self.ctx.manifest.config.name}-{self.peer_id[:12]}-round{self.replica.round}"
        path = await self.checkpoints.write_async(name, params, round=str(self.replica.round),
                                                  model=json.dumps(self.settings.model.to_dict()))
        self.checkpoint_path = str(path)
        sample = await asyncio.to_thread(self._sample)
        self.finished = True
        last = self.history.last(1)
        self.emit("finished", round=self.replica.round, checkpoint=str(path), sample=sample,
                  heldout_loss=last[0]["heldout_loss"] if last else None)
        log.info("finished %d rounds; checkpoint %s", self.replica.round, path)

    def _sample(self) -> str:
        generator = torch.Generator().manual_seed(0)
        text = generate(self.replica.module, b"The ", max_new_bytes=160, temperature=0.7, generator=generator)
        return text.decode("utf-8", "replace")
