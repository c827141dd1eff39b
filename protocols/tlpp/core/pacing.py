"""How long the TL++ orchestrator waits for the data nodes in a phase, and which nodes are
fail-slow: ``NodePacing``, bookkeeping over durations the caller measured (nothing here reads a
clock). The rules are in ``protocols/tlpp/README.md``, "Pacing"."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gossamer.protocols.core.pacing import AdaptiveDeadline, Pacing, SlowPeers

PHASES = ("forward", "backward")  # the wire ops whose requests to the nodes are paced
WINDOW = 8
"""Each node's last times of a phase that make the phase's deadline."""
MIN_GAP_S = 0.5
"""How much longer than the others' a node's median step time must also be to count as slow."""


class NodePacing:
    """The deadlines of a step's requests to the nodes and the fail-slow nodes, from measured
    times. Pure bookkeeping: every duration is given by the caller."""

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
        """When a phase's outstanding nodes may be cut: its adaptive deadline when that is below
        the ceiling; None (no cut: each request's own timeout, the ceiling) otherwise."""
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

    def record(self, phase: str, *, answered: Mapping[str, float], cut: Mapping[str, float]) -> None:
        """Measure a phase: the nodes that answered (``node -> seconds``) and those cut."""
        for node, seconds in cut.items():
            self.cut(node, seconds)
        for node, seconds in answered.items():
            if node not in cut:
                self.observe(phase, node, seconds)

    def _count(self, node: str, seconds: float) -> None:
        self._nodes.add(node)
        self._step[node] = self._step.get(node, 0.0) + seconds

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
