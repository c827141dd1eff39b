"""How long the TL++ orchestrator waits for the data nodes in a step, and which nodes are
fail-slow (``hyper.pacing``: "fixed", the default, or "adaptive").

Measured, for every request to a node that answers (``forward`` and ``backward`` apart: a
forward carries the weights and the activations, a backward the cut gradient and the node's
gradients), its time from the phase's start, when the requests to every node of the step go out
together. Each node's last ``WINDOW`` times of a phase make the phase's deadline: a high quantile
of the times of the nodes not flagged times a margin (``protocols.core.pacing.AdaptiveDeadline``),
``node_timeout_s`` its ceiling, ``node_floor_s`` its floor. A node's step time (its forward and
backward times added; a request cut at the deadline counts the time it had run, a lower bound)
goes to ``SlowPeers``: a node whose median is over 1.3x the other nodes' medians, and ``MIN_GAP_S``
seconds over them, in 3 steps in a row is flagged, and unflagged at the first step it is back
under. A flagged node's times no longer make the deadline: the others' pace does.

With fixed pacing every request waits up to ``node_timeout_s`` (as without pacing); nodes are
measured and flagged alike, and nothing else changes. With adaptive pacing (``paced``), once a
phase has run for its deadline and some node of it has answered, the nodes still outstanding are
cut: their requests are cancelled and they are dropped from the step as a node that timed out is
(``steps``: the step's gradient is then exactly that of the nodes that completed, and a dropped
node leaves the schedule until its record is renewed). When no node has answered by the deadline
(every node slowed: a busy host, a slower link for all), nobody is cut and every request waits
up to the ceiling; their times are measured, so the deadline grows back at once. The floor keeps
a node that is merely slow because its host is busy from being cut, and a node 30% slower than
the others is flagged but, inside the margin (1.5x the quantile), still waited for: a cut node's
samples are not trained on in that step, which on private data means its owner's data is seen
less, so only a markedly slow node is cut.

The helper's deadline (``helper_timeout_s``) stays fixed: there is exactly one helper per run, so
there is no group of peers doing the same work to measure it against, and a helper that misses it
stops secure training (``steps.HelperFailed``) rather than being left out.

Every request to a node or the helper is timed by ``request`` (``within``): a deadline this
process slept through (stopped with SIGSTOP, a suspended VM: its timer fires more than
``STALL_S`` late) is given once more, since the answer may sit unread in a socket and the time the
orchestrator itself did not run is not the peer's. A plain timer would fire before the answer is
read, and a hung orchestrator, once continued, would drop its nodes or stop on ``HelperFailed``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from gossamer.peer.kit.secure_link import LinkMessage, SecureLinkError, SecureLinks
from gossamer.protocols.core.pacing import AdaptiveDeadline, Pacing, SlowPeers
from gossamer.protocols.tlpp.wire import BACKWARD, FORWARD

T = TypeVar("T")
PHASES = (FORWARD, BACKWARD)
WINDOW = 8
"""Each node's last times of a phase that make the phase's deadline."""
MIN_GAP_S = 0.5
"""How much longer than the others' a node's median step time must also be to count as slow."""
STALL_S = 1.0
"""A deadline's timer firing this much late means this process did not run (``within``)."""
BACKSTOP_S = 3600.0
"""The transport's own deadline under ``request``: only a stop this long mid-request outlasts ``within``."""


class NodePacing:
    """The deadlines of a step's requests to the nodes and the fail-slow nodes, from measured
    times (see the module docstring). Pure bookkeeping: every duration is given by the caller."""

    def __init__(self, *, ceiling_s: float, floor_s: float, adaptive: bool, pacing: Pacing = Pacing()) -> None:
        self.ceiling_s = ceiling_s
        self.adaptive = adaptive
        self.pacing = replace(pacing, floor_s=floor_s)
        self.slow = SlowPeers(min_gap_s=MIN_GAP_S)
        self._times: dict[str, dict[str, deque[float]]] = {phase: {} for phase in PHASES}
        self._step: dict[str, float] = {}  # this step's time of each node measured so far
        self._nodes: set[str] = set()  # every node measured (and not forgotten)

    def deadline_s(self, phase: str) -> float:
        """How long a request of ``phase`` waits at most: the ceiling with fixed pacing, else the
        adaptive deadline over the unflagged nodes' last times (the ceiling until enough are in)."""
        if not self.adaptive:
            return self.ceiling_s
        flagged = self.slow.flagged()
        seen = [s for node, times in self._times[phase].items() if node not in flagged for s in times]
        deadline = AdaptiveDeadline(self.ceiling_s, replace(self.pacing, window=max(len(seen), self.pacing.min_samples)))
        for seconds in seen:
            deadline.observe(seconds)
        return deadline.deadline_s()

    def deadlines(self) -> dict[str, float]:
        return {phase: round(self.deadline_s(phase), 3) for phase in PHASES}

    def cutoff_s(self, phase: str) -> float | None:
        """When a phase's outstanding nodes may be cut (``paced``): its adaptive deadline when that
        is below the ceiling; None (no cut: each request's own timeout, the ceiling) otherwise."""
        deadline = self.deadline_s(phase)
        return deadline if self.adaptive and deadline < self.ceiling_s else None

    def observe(self, phase: str, node: str, seconds: float) -> None:
        """``node`` answered its request of ``phase`` after ``seconds``."""
        self._times[phase].setdefault(node, deque(maxlen=WINDOW)).append(seconds)
        self._count(node, seconds)

    def cut(self, node: str, seconds: float) -> None:
        """``node``'s request was cut at the deadline after ``seconds``: a lower bound of its time,
        for fail-slow detection only (it never lowers a deadline)."""
        self._count(node, seconds)

    def _count(self, node: str, seconds: float) -> None:
        self._nodes.add(node)
        self._step[node] = self._step.get(node, 0.0) + seconds

    def record(self, phase: str, outcome: Paced[Any]) -> None:
        """Measure a phase's outcome: the nodes that answered, and those cut."""
        for node, result in outcome.results.items():
            if node in outcome.cut_s:
                self.cut(node, outcome.cut_s[node])
            elif not isinstance(result, BaseException):
                self.observe(phase, node, outcome.took_s[node])

    def settle(self) -> list[str]:
        """The step is over: each measured node's step time to fail-slow detection; the flagged nodes."""
        for node, seconds in sorted(self._step.items()):
            self.slow.observe(node, seconds)
        self._step = {}
        return sorted(self.slow.check())

    def flagged(self) -> frozenset[str]:
        return self.slow.flagged()

    def keep_only(self, nodes: Iterable[str]) -> None:
        """The nodes that left (not in ``nodes``) are no longer measured against the others."""
        gone = self._nodes - set(nodes)
        for node in gone:
            self.slow.forget(node)
            self._step.pop(node, None)
            for times in self._times.values():
                times.pop(node, None)
        self._nodes -= gone

    def status(self) -> dict[str, Any]:
        """For ``/status``: the next deadlines and each node's step time over the others'."""
        return {"adaptive": self.adaptive, "next_deadline_s": self.deadlines(), "node_timeout_s": self.ceiling_s,
                "node_floor_s": self.pacing.floor_s, "slow_nodes": sorted(self.slow.flagged()),
                "node_time_ratio": {node: round(r, 3) for node, r in sorted(self.slow.ratios().items())}}


