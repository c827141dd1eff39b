"""A cp-shard's frames: checking what arrives (in ``wire``'s order: bound, envelope, sender, place,
payload) and sending on pooled connections.

Arrivals: a refused frame is answered with an ERROR frame naming the check (``refused (shape):
...``), counted by code in the role's status, and changes nothing: the shard goes on serving.
Coefficient frames for an attempt this shard has not accepted yet (a member computes and sends
as soon as it accepts the plan, which may be before another member has) are held, at most
``MAX_EARLY_ATTEMPTS`` attempts of at most one step's worth of messages, and taken when the plan
is accepted. Sends: every frame goes through ``ask`` on the role's ``HopPool`` (one reused
connection per peer, requests matched by id) with what is left of the step's deadline.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import torch

from gossamer.crypto.envelope import ReplayGuard
from gossamer.peer.route.pool import HopPool
from gossamer.protocols.context import names
from gossamer.protocols.context.attempt import Attempt, StepAborted
from gossamer.protocols.context.core import BACKWARD, FORWARD, MessageRefused, decode_message, forward_to
from gossamer.protocols.context.replica import Replica
from gossamer.protocols.context.wire import (
    ABORT,
    DKV,
    KV,
    PLAN,
    SHARE,
    UPDATE,
    FrameRefused,
    Opened,
    Outbound,
    clear_header,
    frame_for,
    number_field,
    open_frame,
    parse_abort,
)
from gossamer.transport.codec import decode_tensors
from gossamer.transport.errors import DecodeError, NonFiniteTensor, RemoteError, TransportError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import ConnectionInfo, HandlerError

if TYPE_CHECKING:
    from gossamer.peer.role import RoleContext
    from gossamer.protocols.context.settings import ContextSettings

MAX_EARLY_ATTEMPTS = 2
GRAD, BASIS = "grad.", "basis."
Specs = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


class RingTraffic:
    """The frame side of ``CpShardRole`` (a mixin: the role holds the state named below)."""

    if TYPE_CHECKING:
        ctx: RoleContext
        settings: ContextSettings
        peer_id: str
        replica: Replica
        pool: HopPool
        guard: ReplayGuard
        refused: Counter[str]
        attempt: Attempt | None
        _early: OrderedDict[str, list[Opened]]
        _dead: deque[str]

        def live_with(self, peer_id: str, role: str) -> Any: ...
        def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]: ...
        def suspect(self, peer_id: str) -> None: ...
        async def on_plan(self, opened: Opened) -> dict[str, Any]: ...

    # -- arrivals -------------------------------------------------------------------------------

    async def handle(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """The TCP method: verify, check, dispatch (see the module docstring)."""
        try:
            op, _step = clear_header(frame)
            opened = open_frame(frame, guard=self.guard, me=self.peer_id, run_id=self.ctx.manifest.run_id,
                                now=self.ctx.now(), max_payload=self._max_payload(op), sender_ok=self._live_shard)
            answer = await self._handler(op)(opened)
        except (FrameRefused, MessageRefused) as exc:
            self.refused[exc.code] += 1
            raise HandlerError(f"refused ({exc.code}): {exc}") from exc
        self.ctx.traffic.add_received(f"context_{op}", opened.payload_bytes)
        return Frame(FrameType.RESPONSE, answer)

    def _live_shard(self, peer_id: str, public_key: bytes) -> bool:
        live = self.live_with(peer_id, names.SHARD)
        return live is not None and live.record.public_key == public_key

    def _max_payload(self, op: str) -> int:
        replica = self.replica
        return {PLAN: 0, ABORT: 0, KV: replica.coefficient_bytes[FORWARD], DKV: replica.coefficient_bytes[BACKWARD],
                SHARE: replica.gradient_bytes, UPDATE: replica.gradient_bytes + replica.basis_bytes}[op]

    def _handler(self, op: str) -> Callable[[Opened], Coroutine[Any, Any, dict[str, Any]]]:
        return {PLAN: self.on_plan, KV: self._on_coefficients, DKV: self._on_coefficients, SHARE: self._on_share,
                UPDATE: self._on_update, ABORT: self._on_abort}[op]

    def _current(self, opened: Opened) -> Attempt:
        attempt = self.attempt
        if attempt is None or attempt.id != opened.attempt:
            raise FrameRefused(f"stale: attempt {opened.attempt} is not this shard's current one", code="stale")
        return attempt

    async def _on_coefficients(self, opened: Opened) -> dict[str, Any]:
        attempt = self.attempt
        if attempt is not None and attempt.id == opened.attempt:
            self.take_coefficients(attempt, opened)
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

    def take_coefficients(self, attempt: Attempt, opened: Opened) -> None:
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
            self.post(attempt, attempt.members[onward], opened)

    async def _on_share(self, opened: Opened) -> dict[str, Any]:
        attempt = self._current(opened)
        if not attempt.leads or opened.sender not in attempt.members[1:]:
            raise FrameRefused("sender: a gradient share goes from a member to the step's leader", code="sender")
        if opened.sender in attempt.shares:
            raise FrameRefused("order: this member's share has arrived already", code="order")
        tensors = self._tensors(opened, dict(self.replica.parameter_specs()))
        loss = number_field(opened, "loss")
        if not math.isfinite(loss):
            raise FrameRefused("nonfinite: the share's loss is not finite", code="nonfinite")
        attempt.shares[opened.sender] = (tensors, loss)
        attempt.ledger.reduce.arrive(opened.sender)
        attempt.ledger.bytes_received += opened.payload_bytes
        if len(attempt.shares) == attempt.plan.chunks:
            attempt.shares_in.set()
        return {}

    async def _on_update(self, opened: Opened) -> dict[str, Any]:
        attempt = self._current(opened)
        if attempt.leads or opened.sender != attempt.plan.leader:
            raise FrameRefused("sender: an update comes from the step's leader", code="sender")
        if attempt.update.done():
            raise FrameRefused("order: the update has arrived already", code="order")
        specs = self.replica.parameter_specs()
        expected = {GRAD + name: spec for name, spec in specs.items()}
        expected.update({BASIS + name: specs[name] for name in self.replica.basis_names()})
        tensors = self._tensors(opened, expected)
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

    async def _on_abort(self, opened: Opened) -> dict[str, Any]:
        reason, suspect = parse_abort(opened)
        attempt = self.attempt
        if attempt is not None and attempt.id == opened.attempt and opened.sender in attempt.members:
            attempt.abort(f"aborted by {opened.sender[:12]}: {reason}", suspect=suspect, noticed=True)
        else:
            self._dead.append(opened.attempt)
            self._early.pop(opened.attempt, None)
        return {}

    @staticmethod
    def _tensors(opened: Opened, expected: Specs) -> dict[str, torch.Tensor]:
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

    # -- sends ----------------------------------------------------------------------------------

    async def ask(self, peer_id: str, signed: Outbound, *, timeout_s: float) -> Frame:
        """``signed`` to ``peer_id`` (a live cp-shard) and its answer; LookupError when it is not
        live, transport errors (RemoteError for a refusal) as they come."""
        live = self.live_with(peer_id, names.SHARD)
        if live is None or not live.record.tcp_addr:
            raise LookupError(f"{peer_id[:12]} is not a live cp-shard")
        frame = frame_for(signed, self.ctx.identity, recipient=peer_id, run_id=self.ctx.manifest.run_id,
                          now=self.ctx.now())
        return await self.pool.ask(live.record.tcp_addr, frame, timeout_s=max(timeout_s, 1e-3))

    def post(self, attempt: Attempt, target: str, signed: Outbound) -> None:
        """Send ``signed`` to ``target`` in the background; a failure aborts the attempt (a target
        that cannot be reached is suspected, one that refuses is not)."""
        async def send() -> None:
            size = sum(memoryview(part).nbytes for part in signed.payload) if isinstance(signed.payload, list | tuple) \
                else memoryview(signed.payload).nbytes
            try:
                await self.ask(target, signed, timeout_s=attempt.remaining_s())
            except (TransportError, LookupError) as exc:
                send_failed(attempt, target, signed.op, exc)
                return
            attempt.ledger.bytes_sent += size
            self.ctx.traffic.add_sent(f"context_{signed.op}", size)

        attempt.track(self.spawn(send(), name=f"send {signed.op} to {target[:12]}"))


def send_failed(attempt: Attempt, target: str, op: str, exc: TransportError | LookupError) -> None:
    """Abort ``attempt`` because a send of ``op`` to ``target`` failed: a refusal names no suspect,
    an unreachable target is suspected."""
    if isinstance(exc, RemoteError):
        attempt.abort(f"{target[:12]} refused our {op}: {str(exc)[:200]}")
        return
    attempt.ledger.coefficients.send_failures[target] = f"{op}: {type(exc).__name__}: {str(exc)[:160]}"
    attempt.abort(f"could not send {op} to {target[:12]}: {type(exc).__name__}", suspect=target)
