"""Role ``cp-shard``: one member of a context-parallel ring, holding one chunk of every sequence
and the whole model. It plans steps when it leads and accepts plans when it follows; a step's
attempt runs in its ``AttemptRunner``, frames go through its ``Links``, its state between steps
is its ``StateKeeper``'s, and whom it plans with is its ``Ring``'s (``README.md`` walks a step).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import torch

from gossamer.peer.kit.conditions import wait_notified
from gossamer.peer.kit.statesync import StateSyncError
from gossamer.peer.role import FAILED, FINISHED, ProtocolRole, RoleContext, RoleHealth, TcpMethod
from gossamer.protocols.context import names
from gossamer.protocols.context.attempt import Attempt
from gossamer.protocols.context.core import BACKWARD, FORWARD
from gossamer.protocols.context.links import Links
from gossamer.protocols.context.membership import Ring
from gossamer.protocols.context.replica import Replica, RingData, StateMismatch
from gossamer.protocols.context.runner import AttemptRunner
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.context.state import StateKeeper
from gossamer.protocols.context.wire import (
    ABORT,
    DKV,
    KV,
    PLAN,
    SHARE,
    UPDATE,
    FrameRefused,
    Opened,
    Plan,
    new_attempt,
    outbound,
    parse_plan,
)
from gossamer.transport.errors import RemoteError, TransportError
from gossamer.transport.frames import Frame
from gossamer.transport.tcp import ConnectionInfo

log = logging.getLogger(__name__)


class CpShardRole(ProtocolRole[ContextSettings]):
    """A ring member: the step loop, leading and following, and the role interface."""

    name = names.SHARD

    def __init__(self, ctx: RoleContext) -> None:
        super().__init__(ctx)
        s = self.settings
        self.data = RingData.load(ctx.config.data or s.data_source, heldout_fraction=s.heldout_fraction)
        self.replica = Replica(s, ctx.device)
        self.ring = Ring(ctx)
        self.links = Links(ctx, self.ring, connect_timeout_s=min(10.0, s.plan_timeout_s), spawn=self.spawn)
        self.keeper = StateKeeper(ctx, s, self.replica, self.ring, emit=self.emit)
        self.runner = AttemptRunner(ctx, s, replica=self.replica, data=self.data, ring=self.ring, links=self.links,
                                    keeper=self.keeper, emit=self.emit)
        self.finished = False
        self.checkpoint_path = ""
        self.resumed_from = ""
        self._plans: asyncio.Queue[Attempt] = asyncio.Queue(maxsize=1)
        self._accepting = asyncio.Lock()  # held while a plan is being accepted (views, state)
        self._waiting_reported = -1

    # -- role interface -------------------------------------------------------------------------

    def tcp_methods(self) -> dict[str, TcpMethod]:
        return {names.METHOD: self.handle}

    async def start(self) -> None:
        self.resumed_from = self.keeper.resume()
        self.spawn(self._run(), name="steps")

    async def aclose(self) -> None:
        await super().aclose()
        await self.links.aclose()

    async def checkpoint(self) -> str | None:
        return await self.keeper.checkpoint()

    @property
    def round(self) -> int:
        return self.replica.version

    def model_state(self) -> tuple[int, Mapping[str, torch.Tensor]]:
        return self.replica.model_state()

    def status(self) -> dict[str, Any]:
        plan, history = self.runner.last_plan, self.runner.history
        assignment = {} if plan is None or self.peer_id not in plan.members else {
            "chunk": plan.members.index(self.peer_id), "chunks": plan.chunks, "context": plan.context}
        last = history.last(1)
        return {"step": self.replica.version, "assignment": assignment, "leader": plan.leader if plan else None,
                "finished": self.finished, "checkpoint": self.checkpoint_path, "refused": dict(self.links.refused),
                "resumed_from": self.resumed_from, "steps": self.settings.steps, "series": self.runner.series,
                "loss": last[0]["loss"] if last else None, "ledgers": history.last(3)}

    def health(self) -> RoleHealth:
        health = super().health()
        if health.state != FAILED and self.finished:
            return RoleHealth(FINISHED, f"{self.replica.version} steps; checkpoint {self.checkpoint_path}")
        return health

    def gauges(self) -> dict[str, float]:
        applied = [ledger for ledger in self.runner.history if ledger.applied and ledger.loss is not None]
        return {"context_step_loss": applied[-1].loss} if applied else {}

    async def until_step(self, step: int, *, timeout_s: float) -> bool:
        """Wait until this shard's model is at ``step`` or later (False at the timeout)."""
        return await self.keeper.until_step(step, timeout_s=timeout_s)

    async def handle(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """The TCP method: every ring frame, checked by ``Links``, handled by its op's handler."""
        runner = self.runner
        return await self.links.serve(frame, bound=self._max_payload, handlers={
            PLAN: self.on_plan, KV: runner.on_coefficients, DKV: runner.on_coefficients, SHARE: runner.on_share,
            UPDATE: runner.on_update, ABORT: runner.on_abort})

    def _max_payload(self, op: str) -> int:
        replica = self.replica
        return {PLAN: 0, ABORT: 0, KV: replica.coefficient_bytes[FORWARD], DKV: replica.coefficient_bytes[BACKWARD],
                SHARE: replica.gradient_bytes, UPDATE: replica.gradient_bytes + replica.basis_bytes}[op]

    # -- the loop -------------------------------------------------------------------------------

    def done(self) -> bool:
        return bool(self.settings.steps) and self.replica.version >= self.settings.steps

    async def _run(self) -> None:
        await self.keeper.catch_up(why="joined")
        while not self.done():
            attempt = await self._next_attempt()
            if attempt is not None:
                await self.runner.run(attempt)
        await self._finish()

    async def _next_attempt(self) -> Attempt | None:
        if not self._plans.empty():
            return self._plans.get_nowait()
        if self.ring.leader() == self.peer_id and not self.keeper.busy and not self._accepting.locked():
            return await self._lead()
        return await self._follow()

    async def _follow(self) -> Attempt | None:
        """The next accepted plan; None when this shard has become the leader, or after
        ``plan_timeout_s`` without a plan (then it catches up if the others are ahead)."""
        get = asyncio.ensure_future(self._plans.get())
        turn = asyncio.ensure_future(self.ctx.until_view(lambda: self.ring.leader() == self.peer_id,
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
            await self.keeper.catch_up(why="behind the ring")
        return None

    async def _lead(self) -> Attempt | None:
        members = self.ring.candidates()[:self.settings.max_shards]
        if len(members) < self.settings.min_shards:
            if len(members) != self._waiting_reported:
                self._waiting_reported = len(members)
                self.emit("waiting", shards=len(members), wanted=self.settings.min_shards)
            await self.next_refresh()
            return None
        self._waiting_reported = -1
        state = None
        if not self.keeper.shared_by(members):
            state = (self.replica.version, await self.keeper.digest())
        if self.runner.attempt is not None or not self._plans.empty() or self._accepting.locked():
            return None  # a lower peer's plan came in meanwhile: follow it
        plan = Plan(step=self.replica.version, attempt=new_attempt(), members=tuple(members),
                    chunk_tokens=self.settings.chunk_tokens, batch_size=self.settings.batch_size,
                    data=self.data.digest, state=state)
        log.debug("proposing step %d (attempt %s) to a ring of %d", plan.step, plan.attempt, plan.chunks)
        attempt = self.runner.begin(plan)
        answers = await asyncio.gather(*(self._propose(attempt, member) for member in members[1:]))
        refusals = {m: answer for m, answer in zip(members[1:], answers, strict=True) if answer is not None}
        if not refusals:
            return attempt
        await self.runner.give_up(attempt, "plan refused: " + "; ".join(
            f"{m[:12]} {code}: {text}" for m, (code, text, _) in refusals.items()))
        for member, (code, _text, version) in refusals.items():
            if code == "behind":
                self.keeper.not_shared_with(member)
            elif code == "ahead" and isinstance(version, int) and version > self.replica.version:
                await self.keeper.catch_up(why=f"{member[:12]} is at step {version}")
        if not attempt.ledger.suspects:
            await self.next_refresh()
        return None

    async def _propose(self, attempt: Attempt, member: str) -> tuple[str, str, Any] | None:
        """Send the plan to ``member``; None when accepted, else (code, reason, its version)."""
        signed = outbound(PLAN, attempt.plan.step, attempt.plan.body())
        try:
            answer = await self.links.ask(member, signed, timeout_s=self.settings.plan_timeout_s)
        except RemoteError as exc:
            return "refused", str(exc)[:200], None
        except (TransportError, LookupError) as exc:
            attempt.suspect(member)
            return "unreachable", f"{type(exc).__name__}: {str(exc)[:200]}", None
        if answer.header.get("accepted") is True:
            return None
        return str(answer.header.get("code"))[:32], str(answer.header.get("reason"))[:200], answer.header.get("version")

    # -- plans from a leader ----------------------------------------------------------------------

    async def on_plan(self, opened: Opened) -> dict[str, Any]:
        plan = parse_plan(opened, max_members=self.settings.max_shards)
        if opened.sender != plan.leader or self.peer_id not in plan.members:
            raise FrameRefused("header: a plan comes from its leader to its members", code="header")
        if self.runner.attempt is not None and self.runner.attempt.id == plan.attempt:
            return {"accepted": True}
        refusal = self._plan_refusal(plan)
        if refusal is not None:
            return self._refused(*refusal)
        async with self._accepting:
            if not await self._see(plan.members):
                return self._refused("view", "this shard does not see every member of the plan live yet")
            if plan.step > self.replica.version or await self._other_state(plan):
                try:
                    await self.keeper.download(plan)
                except (StateSyncError, StateMismatch) as exc:
                    return self._refused("sync", str(exc)[:200])
            refusal = self._plan_refusal(plan, accepting=True)
            if refusal is not None:
                return self._refused(*refusal)
            self._plans.put_nowait(self.runner.begin(plan))
        return {"accepted": True}

    async def _other_state(self, plan: Plan) -> bool:
        """Whether this shard holds another state than the leader at the plan's very step: a ring
        that trained apart (its members' views had not met yet) reaches the same version with
        another model, and joining without the leader's state would leave two models in one ring."""
        return plan.state is not None and plan.state[0] == plan.step == self.replica.version \
            and await self.keeper.digest() != plan.state[1]

    def _refused(self, code: str, reason: str) -> dict[str, Any]:
        log.info("refused a plan: %s: %s", code, reason)
        return {"accepted": False, "code": code, "reason": reason, "version": self.replica.version}

    async def _see(self, members: tuple[str, ...]) -> bool:
        """Whether every other member is (or, within two heartbeats, becomes) a live cp-shard in
        this shard's view: it must verify their frames and reach their addresses."""
        def all_live() -> bool:
            return all(m == self.peer_id or self.ring.live(m) is not None for m in members)

        wait_s = min(self.settings.plan_timeout_s / 2, 2 * self.ctx.manifest.config.heartbeat_s)
        return await self.ctx.until_view(all_live, timeout_s=wait_s)

    def _plan_refusal(self, plan: Plan, *, accepting: bool = False) -> tuple[str, str] | None:
        """Why this shard cannot take ``plan`` now (code, reason), or None (``accepting``: this
        very plan holds the accepting lock)."""
        if self.finished or self.done():
            return "finished", f"this shard finished at step {self.replica.version}"
        busy = self.runner.attempt is not None or self.keeper.busy or not self._plans.empty()
        if busy or (self._accepting.locked() and not accepting):
            return "busy", "this shard is in another step or plan"
        if self.runner.was_aborted(plan.attempt):
            return "stale", "that attempt was aborted"
        leader = self.ring.leader()
        if plan.leader != leader:
            if not (plan.leader < leader and self.ring.live(plan.leader) is not None):
                return "leader", f"this shard follows {leader[:12]}"
            self.ring.trust(plan.leader)  # a live peer below our choice leads: we suspected it wrongly
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
        path = await self.keeper.write_model()
        plan = self.runner.last_plan
        context = plan.context if plan else self.settings.min_shards * self.settings.chunk_tokens
        heldout = await asyncio.to_thread(self.replica.heldout_loss, self.data.heldout, context=context)
        applied = [ledger for ledger in self.runner.history if ledger.applied]
        self.finished, self.checkpoint_path = True, path
        self.emit("finished", step=self.replica.version, loss=applied[-1].loss if applied else None,
                  heldout_loss=heldout, context=context, checkpoint=path)
        log.info("finished at step %d; held-out loss %.3f at %d tokens; checkpoint %s", self.replica.version,
                 heldout, context, path)
