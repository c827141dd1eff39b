"""``Attempt``: one attempt of one step as a shard runs it (the accepted plan, its ring member, what
arrived, its sends, its deadline, how it ended). Every wait goes through ``wait``, which gives up
at the abort or the deadline, so an attempt never outlives ``step_timeout_s``; nothing of an
aborted attempt reaches the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import torch

from gossamer.peer.errors import PeerError
from gossamer.protocols.context.core import FORWARD, KVMessage, MessageSpec, RingMember
from gossamer.protocols.context.ledger import StepLedger
from gossamer.protocols.context.wire import Plan

T = TypeVar("T")


class StepAborted(PeerError):
    """The attempt was abandoned; the message says why (its ledger has the details)."""


class Attempt:
    """One attempt of one step; built when a plan is accepted (the leader: when it proposes)."""

    def __init__(self, plan: Plan, *, me: str, spec: MessageSpec, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.plan = plan
        self.me = me
        self.index = plan.members.index(me)
        self.spec = spec
        self.started = loop.time()
        self.deadline = self.started + timeout_s
        self.inbox: asyncio.Queue[tuple[str, KVMessage]] = asyncio.Queue(maxsize=plan.chunks * spec.layers + 1)
        self.ended: asyncio.Future[str] = loop.create_future()
        self.noticed = False  # ended by another member's abort notice (then we need not tell the others)
        self.member: RingMember | None = None
        self.sends: set[asyncio.Task[Any]] = set()
        self.shares: dict[str, tuple[dict[str, torch.Tensor], float]] = {}
        self.shares_in = asyncio.Event()
        self.update: asyncio.Future[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float, float]] = \
            loop.create_future()
        self.applied: asyncio.Future[int] = loop.create_future()
        self.ledger = StepLedger(step=plan.step, attempt=plan.attempt, leader=plan.leader, members=list(plan.members),
                                 index=self.index, chunks=plan.chunks, context=plan.context)
        self.ledger.coefficients.expect(self.coefficient_senders())
        others = [m for m in plan.members if m != me]
        self.ledger.reduce.expect(others if self.leads else [plan.leader])

    # -- who sends what ---------------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.plan.attempt

    @property
    def leads(self) -> bool:
        return self.index == 0

    @property
    def members(self) -> tuple[str, ...]:
        return self.plan.members

    def coefficient_senders(self) -> list[str]:
        """Whom this member gets coefficient messages from: kv from its predecessor (which passes
        on every earlier chunk's), dkv from every later member."""
        before = [self.members[self.index - 1]] if self.index > 0 else []
        return before + list(self.members[self.index + 1:])

    def sender_of(self, message: KVMessage) -> str:
        """The only member that may hand us ``message``."""
        if message.kind == FORWARD:
            return self.members[self.index - 1] if self.index > 0 else ""
        return self.members[message.user] if message.user is not None else ""

    def blame(self, waiting_for: tuple | None) -> str | None:
        """Who is late when the member waits for ``waiting_for`` = (kind, layer, owner, user)."""
        if waiting_for is None:
            return None
        kind, _layer, _owner, user = waiting_for
        if kind == FORWARD:
            return self.members[self.index - 1] if self.index > 0 else None
        return self.members[user] if user is not None else None

    # -- ending -----------------------------------------------------------------------------------

    @property
    def aborted(self) -> bool:
        return self.ended.done()

    def suspect(self, peer: str) -> None:
        """Name ``peer`` (another member) as the cause of the failure: left out of the next plans."""
        if peer != self.me and peer in self.members and peer not in self.ledger.suspects:
            self.ledger.suspects.append(peer)

    def abort(self, reason: str, *, suspect: str | None = None, noticed: bool = False) -> None:
        """End the attempt (the first reason wins), naming ``suspect`` if given."""
        if suspect is not None:
            self.suspect(suspect)
        if not self.ended.done():
            self.ended.set_result(reason)
            self.noticed = noticed

    def check(self) -> None:
        """StepAborted if the attempt has ended or its deadline has passed."""
        if self.ended.done():
            raise StepAborted(self.ended.result())
        if asyncio.get_running_loop().time() >= self.deadline:
            self.abort("deadline: the step took longer than step_timeout_s")
            raise StepAborted(self.ended.result())

    def remaining_s(self) -> float:
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    async def wait(self, awaitable: Awaitable[T], *, what: str, blame: str | None) -> T:
        """``awaitable``'s result, unless the attempt ends or its deadline passes first (then the
        attempt is aborted, ``blame`` suspected for a deadline, and StepAborted raised)."""
        self.check()
        owned = not isinstance(awaitable, asyncio.Future)  # a shared future is not ours to cancel
        task = asyncio.ensure_future(awaitable)
        try:
            done, _ = await asyncio.wait({task, self.ended}, timeout=self.remaining_s(),
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if owned:
                task.cancel()
            raise
        if task in done:
            return task.result()
        if owned:
            task.cancel()
        if not self.ended.done():
            who = f" from {blame[:12]}" if blame else ""
            self.abort(f"deadline: no {what}{who} within step_timeout_s", suspect=blame)
        raise StepAborted(self.ended.result())

    def track(self, task: asyncio.Task[Any]) -> None:
        """A send of this attempt: cancelled if the attempt is abandoned."""
        self.sends.add(task)
        task.add_done_callback(self.sends.discard)

    async def cancel_sends(self) -> None:
        tasks = list(self.sends)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
