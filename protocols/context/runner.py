"""``AttemptRunner``: a cp-shard's current attempt of a step, from the accepted plan to its ledger: the ring's
compute (one ``RingMember.step`` at a time in a worker thread), the frames that arrive for it, the gradient
reduction and the update, or the abort. The model changes only once every share (the leader) or the leader's
update (a member) has arrived; nothing of an aborted attempt reaches it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gossamer.peer.kit.ledger import History
from gossamer.peer.role import RoleContext
from gossamer.protocols.context.attempt import Attempt, StepAborted
from gossamer.protocols.context.core import (
    FORWARD,
    MessageRefused,
    RingMember,
    clip_shares,
    decode_message,
    encode_message,
    forward_to,
    reduce_gradients,
    ring_spec,
)
from gossamer.protocols.context.ledger import StepLedger
from gossamer.protocols.context.links import Links, send_failed
from gossamer.protocols.context.membership import Ring
from gossamer.protocols.context.replica import Replica, RingData
from gossamer.protocols.context.settings import ContextSettings
from gossamer.protocols.context.state import StateKeeper
from gossamer.protocols.context.wire import (
    ABORT,
    SHARE,
    UPDATE,
    FrameRefused,
    Opened,
    Plan,
    number_field,
    outbound,
    parse_abort,
)
from gossamer.transport.codec import decode_tensors, encode_tensors
from gossamer.transport.errors import DecodeError, NonFiniteTensor, RemoteError, TransportError

log = logging.getLogger(__name__)
ABORT_NOTICE_TIMEOUT_S = 2.0
MAX_SERIES = 2000  # loss points kept for /status (the swarm page's curves)
MAX_EARLY_ATTEMPTS = 2  # attempts whose frames are held until their plan is accepted here
GRAD, BASIS = "grad.", "basis."
Specs = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


class AttemptRunner:
    """Runs this shard's attempts one at a time and keeps their ledgers."""

    def __init__(self, ctx: RoleContext, settings: ContextSettings, *, replica: Replica, data: RingData, ring: Ring,
                 links: Links, keeper: StateKeeper, emit: Callable[..., None]) -> None:
        self.ctx = ctx
        self.settings = settings
        self.replica = replica
        self.data = data
        self.ring = ring
        self.links = links
        self.keeper = keeper
        self._emit = emit
        self.attempt: Attempt | None = None  # the accepted attempt under way
        self.last_plan: Plan | None = None
        self.history: History[tuple[int, str], StepLedger] = History()
        self.series: dict[str, list[list[float]]] = {"loss": []}  # [step, loss] of each applied step
        self._early: OrderedDict[str, list[Opened]] = OrderedDict()  # frames of attempts not accepted yet
        self._dead: deque[str] = deque(maxlen=64)  # attempts aborted: their frames are stale

    @property
    def me(self) -> str:
        return self.ring.me

    def was_aborted(self, attempt_id: str) -> bool:
        return attempt_id in self._dead

    # -- an attempt from its plan to its ledger -------------------------------------------------

    def begin(self, plan: Plan) -> Attempt:
        """Make ``plan`` this shard's attempt; frames that came early for it are taken now."""
        spec = ring_spec(self.replica.model, step=plan.step, chunks=plan.chunks, batch=plan.batch_size,
                         tokens=plan.chunk_tokens)
        attempt = Attempt(plan, me=self.me, spec=spec, timeout_s=self.settings.step_timeout_s)
        if self.last_plan is None or self.last_plan.members != plan.members:
            self._emit("ring", step=plan.step, attempt=plan.attempt, leader=plan.leader, members=list(plan.members),
                       index=attempt.index, chunks=plan.chunks, context=plan.context)
        self.attempt, self.last_plan = attempt, plan
        early = self._early.pop(plan.attempt, [])
        self._early.clear()
        for opened in early:
            try:
                self._take_coefficients(attempt, opened)
            except FrameRefused as exc:
                attempt.ledger.coefficients.reject(opened.sender, f"{exc.code}: {exc}")
                attempt.abort(f"an early frame of {opened.sender[:12]} was refused: {exc}", suspect=opened.sender)
        return attempt

    async def run(self, attempt: Attempt) -> None:
        """Run an accepted attempt to its end, applied or aborted; its ledger is emitted."""
        plan = attempt.plan
        try:
            attempt.check()
            tokens, targets = self.data.chunk(step=plan.step, seed=self.settings.seed, batch_size=plan.batch_size,
                                              chunks=plan.chunks, chunk_tokens=plan.chunk_tokens, index=attempt.index)
            attempt.member = RingMember(self.replica.model, index=attempt.index, chunks=plan.chunks, step=plan.step,
                                        tokens=tokens, targets=targets)
            await self._ring(attempt)
            await (self._reduce_as_leader(attempt) if attempt.leads else self._reduce_as_member(attempt))
        except StepAborted:
            await self._abandon(attempt)
        finally:
            if self.attempt is attempt:
                self.attempt = None
        self._finish_ledger(attempt)
        await self.keeper.stepped()

    async def give_up(self, attempt: Attempt, reason: str) -> None:
        """End an attempt that never ran (a member refused the plan): abort it, tell the members."""
        attempt.abort(reason)
        await self._abandon(attempt)
        if self.attempt is attempt:
            self.attempt = None
        self._finish_ledger(attempt)

    async def _ring(self, attempt: Attempt) -> None:
        member = attempt.member
        assert member is not None
        while not member.done:
            while not attempt.inbox.empty():
                self._deliver(attempt, *attempt.inbox.get_nowait())
            began = time.perf_counter()
            sends = await asyncio.to_thread(member.step)
            attempt.ledger.compute_s += time.perf_counter() - began
            attempt.check()
            if sends is None:
                waiting = member.waiting_for
                sender, message = await attempt.wait(attempt.inbox.get(), what=f"message {waiting}",
                                                     blame=attempt.blame(waiting))
                self._deliver(attempt, sender, message)
                continue
            for send in sends:
                header, payload = encode_message(send.message, mixtures=attempt.spec.mixtures)
                signed = outbound(send.message.kind, attempt.plan.step, {"attempt": attempt.id, "msg": header}, payload)
                self.links.post(attempt, attempt.members[send.to], signed)

    @staticmethod
    def _deliver(attempt: Attempt, sender: str, message: Any) -> None:
        assert attempt.member is not None
        try:
            attempt.member.deliver(message)
        except MessageRefused as exc:
            attempt.ledger.coefficients.reject(sender, f"{exc.code}: {exc}")
            attempt.abort(f"refused a message of {sender[:12]}: {exc}", suspect=sender)
            raise StepAborted(str(exc)) from exc

    # -- the reduction ----------------------------------------------------------------------------

    def _own_share(self, attempt: Attempt) -> dict[str, Any]:
        member = attempt.member
        assert member is not None and member.loss is not None
        attempt.ledger.chunk_loss = float(member.loss)
        return {name: grad.detach().to("cpu") for name, grad in member.gradients().items()}

    async def _reduce_as_leader(self, attempt: Attempt) -> None:
        attempt.shares[self.me] = (self._own_share(attempt), attempt.ledger.chunk_loss or 0.0)
        if len(attempt.shares) == attempt.plan.chunks:
            attempt.shares_in.set()
        missing = [m for m in attempt.members if m not in attempt.shares]
        await attempt.wait(attempt.shares_in.wait(), what="gradient share", blame=missing[0] if missing else None)
        shares, clipped = await asyncio.to_thread(clip_shares, [attempt.shares[m][0] for m in attempt.members],
                                                  self.settings.share_clip)
        attempt.ledger.clipped = {attempt.members[i]: round(norm, 6) for i, norm in clipped.items()}
        total = reduce_gradients(shares)
        loss = sum(attempt.shares[m][1] for m in attempt.members)
        attempt.check()
        norm = await asyncio.to_thread(self.replica.apply, total)
        self._applied(attempt, loss, norm)
        self.keeper.shared_with(attempt.members)
        tensors = {GRAD + name: grad for name, grad in total.items()}
        tensors.update({BASIS + name: basis for name, basis in self.replica.bases().items()})
        entries, buffers = encode_tensors(tensors)
        signed = outbound(UPDATE, attempt.plan.step, {"attempt": attempt.id, "loss": loss, "norm": norm,
                                                      "tensors": entries}, buffers)
        members = attempt.members[1:]
        results = await asyncio.gather(*(self.links.ask(m, signed, timeout_s=self.settings.plan_timeout_s)
                                         for m in members), return_exceptions=True)
        for member, result in zip(members, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, TransportError | LookupError):
                    raise result
                attempt.ledger.reduce.send_failures[member] = f"update: {type(result).__name__}: {str(result)[:160]}"
                self.keeper.not_shared_with(member)
                if not isinstance(result, RemoteError):
                    self.ring.suspect(member)
            else:
                attempt.ledger.bytes_sent += sum(b.nbytes for b in buffers)
        self.ctx.traffic.add_sent("context_update", sum(b.nbytes for b in buffers) * len(members))

    async def _reduce_as_member(self, attempt: Attempt) -> None:
        grads = self._own_share(attempt)
        entries, buffers = encode_tensors(grads)
        signed = outbound(SHARE, attempt.plan.step, {"attempt": attempt.id, "loss": attempt.ledger.chunk_loss,
                                                     "tensors": entries}, buffers)
        leader = attempt.plan.leader
        try:
            await attempt.wait(self.links.ask(leader, signed, timeout_s=attempt.remaining_s()),
                               what="answer to our gradient share", blame=leader)
        except (TransportError, LookupError) as exc:
            send_failed(attempt, leader, SHARE, exc)
            raise StepAborted(str(exc)) from exc
        attempt.ledger.bytes_sent += sum(b.nbytes for b in buffers)
        self.ctx.traffic.add_sent("context_share", sum(b.nbytes for b in buffers))
        grads, bases, loss, _norm = await attempt.wait(attempt.update, what="update", blame=leader)
        attempt.check()
        norm = await asyncio.to_thread(self.replica.apply, grads, bases)
        self._applied(attempt, loss, norm)
        self.attempt = None  # idle from here: the leader's next plan may come as soon as we answer
        attempt.applied.set_result(self.replica.version)

    def _applied(self, attempt: Attempt, loss: float, norm: float) -> None:
        attempt.ledger.applied, attempt.ledger.loss, attempt.ledger.grad_norm = True, loss, norm
        self.ctx.announce()

    # -- the end of an attempt --------------------------------------------------------------------

    async def _abandon(self, attempt: Attempt) -> None:
        """Stop everything of an aborted attempt and tell the other members (unless one told us and
        this shard does not lead: the leader passes on every notice it gets, since a member may not
        yet verify the frames of another member whose record it has not seen, but it took the
        leader's plan)."""
        await attempt.cancel_sends()
        for peer in attempt.ledger.suspects:
            self.ring.suspect(peer)
        self._dead.append(attempt.id)
        if attempt.noticed and not attempt.leads:
            return
        reason = attempt.ended.result() if attempt.ended.done() else "abandoned"
        suspect = attempt.ledger.suspects[0] if attempt.ledger.suspects else None
        signed = outbound(ABORT, attempt.plan.step, {"attempt": attempt.id, "reason": reason[:400], "suspect": suspect})
        others = [m for m in attempt.members if m != self.me]  # a suspect may be alive: it would wait
        await asyncio.gather(*(self.links.ask(m, signed, timeout_s=ABORT_NOTICE_TIMEOUT_S) for m in others),
                             return_exceptions=True)

    def _finish_ledger(self, attempt: Attempt) -> None:
        ledger = attempt.ledger
        if not ledger.applied:
            ledger.aborted = attempt.ended.result() if attempt.ended.done() else "abandoned"
        ledger.wall_s = asyncio.get_running_loop().time() - attempt.started
        ledger.settle()
        self.history.add((ledger.step, ledger.attempt), ledger)
        fields = ledger.to_json()
        if ledger.applied:
            self.ring.cleared(attempt.members)
            if ledger.loss is not None:
                self.series["loss"].append([ledger.step, ledger.loss])
                del self.series["loss"][:-MAX_SERIES]
            self._emit("step", **fields, steps=self.settings.steps)
        else:
            log.warning("step %d (attempt %s) aborted: %s", ledger.step, ledger.attempt, ledger.aborted)
            self._emit("aborted", **fields)

    # -- frames for the attempt -------------------------------------------------------------------

    def _current(self, opened: Opened) -> Attempt:
        attempt = self.attempt
        if attempt is None or attempt.id != opened.attempt:
            raise FrameRefused(f"stale: attempt {opened.attempt} is not this shard's current one", code="stale")
        return attempt

    async def on_coefficients(self, opened: Opened) -> dict[str, Any]:
        """A kv/dkv frame: taken by the current attempt, or held (bounded) until its plan is accepted
        (a member computes and sends as soon as it accepts, which may be before this shard has)."""
        attempt = self.attempt
        if attempt is not None and attempt.id == opened.attempt:
            self._take_coefficients(attempt, opened)
            return {}
        if opened.attempt in self._dead:
            raise FrameRefused(f"stale: attempt {opened.attempt} was aborted", code="stale")
        if opened.attempt not in self._early and len(self._early) >= MAX_EARLY_ATTEMPTS:
            self._early.popitem(last=False)
        held = self._early.setdefault(opened.attempt, [])
        if len(held) >= self.settings.max_shards * self.settings.model.n_layers:
            raise FrameRefused("busy: too many frames for an attempt this shard has not accepted", code="busy")
        held.append(opened)
        return {"held": True}

    def _take_coefficients(self, attempt: Attempt, opened: Opened) -> None:
        """Check a kv/dkv frame against the attempt, pass a kv on, queue the message for the member."""
        message = decode_message(opened.body.get("msg"), opened.payload, attempt.spec)
        if message.kind != opened.op:
            raise FrameRefused(f"header: a {opened.op} frame carries a {message.kind} message", code="header")
        if opened.sender != attempt.sender_of(message):
            raise FrameRefused(f"sender: {opened.sender[:12]} may not hand member {attempt.index} this {message.kind} "
                               f"message of chunk {message.owner}", code="sender")
        if message.kind == FORWARD and not message.owner < attempt.index:
            raise FrameRefused(f"order: member {attempt.index} needs no keys of chunk {message.owner}", code="order")
        onward = forward_to(attempt.index, attempt.plan.chunks) if message.kind == FORWARD else None
        try:
            attempt.inbox.put_nowait((opened.sender, message))
        except asyncio.QueueFull:
            raise FrameRefused("busy: more messages than a step has", code="busy") from None
        attempt.ledger.coefficients.arrive(opened.sender)
        attempt.ledger.bytes_received += opened.payload_bytes
        if onward is not None:
            self.links.post(attempt, attempt.members[onward], opened)

    async def on_share(self, opened: Opened) -> dict[str, Any]:
        attempt = self._current(opened)
        if not attempt.leads or opened.sender not in attempt.members[1:]:
            raise FrameRefused("sender: a gradient share goes from a member to the step's leader", code="sender")
        if opened.sender in attempt.shares:
            raise FrameRefused("order: this member's share has arrived already", code="order")
        tensors = _tensors(opened, dict(self.replica.parameter_specs()))
        loss = number_field(opened, "loss")
        if not math.isfinite(loss):
            raise FrameRefused("nonfinite: the share's loss is not finite", code="nonfinite")
        attempt.shares[opened.sender] = (tensors, loss)
        attempt.ledger.reduce.arrive(opened.sender)
        attempt.ledger.bytes_received += opened.payload_bytes
        if len(attempt.shares) == attempt.plan.chunks:
            attempt.shares_in.set()
        return {}

    async def on_update(self, opened: Opened) -> dict[str, Any]:
        attempt = self._current(opened)
        if attempt.leads or opened.sender != attempt.plan.leader:
            raise FrameRefused("sender: an update comes from the step's leader", code="sender")
        if attempt.update.done():
            raise FrameRefused("order: the update has arrived already", code="order")
        specs = self.replica.parameter_specs()
        expected = {GRAD + name: spec for name, spec in specs.items()}
        expected.update({BASIS + name: specs[name] for name in self.replica.basis_names()})
        tensors = _tensors(opened, expected)
        loss, norm = number_field(opened, "loss"), number_field(opened, "norm")
        grads = {name.removeprefix(GRAD): t for name, t in tensors.items() if name.startswith(GRAD)}
        bases = {name.removeprefix(BASIS): t for name, t in tensors.items() if name.startswith(BASIS)}
        attempt.ledger.reduce.arrive(opened.sender)
        attempt.ledger.bytes_received += opened.payload_bytes
        attempt.update.set_result((grads, bases, loss, norm))
        try:
            version = await attempt.wait(attempt.applied, what="update applied", blame=None)
        except StepAborted as exc:
            raise FrameRefused(f"stale: the step was aborted before the update was applied: {exc}", code="stale") from exc
        return {"version": version}

    async def on_abort(self, opened: Opened) -> dict[str, Any]:
        reason, suspect = parse_abort(opened)
        attempt = self.attempt
        if attempt is not None and attempt.id == opened.attempt and opened.sender in attempt.members:
            attempt.abort(f"aborted by {opened.sender[:12]}: {reason}", suspect=suspect, noticed=True)
        else:
            self._dead.append(opened.attempt)
            self._early.pop(opened.attempt, None)
        return {}


def _tensors(opened: Opened, expected: Specs) -> dict[str, torch.Tensor]:
    """The frame's tensors, exactly the ``expected`` names, shapes and dtypes, all finite."""
    try:
        tensors = decode_tensors(opened.body.get("tensors"), opened.payload, require_finite=True)
    except NonFiniteTensor as exc:
        raise FrameRefused(f"nonfinite: {exc}", code="nonfinite") from exc
    except DecodeError as exc:
        raise FrameRefused(f"header: {exc}", code="header") from exc
    if tensors.keys() != expected.keys():
        missing, extra = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected.keys())
        raise FrameRefused(f"shape: tensors missing {missing[:4]}, unexpected {extra[:4]}", code="shape")
    for name, tensor in tensors.items():
        shape, dtype = expected[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise FrameRefused(f"shape: {name} is {tuple(tensor.shape)} {tensor.dtype}, expected {shape} {dtype}",
                               code="shape")
    return tensors
