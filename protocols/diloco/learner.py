"""Role ``learner``: a gossip-DiLoCo replica trained on this peer's shard, mixed with its peers.

One outer round t (DESIGN.md, "Gossip DiLoCo"): snapshot x (and, when the plan mixes it, the
outer momentum u); send them to the W1 neighbours in the background while the H inner AdamW steps
run (in a worker thread, so the daemon keeps serving); mix what arrived by the end of the inner
phase (plus ``w1_grace_s``) into m (and u~); pseudo-gradient d = x - y; send d (on the W2 subset)
to the W2 neighbours and wait for theirs up to the W2 deadline (``w2_deadline_s``, or with adaptive
pacing what the measured arrivals call for, not waiting for fail-slow learners nor for learners
whose record left the view: ``pacing``); aggregate them through the run's robust aggregator;
outer Nesterov step from m (and u~). Every ``average_every``-th round the plan's weights are global
over every parameter, momentum included (an exact average). Every contribution
is accounted for in the round's ledger: arrived and used, rejected with a reason, or timed out.
Peers are the live, admitted learners of the run (sorted by peer id, so everyone indexes them
alike).

Checkpoints: the state at the end of each round (parameters, inner AdamW state, outer momentum,
the sampler's generator, the loss series) is kept on the CPU and written to
``<checkpoint_dir>/<run>-<peer id>-state.safetensors`` every ``checkpoint_every`` rounds and on a
clean shutdown; a learner started again with the same identity and ``--checkpoint_dir`` resumes
from it and continues the same trajectory. When ``rounds`` is reached it writes the parameters
(with the model config, so ``gossamer sample`` can run them) and prints a sample.

Staying in step: round 0 waits until ``min_learners`` learners are live; a learner that joins
mid-run, or finds itself ``catch_up_rounds`` away from the median round of its peers, downloads
their state (verified against the digest they sign into their records) and goes on from there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from aiohttp import web

from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.inbox import Inbox, size_bytes
from gossamer.peer.kit.ledger import Exchange, History
from gossamer.peer.kit.messaging import SignedMessenger, body_cap
from gossamer.peer.kit.rounds import collect_from_live
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth
from gossamer.peer.run.view import LivePeer
from gossamer.protocols.core.models import build_model, flat_parameters, generate
from gossamer.protocols.core.pacing import Pacing
from gossamer.protocols.core.text_data import (
    BatchSampler,
    evaluate,
    load_text,
    next_byte_loss,
    shard,
    split_text,
)
from gossamer.protocols.diloco import names
from gossamer.protocols.diloco.aggregate import PseudoGradientAggregator, mix_parameters, parse_attack
from gossamer.protocols.diloco.contributions import KINDS, MOMENTUM, expected_tensors, shape_problem
from gossamer.protocols.diloco.core.mixing import neighbours
from gossamer.protocols.diloco.core.pacing import LearnerPacing
from gossamer.protocols.diloco.core.replica import DilocoReplica, Params
from gossamer.protocols.diloco.joining import Joining
from gossamer.protocols.diloco.keeping import KeptState
from gossamer.protocols.diloco.ledger import RoundLedger
from gossamer.protocols.diloco.settings import DilocoSettings
from gossamer.protocols.diloco.steering import inbox_budget, reach_rounds
from gossamer.transport.errors import TransportError
from gossamer.transport.http_server import path_int

log = logging.getLogger(__name__)


class LearnerRole(Joining, ProtocolRole[DilocoSettings]):
    """A gossip-DiLoCo learner (see the module docstring)."""

    name = names.LEARNER

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        split = split_text(load_text(ctx.config.data or self.settings.data_source),
                           heldout_fraction=self.settings.heldout_fraction)
        self.shard = self.shard_index(self.settings.num_shards)
        self.heldout = split.heldout
        model = build_model(self.settings.model, seed=self.settings.seed, device=ctx.device)
        self.replica = DilocoReplica(model, self.settings.diloco)
        generator = torch.Generator().manual_seed(self.peer_seed())
        self.sampler = BatchSampler(shard(split.train, index=self.shard, count=self.settings.num_shards),
                                    batch_size=self.settings.batch_size, context=self.settings.model.context,
                                    generator=generator)
        self.messenger = SignedMessenger(identity=ctx.identity, run_id=ctx.manifest.run_id, client=ctx.http_client,
                                         view=ctx.view, now=ctx.now, limits=ctx.http_config.limits,
                                         max_body_bytes=ctx.http_config.max_body_bytes)
        self.aggregator = PseudoGradientAggregator(self.settings, me=ctx.identity.peer_id)
        self.attack = parse_attack(ctx.config.attack, self.aggregator) if ctx.config.attack else None
        reach = reach_rounds(self.settings.catch_up_rounds)
        self.inbox = Inbox(window_rounds=reach)
        self.pacing = LearnerPacing(self.settings.w2_deadline_s, adaptive=self.settings.pacing == "adaptive",
                                    pacing=Pacing(floor_s=min(self.settings.w2_floor_s, self.settings.w2_deadline_s)),
                                    ahead=reach)
        self.history: History[int, RoundLedger] = History()
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id, format="gossamer/diloco")
        self._snapshot: tuple[int, dict[str, torch.Tensor]] = (0, flat_parameters(model))
        self._late_rejections: dict[tuple[str, int], dict[str, str]] = {}
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

    def _other_learners(self) -> list[LivePeer]:
        """The other learners that may steer this one: the tenured ones, or all (``steering``)."""
        return self.steering_peers_with(names.LEARNER)

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
            self._late_rejections.setdefault((kind, round), {})[sender] = reason
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
            self.emit("round", round=ledger.round, train_loss=ledger.train_loss,
                 heldout_loss=ledger.heldout_loss, params_from=len(ledger.params.arrived),
                 pgrads_used=len(ledger.pseudo_gradients.used), timed_out=ledger.pseudo_gradients.timed_out,
                 rejected=ledger.pseudo_gradients.rejected, bytes_sent=ledger.bytes_sent,
                 bytes_received=ledger.bytes_received, note=ledger.note, rounds=self.settings.rounds,
                 compute_s=ledger.compute_s, wall_s=ledger.wall_s, w1_wait_s=ledger.w1_wait_s,
                 w2_wait_s=ledger.w2_wait_s, eval_s=ledger.eval_s, w2_deadline_s=ledger.w2_deadline_s,
                 slow=ledger.slow, partial=ledger.partial(),
                 problems=ledger.balance_problems())
            self.kept.add_losses(ledger.round, ledger.train_loss, ledger.heldout_loss)
            self.kept.take(self.replica, self.sampler)
            every = self.ctx.config.checkpoint_every
            if every and self.replica.round % every == 0:
                await self.checkpoint()
        await self._finish()

    def _learners(self) -> list[str]:
        return self.peer_ids_with(names.LEARNER, include_self=True)

    async def _one_round(self) -> RoundLedger:
        started, t = time.monotonic(), self.replica.round
        self._advance_inbox(t)
        learners = self._learners()
        me = learners.index(self.ctx.identity.peer_id)
        plan, seed = self.settings.mixing, self.settings.seed
        w1 = plan.w1_weights(len(learners), round=t, seed=seed)
        w2 = plan.w2_weights(len(learners), round=t, seed=seed)
        ledger = RoundLedger(round=t, learners=learners)
        self.pacing.begin(t, started)
        self.pacing.keep_only(learners)
        n1 = [learners[j] for j in neighbours(w1[me]) if j != me]
        n2 = [learners[j] for j in neighbours(w2[me]) if j != me]
        x = self.replica.begin_round()
        u = self.replica.momentum_snapshot() if plan.mixes_momentum(t) else {}
        self._snapshot = (t, x)
        self.ctx.announce()  # the record's round and state version are t from now on
        outgoing = {**x, **{MOMENTUM + name: tensor for name, tensor in u.items()}}
        sending = [asyncio.create_task(self._send_all("params", t, outgoing, n1, ledger.params, ledger))]
        compute_started = time.monotonic()
        ledger.train_loss = await asyncio.to_thread(self._inner_phase)
        ledger.compute_s = time.monotonic() - compute_started
        d = self.replica.end_inner()
        waited = time.monotonic()
        arrived = await self._collect("params", t, n1, self.settings.w1_grace_s, self.pacing.waited_for(n1))
        ledger.w1_wait_s = time.monotonic() - waited
        self._settle(ledger.params, "params", t, arrived)
        ledger.params.use(arrived)  # every parameter set that arrived (shape- and finite-checked) is mixed
        m, u_mixed = self._mix1(x, u, arrived, weights=w1, me=me, learners=learners)
        sent_d = self.attack(d) if self.attack else d
        if sent_d is not None:  # None: a Byzantine learner (--attack withhold) that never sends
            sending.append(asyncio.create_task(self._send_all(
                "pgrad", t, self.aggregator.subset_of(sent_d, round=t), n2, ledger.pseudo_gradients, ledger)))
        waited = time.monotonic()
        ledger.w2_deadline_s = self.pacing.w2_wait(t, waited)
        waited_for = self.pacing.waited_for(n2)
        ledger.not_waited_for = sorted(set(n2) - set(waited_for))
        arrived_d = await self._collect("pgrad", t, n2, ledger.w2_deadline_s, waited_for)
        ledger.w2_wait_s = time.monotonic() - waited
        ledger.slow = sorted(self.pacing.settle(t, n2))
        self._settle(ledger.pseudo_gradients, "pgrad", t, arrived_d)
        d_mixed = self.aggregator.aggregate(d, arrived_d, weights=w2, me=me, index_of=learners.index,
                                            ledger=ledger.pseudo_gradients, round=t)
        ledger.note = self.aggregator.note
        await self.ctx.fault_point("aggregate", t)  # a test's crash mid-aggregate: received, not applied
        self.replica.finish_round(m, d_mixed, u_mixed)
        await self._drain(sending)
        evaluated = time.monotonic()
        ledger.heldout_loss = await asyncio.to_thread(self._evaluate)
        ledger.eval_s = time.monotonic() - evaluated
        ledger.bytes_received = self._received_bytes.pop(t, 0)
        for old in [r for r in self._received_bytes if r < t]:
            del self._received_bytes[old]
        ledger.wall_s = time.monotonic() - started
        return ledger

    async def _collect(self, kind: str, t: int, senders: list[str], timeout_s: float,
                       wait_for: list[str]) -> dict[str, Params]:
        """With adaptive pacing ``collect_from_live``: a learner whose record left the view is no
        longer waited for. Fixed pacing waits for everyone it expected (a record can lapse on a
        loaded host whose peer is still there)."""
        if not self.pacing.adaptive:
            return await self.inbox.collect(kind, t, senders, timeout_s=timeout_s, wait_for=wait_for)
        return await collect_from_live(self.inbox, kind, t, senders, timeout_s=timeout_s, wait_for=wait_for,
                                       is_live=lambda s: self.ctx.view.get(s) is not None,
                                       until_view=self.ctx.until_view)

    def _mix1(self, x: Params, u: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
              learners: list[str]) -> tuple[Params, Params | None]:
        """Mix1: the parameters m and, when this round mixes it (``u`` not empty), the outer
        momentum u~, over the same neighbours with the same weights (and the same clipping)."""
        def mixed(own: Params, part: Callable[[Params], Params]) -> Params:
            return mix_parameters(own, {s: part(v) for s, v in arrived.items()}, weights=weights, me=me,
                                  index_of=learners.index, clip_tau=self.settings.w1_clip_tau,
                                  max_norm=self.settings.max_norm)

        m = mixed(x, lambda v: {name: v[name] for name in x})
        return m, (mixed(u, lambda v: {name: v[MOMENTUM + name] for name in u}) if u else None)

    def _inner_phase(self) -> float:
        losses = [self.replica.inner_step(*self.sampler.sample(self.ctx.device), next_byte_loss)
                  for _ in range(self.settings.diloco.inner_steps)]
        return float(sum(losses) / len(losses))

    def _evaluate(self) -> float:
        return evaluate(self.replica.module, self.heldout, context=self.settings.model.context,
                        max_batches=self.settings.eval_batches, device=self.ctx.device)

    def _settle(self, exchange: Exchange, kind: str, round: int, arrived: Mapping[str, Any]) -> None:
        exchange.settle(list(arrived))
        late = self._late_rejections.pop((kind, round), {})
        exchange.rejected.update({s: r for s, r in late.items() if s in exchange.expected})
        exchange.timed_out = [s for s in exchange.timed_out if s not in exchange.rejected]

    async def _send_all(self, kind: str, round: int, tensors: Mapping[str, torch.Tensor], to: list[str],
                        exchange: Exchange, ledger: RoundLedger) -> None:
        exchange.expected = sorted(to)
        results = await asyncio.gather(*(self._send_one(kind, round, tensors, peer_id) for peer_id in to),
                                       return_exceptions=True)
        for peer_id, result in zip(to, results, strict=True):
            if isinstance(result, int):
                ledger.bytes_sent += result
                self.ctx.traffic.add_sent(kind, result)
            elif isinstance(result, TransportError | LookupError):
                exchange.send_failures[peer_id] = str(result)[:200]
            elif isinstance(result, BaseException):
                raise result

    async def _send_one(self, kind: str, round: int, tensors: Mapping[str, torch.Tensor], peer_id: str) -> int:
        live = self.ctx.view.get(peer_id)
        if live is None:
            raise LookupError(f"{peer_id[:12]} is no longer live")
        url = f"http://{live.record.http_addr}/diloco/{kind}/{round}"
        return await self.messenger.send(url, recipient=peer_id, round=round, tensors=tensors)

    async def _drain(self, sending: list[asyncio.Task[None]]) -> None:
        done, pending = await asyncio.wait(sending, timeout=self.settings.w2_deadline_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()

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
