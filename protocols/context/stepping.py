"""A cp-shard running one attempt of a step: the ring's compute, the reduction, the update, or the
abort (see ``shard`` for the step, ``attempt`` for how an attempt ends).

Compute runs one ``RingMember.step`` at a time in a worker thread, so the event loop keeps
receiving, checking and passing on frames meanwhile; messages are handed to the member only
between two steps. Gradients leave the device for the CPU before they are summed, so the sum is
bitwise the same on every shard and device. The leader's model changes only once every share
has arrived; a member's only once the leader's update has.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gossamer.protocols.context.attempt import Attempt, StepAborted
from gossamer.protocols.context.core import MessageRefused, RingMember, encode_message, reduce_gradients
from gossamer.protocols.context.replica import Replica, RingData
from gossamer.protocols.context.traffic import BASIS, GRAD, send_failed
from gossamer.protocols.context.wire import ABORT, SHARE, UPDATE, Outbound, outbound
from gossamer.transport.codec import encode_tensors
from gossamer.transport.errors import RemoteError, TransportError

if TYPE_CHECKING:
    from gossamer.peer.kit.ledger import History
    from gossamer.peer.role import RoleContext
    from gossamer.protocols.context.ledger import StepLedger
    from gossamer.protocols.context.settings import ContextSettings
    from gossamer.transport.frames import Frame

log = logging.getLogger(__name__)
ABORT_NOTICE_TIMEOUT_S = 2.0
MAX_SERIES = 2000  # loss points kept for /status (the swarm page's curves)


class StepRunner:
    """The compute side of ``CpShardRole`` (a mixin: the role holds the state named below)."""

    if TYPE_CHECKING:
        ctx: RoleContext
        settings: ContextSettings
        peer_id: str
        replica: Replica
        data: RingData
        attempt: Attempt | None
        history: History[tuple[int, str], StepLedger]
        series: dict[str, list[list[float]]]
        _synced: set[str]
        _dead: Any

        def emit(self, event: str, **fields: Any) -> None: ...
        def suspect(self, peer_id: str) -> None: ...
        def cleared(self, members: tuple[str, ...]) -> None: ...
        def post(self, attempt: Attempt, target: str, signed: Outbound) -> None: ...
        async def ask(self, peer_id: str, signed: Outbound, *, timeout_s: float) -> Frame: ...
        async def stepped(self) -> None: ...

    async def run_attempt(self, attempt: Attempt) -> None:
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
            await self.abandon(attempt)
        finally:
            if self.attempt is attempt:
                self.attempt = None
        self.finish_ledger(attempt)
        await self.stepped()

    # -- the ring ---------------------------------------------------------------------------------

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
                self.post(attempt, attempt.members[send.to], signed)

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
        attempt.shares[self.peer_id] = (self._own_share(attempt), attempt.ledger.chunk_loss or 0.0)
        if len(attempt.shares) == attempt.plan.chunks:
            attempt.shares_in.set()
        missing = [m for m in attempt.members if m not in attempt.shares]
        await attempt.wait(attempt.shares_in.wait(), what="gradient share", blame=missing[0] if missing else None)
        total = reduce_gradients([attempt.shares[m][0] for m in attempt.members])
        loss = sum(attempt.shares[m][1] for m in attempt.members)
        attempt.check()
        norm = await asyncio.to_thread(self.replica.apply, total)
        self._applied(attempt, loss, norm)
        self._synced = set(attempt.members)
        tensors = {GRAD + name: grad for name, grad in total.items()}
        tensors.update({BASIS + name: basis for name, basis in self.replica.bases().items()})
        entries, buffers = encode_tensors(tensors)
        signed = outbound(UPDATE, attempt.plan.step, {"attempt": attempt.id, "loss": loss, "norm": norm,
                                                      "tensors": entries}, buffers)
        members = attempt.members[1:]
        results = await asyncio.gather(*(self.ask(m, signed, timeout_s=self.settings.plan_timeout_s) for m in members),
                                       return_exceptions=True)
        for member, result in zip(members, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, TransportError | LookupError):
                    raise result
                attempt.ledger.reduce.send_failures[member] = f"update: {type(result).__name__}: {str(result)[:160]}"
                self._synced.discard(member)
                if not isinstance(result, RemoteError):
                    self.suspect(member)
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
            await attempt.wait(self.ask(leader, signed, timeout_s=attempt.remaining_s()),
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

    async def abandon(self, attempt: Attempt) -> None:
        """Stop everything of an aborted attempt and tell the other members (unless one told us and
        this shard does not lead: the leader passes on every notice it gets, since a member may not
        yet verify the frames of another member whose record it has not seen, but it took the
        leader's plan)."""
        await attempt.cancel_sends()
        for peer in attempt.ledger.suspects:
            self.suspect(peer)
        self._dead.append(attempt.id)
        if attempt.noticed and not attempt.leads:
            return
        reason = attempt.ended.result() if attempt.ended.done() else "abandoned"
        suspect = attempt.ledger.suspects[0] if attempt.ledger.suspects else None
        signed = outbound(ABORT, attempt.plan.step, {"attempt": attempt.id, "reason": reason[:400], "suspect": suspect})
        others = [m for m in attempt.members if m != self.peer_id]  # a suspect may be alive: it would wait
        await asyncio.gather(*(self.ask(m, signed, timeout_s=ABORT_NOTICE_TIMEOUT_S) for m in others),
                             return_exceptions=True)

    def finish_ledger(self, attempt: Attempt) -> None:
        ledger = attempt.ledger
        if not ledger.applied:
            ledger.aborted = attempt.ended.result() if attempt.ended.done() else "abandoned"
        ledger.wall_s = asyncio.get_running_loop().time() - attempt.started
        ledger.settle()
        self.history.add((ledger.step, ledger.attempt), ledger)
        fields = ledger.to_json()
        if ledger.applied:
            self.cleared(attempt.members)
            if ledger.loss is not None:
                self.series["loss"].append([ledger.step, ledger.loss])
                del self.series["loss"][:-MAX_SERIES]
            self.emit("step", **fields, steps=self.settings.steps)
        else:
            log.warning("step %d (attempt %s) aborted: %s", ledger.step, ledger.attempt, ledger.aborted)
            self.emit("aborted", **fields)
