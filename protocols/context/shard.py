"""Role ``cp-shard``: one member of a context-parallel ring, holding one chunk of every sequence.

The ring is the live, admitted cp-shards of the run, ordered by peer id, at most
``model.context // chunk_tokens`` of them; the lowest is the **leader**. Peers a shard has seen
fail are left out (**suspects**) until their signed record is renewed: a killed peer never renews
it, a slow one does within a heartbeat. A step (DESIGN.md, "Compressed context parallelism"):

1. **plan**: the leader sends every member the plan (step = model version, a fresh attempt id,
   the members in ring order, chunk size, batch size, the data's digest; for a member that was
   not in its last step, where to download the state). A member accepts when it is idle, takes
   the sender for the leader, and is at that version (one behind downloads the leader's state
   first, and so a joiner is placed at the next step boundary; one ahead refuses, and the leader
   catches up; one at that version whose state differs from the one the plan names, e.g. from a
   ring that trained apart before the views met, downloads it too). The ring of a step is the
   plan's, whatever anyone's view says meanwhile.
2. **ring**: member p of P draws the step's batch (the same sequences everywhere, from the seed
   and the step), keeps positions [pT, (p+1)T) and runs ``RingMember`` one unit of compute at a
   time in a worker thread; its coefficient messages go out as signed TCP frames on pooled
   connections (``route.pool``), kv frames are passed on as they arrive.
3. **reduce**: each member sends its gradient share to the leader, which sums them in member
   order (complementary parts of one gradient: never a robust aggregator), applies the update,
   and sends every member the summed gradient with its new bases; a member applies the same
   update, takes the bases, and answers. The step is done.

Any failure aborts the attempt (``attempt``): the member that noticed tells the others, suspects
are left out, and the leader plans the same step again with the survivors, a shorter context.
Each attempt leaves a ledger (``ledger``) and an event. Frames and their checks: ``wire`` and
``traffic``; the step's compute and reduction: ``stepping``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from typing import Any

import torch

from gossamer.crypto.envelope import ReplayGuard
from gossamer.peer.kit.checkpoint import Checkpoints
from gossamer.peer.kit.conditions import wait_notified, wait_until
from gossamer.peer.kit.ledger import History
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth, TcpMethod
from gossamer.peer.route.pool import HopPool
from gossamer.protocols.context import names
from gossamer.protocols.context.attempt import Attempt
from gossamer.protocols.context.core import ring_spec
from gossamer.protocols.context.keeping import StateKeeper
from gossamer.protocols.context.ledger import StepLedger
from gossamer.protocols.context.replica import MODEL, Replica, RingData, StateMismatch
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.context.stepping import StepRunner
from gossamer.protocols.context.traffic import RingTraffic
from gossamer.protocols.context.wire import (
    PLAN,
    FrameRefused,
    Opened,
    Plan,
    new_attempt,
    outbound,
    parse_plan,
)
from gossamer.transport.errors import RemoteError, TransportError
from gossamer.transport.tcp import TcpConfig

log = logging.getLogger(__name__)
MAX_SUSPICION_S = 300.0


class CpShardRole(RingTraffic, StepRunner, StateKeeper, ProtocolRole[ContextSettings]):
    """A ring member (see the module docstring)."""

    name = names.SHARD

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        self.data = RingData.load(ctx.config.data or self.settings.data_source,
                                  heldout_fraction=self.settings.heldout_fraction)
        self.replica = Replica(self.settings, ctx.device)
        self.pool = HopPool(config=TcpConfig(connect_timeout_s=min(10.0, self.settings.plan_timeout_s)))
        self.guard = ReplayGuard(started_at=ctx.now())  # envelopes stamped before this start are refused
        self.history: History[tuple[int, str], StepLedger] = History()
        self.checkpoints = Checkpoints(ctx.config.checkpoint_dir, run_id=ctx.manifest.run_id, format="gossamer/context")
        self.refused: Counter[str] = Counter()
        self.attempt: Attempt | None = None
        self.last_plan: Plan | None = None
        self.finished = False
        self.checkpoint_path = ""
        self.resumed_from = ""
        self.series: dict[str, list[list[float]]] = {"loss": []}  # [step, loss] of each applied step
        self._plans: asyncio.Queue[Attempt] = asyncio.Queue(maxsize=1)
        self._state_lock = asyncio.Lock()  # held while a downloaded state is fetched and adopted
        self._accepting = asyncio.Lock()  # held while a plan is being accepted (views, state)
        self._suspects: dict[str, float] = {}  # peer -> left out while its record is no newer than this
        self._strikes: Counter[str] = Counter()  # failures of each peer since its last completed step
        self._synced: set[str] = {self.peer_id}
        self._early: OrderedDict[str, list[Opened]] = OrderedDict()
        self._dead: deque[str] = deque(maxlen=64)
        self._digest: tuple[int, str] | None = None
        self._checkpointed = -1  # the version the last checkpoint holds
        self._waiting_reported = -1
        self._stepped = asyncio.Condition()

    # -- role interface -------------------------------------------------------------------------

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return {names.METHOD: self.handle}

    async def start(self) -> None:
        self.resumed_from = self.resume()
        self.spawn(self._run(), name="steps")

    async def aclose(self) -> None:
        await super().aclose()
        await self.pool.aclose()

    @property
    def round(self) -> int:
        return self.replica.version

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]]:
        return self.replica.model_state()

    def status(self) -> dict[str, Any]:
        plan = self.last_plan
        assignment = {} if plan is None or self.peer_id not in plan.members else {
            "chunk": plan.members.index(self.peer_id), "chunks": plan.chunks, "context": plan.context}
        last = self.history.last(1)
        return {"step": self.replica.version, "assignment": assignment, "leader": plan.leader if plan else None,
                "finished": self.finished, "checkpoint": self.checkpoint_path, "refused": dict(self.refused),
                "resumed_from": self.resumed_from, "steps": self.settings.steps, "series": self.series,
                "loss": last[0]["loss"] if last else None, "ledgers": self.history.last(3)}

    def health(self) -> RoleHealth:
        health = super().health()
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"{self.replica.version} steps; checkpoint {self.checkpoint_path}")
        return health

    def gauges(self) -> dict[str, float]:
        applied = [ledger for ledger in self.history if ledger.applied and ledger.loss is not None]
        return {"context_step_loss": applied[-1].loss} if applied else {}

    async def until_step(self, step: int, *, timeout_s: float) -> bool:
        """Wait until this shard's model is at ``step`` or later (False at the timeout)."""
        return await wait_until(self._stepped, lambda: self.replica.version >= step, timeout_s=timeout_s)

    # -- the ring: who is in it and who leads -----------------------------------------------------

    def candidates(self) -> list[str]:
        """This shard and every live cp-shard it does not suspect, sorted by peer id."""
        ids = {self.peer_id}
        for peer in self.peers_with(names.SHARD):
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

    def cleared(self, members: tuple[str, ...]) -> None:
        """``members`` completed a step with this shard: their failures are forgotten."""
        for member in members:
            self._strikes.pop(member, None)

    # -- the loop -------------------------------------------------------------------------------

    def done(self) -> bool:
        return bool(self.settings.steps) and self.replica.version >= self.settings.steps

    async def _run(self) -> None:
        await self.catch_up(why="joined")
        while not self.done():
            attempt = await self._next_attempt()
            if attempt is not None:
                await self.run_attempt(attempt)
        await self._finish()

    async def _next_attempt(self) -> Attempt | None:
        if not self._plans.empty():
            return self._plans.get_nowait()
        if self.leader() == self.peer_id and not self._state_lock.locked() and not self._accepting.locked():
            return await self._lead()
        return await self._follow()

    async def _follow(self) -> Attempt | None:
        """The next accepted plan; None when this shard has become the leader, or after
        ``plan_timeout_s`` without a plan (then it catches up if the others are ahead)."""
        get = asyncio.ensure_future(self._plans.get())
        turn = asyncio.ensure_future(self.ctx.until_view(lambda: self.leader() == self.peer_id,
                                                         timeout_s=self.settings.plan_timeout_s))
        try:
            await asyncio.wait({get, turn}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (get, turn):
                if not task.done():
                    task.cancel()
            await asyncio.gather(get, turn, return_exceptions=True)
        if get.done() and not get.cancelled():
            return get.result()
        if turn.done() and not turn.cancelled() and not turn.result():
            await self.catch_up(why="behind the ring")
        return None

    async def _lead(self) -> Attempt | None:
        members = self.candidates()[:self.settings.max_shards]
        if len(members) < self.settings.min_shards:
            if len(members) != self._waiting_reported:
                self._waiting_reported = len(members)
                self.emit("waiting", shards=len(members), wanted=self.settings.min_shards)
            await self.next_refresh()
            return None
        self._waiting_reported = -1
        state = None
        if not set(members) <= self._synced:
            state = (self.replica.version, await self._state_digest())
        if self.attempt is not None or not self._plans.empty() or self._accepting.locked():
            return None  # a lower peer's plan came in meanwhile: follow it
        plan = Plan(step=self.replica.version, attempt=new_attempt(), members=tuple(members),
                    chunk_tokens=self.settings.chunk_tokens, batch_size=self.settings.batch_size,
                    data=self.data.digest, state=state)
        log.debug("proposing step %d (attempt %s) to a ring of %d", plan.step, plan.attempt, plan.chunks)
        attempt = self.begin(plan)
        answers = await asyncio.gather(*(self._propose(attempt, member) for member in members[1:]))
        refusals = {m: answer for m, answer in zip(members[1:], answers, strict=True) if answer is not None}
        if not refusals:
            return attempt
        attempt.abort("plan refused: " + "; ".join(f"{m[:12]} {code}: {text}" for m, (code, text, _) in refusals.items()))
        await self.abandon(attempt)
        self.attempt = None
        self.finish_ledger(attempt)
        for member, (code, _text, version) in refusals.items():
            if code == "behind":
                self._synced.discard(member)
            elif code == "ahead" and isinstance(version, int) and version > self.replica.version:
                await self.catch_up(why=f"{member[:12]} is at step {version}")
        if not attempt.ledger.suspects:
            await self.next_refresh()
        return None

    async def _propose(self, attempt: Attempt, member: str) -> tuple[str, str, Any] | None:
        """Send the plan to ``member``; None when accepted, else (code, reason, its version)."""
        signed = outbound(PLAN, attempt.plan.step, attempt.plan.body())
        try:
            answer = await self.ask(member, signed, timeout_s=self.settings.plan_timeout_s)
        except RemoteError as exc:
            return "refused", str(exc)[:200], None
        except (TransportError, LookupError) as exc:
            attempt.suspect(member)
            return "unreachable", f"{type(exc).__name__}: {str(exc)[:200]}", None
        if answer.header.get("accepted") is True:
            return None
        return str(answer.header.get("code"))[:32], str(answer.header.get("reason"))[:200], answer.header.get("version")

    def begin(self, plan: Plan) -> Attempt:
        """Make ``plan`` this shard's attempt; frames that came early for it are taken now."""
        spec = ring_spec(self.replica.model, step=plan.step, chunks=plan.chunks, batch=plan.batch_size,
                         tokens=plan.chunk_tokens)
        attempt = Attempt(plan, me=self.peer_id, spec=spec, timeout_s=self.settings.step_timeout_s)
        if self.last_plan is None or self.last_plan.members != plan.members:
            self.emit("ring", step=plan.step, attempt=plan.attempt, leader=plan.leader, members=list(plan.members),
                      index=attempt.index, chunks=plan.chunks, context=plan.context)
        self.attempt, self.last_plan = attempt, plan
        early = self._early.pop(plan.attempt, [])
        self._early.clear()
        for opened in early:
            try:
                self.take_coefficients(attempt, opened)
            except FrameRefused as exc:
                attempt.ledger.coefficients.reject(opened.sender, f"{exc.code}: {exc}")
                attempt.abort(f"an early frame of {opened.sender[:12]} was refused: {exc}", suspect=opened.sender)
        return attempt

    # -- plans from a leader ----------------------------------------------------------------------

    async def on_plan(self, opened: Opened) -> dict[str, Any]:
        plan = parse_plan(opened, max_members=self.settings.max_shards)
        if opened.sender != plan.leader or self.peer_id not in plan.members:
            raise FrameRefused("header: a plan comes from its leader to its members", code="header")
        if self.attempt is not None and self.attempt.id == plan.attempt:
            return {"accepted": True}
        refusal = self._plan_refusal(plan)
        if refusal is not None:
            return self._refused(*refusal)
        async with self._accepting:
            if not await self._see(plan.members):
                return self._refused("view", "this shard does not see every member of the plan live yet")
            if plan.step > self.replica.version or await self._other_state(plan):
                try:
                    await self._download(plan)
                except (StateSyncError, StateMismatch) as exc:
                    return self._refused("sync", str(exc)[:200])
            refusal = self._plan_refusal(plan, accepting=True)
            if refusal is not None:
                return self._refused(*refusal)
            self._plans.put_nowait(self.begin(plan))
        return {"accepted": True}

    async def _other_state(self, plan: Plan) -> bool:
        """Whether this shard holds another state than the leader at the plan's very step: a ring
        that trained apart (its members' views had not met yet) reaches the same version with
        another model, and joining without the leader's state would leave two models in one ring."""
        return plan.state is not None and plan.state[0] == plan.step == self.replica.version \
            and await self._state_digest() != plan.state[1]

    def _refused(self, code: str, reason: str) -> dict[str, Any]:
        log.info("refused a plan: %s: %s", code, reason)
        return {"accepted": False, "code": code, "reason": reason, "version": self.replica.version}

    async def _see(self, members: tuple[str, ...]) -> bool:
        """Whether every other member is (or, within two heartbeats, becomes) a live cp-shard in
        this shard's view: it must verify their frames and reach their addresses."""
        def all_live() -> bool:
            return all(m == self.peer_id or self.live_with(m, names.SHARD) is not None for m in members)

        wait_s = min(self.settings.plan_timeout_s / 2, 2 * self.ctx.manifest.config.heartbeat_s)
        return await self.ctx.until_view(all_live, timeout_s=wait_s)

    def _plan_refusal(self, plan: Plan, *, accepting: bool = False) -> tuple[str, str] | None:
        """Why this shard cannot take ``plan`` now (code, reason), or None (``accepting``: this
        very plan holds the accepting lock)."""
        if self.finished or self.done():
            return "finished", f"this shard finished at step {self.replica.version}"
        busy = self.attempt is not None or self._state_lock.locked() or not self._plans.empty()
        if busy or (self._accepting.locked() and not accepting):
            return "busy", "this shard is in another step or plan"
        if plan.attempt in self._dead:
            return "stale", "that attempt was aborted"
        leader = self.leader()
        if plan.leader != leader:
            if not (plan.leader < leader and self.live_with(plan.leader, names.SHARD) is not None):
                return "leader", f"this shard follows {leader[:12]}"
            self._suspects.pop(plan.leader, None)  # a live peer below our choice leads: we suspected it wrongly
        if (plan.chunk_tokens, plan.batch_size) != (self.settings.chunk_tokens, self.settings.batch_size):
            return "settings", "chunk_tokens or batch_size differ from this run's"
        if plan.data != self.data.digest:
            return "data", "this shard trains on other data (its digest differs)"
        if plan.step < self.replica.version:
            return "ahead", f"this shard is at step {self.replica.version}"
        if plan.step > self.replica.version and (plan.state is None or plan.state[0] != plan.step):
            return "behind", f"this shard is at step {self.replica.version} and the plan offers no state"
        return None

    async def next_refresh(self) -> None:
        """Wait for the next view refresh (at most a heartbeat)."""
        await wait_notified(self.ctx.view_refreshed, timeout_s=self.ctx.manifest.config.heartbeat_s)

    # -- the end --------------------------------------------------------------------------------

    async def _finish(self) -> None:
        _version, tensors = self.replica.model_state()
        params = {name.removeprefix(MODEL): t for name, t in tensors.items() if name.startswith(MODEL)}
        name = f"{self.ctx.manifest.config.name}-{self.peer_id[:12]}-step{self.replica.version}"
        path = await self.checkpoints.write_async(name, params, step=str(self.replica.version))
        context = self.last_plan.context if self.last_plan else self.settings.min_shards * self.settings.chunk_tokens
        heldout = await asyncio.to_thread(self.replica.heldout_loss, self.data.heldout, context=context)
        applied = [ledger for ledger in self.history if ledger.applied]
        self.finished, self.checkpoint_path = True, str(path)
        self.emit("finished", step=self.replica.version, loss=applied[-1].loss if applied else None,
                  heldout_loss=heldout, context=context, checkpoint=str(path))
        log.info("finished at step %d; held-out loss %.3f at %d tokens; checkpoint %s", self.replica.version,
                 heldout, context, path)
