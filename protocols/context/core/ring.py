"""A whole ring in one process, for tests and experiments: ``split_chunks`` (a batch into the
members' chunks) and ``run_ring`` (every member to the end of its step, messages delivered in
the order sent; a ring that cannot progress raises ``InvalidRing``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import Tensor

from gossamer.protocols.context.core.errors import InvalidRing
from gossamer.protocols.context.core.member import Outgoing, RingMember
from gossamer.protocols.context.core.wire import FORWARD, KVMessage, forward_to


@dataclass(frozen=True)
class Sent:
    """One message as it left ``source`` for ``target``."""

    source: int
    target: int
    message: KVMessage


@dataclass
class RingTrace:
    """What one step of a whole ring did."""

    sent: list[Sent] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)


def split_chunks(tokens: Tensor, targets: Tensor, chunks: int) -> list[tuple[Tensor, Tensor]]:
    """Member p's (tokens, targets): positions [p T, (p + 1) T) of every sequence, T = length / chunks."""
    if tokens.dim() != 2 or tokens.shape != targets.shape:
        raise InvalidRing(f"tokens: need [batch, length] tokens and targets, got {tuple(tokens.shape)}")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or tokens.shape[1] % chunks:
        raise InvalidRing(f"chunks: {chunks!r} must be a positive integer dividing the length {tokens.shape[1]}")
    return list(zip(tokens.chunk(chunks, dim=1), targets.chunk(chunks, dim=1), strict=True))


def run_ring(members: Sequence[RingMember], *, clock: Callable[[], float] | None = None) -> RingTrace:
    """Drive ``members`` (indices 0..P-1, in order) to the end of their step: one ``step`` of each
    member per round, each message delivered in the order sent and kv messages passed on as
    ``forward_to`` says; the trace has every message and, given a ``clock``, compute seconds."""
    if [m.index for m in members] != list(range(len(members))):
        raise InvalidRing("members: need members 0..P-1 in order")
    trace = RingTrace(compute_s=[0.0] * len(members))
    in_flight: deque[tuple[int, Outgoing]] = deque()
    while not all(member.done for member in members):
        progressed = False
        for member in members:
            start = clock() if clock else 0.0
            out = member.step()
            if clock:
                trace.compute_s[member.index] += clock() - start
            if out is not None:
                progressed = True
                in_flight.extend((member.index, send) for send in out)
        while in_flight:
            source, send = in_flight.popleft()
            trace.sent.append(Sent(source, send.to, send.message))
            members[send.to].deliver(send.message)
            onward = forward_to(send.to, len(members)) if send.message.kind == FORWARD else None
            if onward is not None:
                in_flight.append((send.to, Outgoing(onward, send.message)))
            progressed = True
        if not progressed:
            waiting = {m.index: m.waiting_for for m in members if not m.done}
            raise InvalidRing(f"ring: no member can progress; waiting for {waiting}")
    return trace