@dataclass
class Paced(Generic[T]):
    """A phase's outcome: each node's answer or exception (for one cut, a ``SecureLinkError`` that
    says it was late: its request was cancelled, its link closed), the time each call that ended
    by itself took, and how long each cut one had run."""

    results: dict[str, T | BaseException] = field(default_factory=dict)
    took_s: dict[str, float] = field(default_factory=dict)
    cut_s: dict[str, float] = field(default_factory=dict)


async def paced(calls: Mapping[str, Awaitable[T]], cutoff_s: float | None) -> Paced[T]:
    """Run one phase's calls together. With ``cutoff_s``, once it has passed and at least one call
    has answered (not failed), the calls still running are cancelled and answered as late;
    when none has answered by then, every call runs to its own end (its own timeout)."""
    started = time.monotonic()
    out: Paced[T] = Paced()

    async def timed(node: str, call: Awaitable[T]) -> T:
        try:
            return await call
        finally:
            out.took_s[node] = time.monotonic() - started

    tasks = {node: asyncio.ensure_future(timed(node, call)) for node, call in calls.items()}
    try:
        if tasks and cutoff_s is not None:
            done, pending = await asyncio.wait(tasks.values(), timeout=cutoff_s)
            if pending and any(task.exception() is None for task in done):
                for node, task in tasks.items():
                    if not task.done():
                        task.cancel()
                        out.cut_s[node] = time.monotonic() - started
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    finally:
        running = [task for task in tasks.values() if not task.done()]
        for task in running:  # we were cancelled ourselves: so are the calls
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    for node, task in tasks.items():
        if node in out.cut_s:
            out.took_s.pop(node, None)
            out.results[node] = SecureLinkError(
                f"late: no answer within the adaptive deadline of {cutoff_s:.2f} s (others answered; "
                "hyper.pacing = \"adaptive\")")
        elif task.exception() is not None:
            out.results[node] = task.exception()  # type: ignore[assignment]
        else:
            out.results[node] = task.result()
    return out


async def run_phase(pacing: NodePacing, phase: str, calls: Mapping[str, Awaitable[T]]) -> dict[str, T | BaseException]:
    """One phase's requests to the nodes, paced and measured: each node's answer or exception."""
    outcome = await paced(calls, pacing.cutoff_s(phase))
    pacing.record(phase, outcome)
    return outcome.results


async def within(call: Awaitable[T], timeout_s: float) -> T:
    """``call``'s result, or TimeoutError once it ran ``timeout_s``; a deadline this process slept
    through (its timer ran over ``STALL_S`` late) is given once more (see the module docstring)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call)
    try:
        for _ in range(2):
            due = loop.time() + timeout_s
            done, _pending = await asyncio.wait({task}, timeout=timeout_s)
            if done:
                return task.result()
            if loop.time() - due <= STALL_S:
                break
        raise TimeoutError(f"no response within {timeout_s} s")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def request(links: SecureLinks, peer: str, method: str, message: LinkMessage, *, timeout_s: float) -> LinkMessage:
    """``links.request`` timed by ``within``; SecureLinkError when it runs out (its link closed)."""
    try:
        return await within(links.request(peer, method, message, timeout_s=BACKSTOP_S), timeout_s)
    except TimeoutError as exc:
        raise SecureLinkError(f"link to peer {peer[:12]} failed during {message.op!r} (step {message.step}): "
                              f"{exc}") from None
