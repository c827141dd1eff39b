"""A learner's pacing: the W2 deadline, the fail-slow learners, and what each wait of a round
blocks on and for how long (``hyper.pacing``: "fixed" or "adaptive"). Pure bookkeeping over the
moments the caller gives (``now``); nothing here reads a clock. The rules are in README.md,
"Pacing and faults"."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gossamer.protocols.core.pacing import AdaptiveDeadline, Pacing, SlowPeers

KEEP_ROUNDS = 8
"""Rounds whose start and W2 wait times are kept, for arrivals that come late."""
MIN_GAP_S = 0.5
"""How much later than the others' a learner's median must also be to count as slow."""


def catch_up_limit_s(catch_up_rounds: int, w2_deadline_s: float) -> float:
    """How long a learner out of step waits for the others (to come within reach, to show up, or
    to offer the state its join can download): ``catch_up_rounds`` W2 deadlines."""
    return catch_up_rounds * w2_deadline_s


@dataclass(frozen=True)
class Wait:
    """One blocking wait of a round: for the contributions of ``expected``, blocking on
    ``wait_for`` (the others' are used if they come in time) for at most ``timeout_s``; with
    ``follow_view`` a sender whose record left the live view is no longer waited for either."""

    expected: tuple[str, ...]
    wait_for: tuple[str, ...]
    timeout_s: float
    follow_view: bool

    @property
    def not_waited_for(self) -> list[str]:
        return sorted(set(self.expected) - set(self.wait_for))


class LearnerPacing:
    """The W2 deadline (``w2_deadline_s`` its ceiling, ``floor_s`` its floor when adaptive) and the
    fail-slow learners, from the measured arrivals of pseudo-gradients."""

    def __init__(self, w2_deadline_s: float, *, adaptive: bool, floor_s: float = 0.5, ahead: int = 2) -> None:
        self.ceiling_s = w2_deadline_s
        self.ahead = ahead  # rounds ahead of ours whose arrivals are kept until we get there (the inbox's window)
        self.adaptive = adaptive
        self.deadline = AdaptiveDeadline(w2_deadline_s, Pacing(floor_s=min(floor_s, w2_deadline_s)))
        self.slow = SlowPeers(min_gap_s=MIN_GAP_S)
        self._started: dict[int, float] = {}
        self._waiting: dict[int, float] = {}  # round -> when our W2 wait began
        self._settled: set[int] = set()  # rounds whose W2 wait is over
        self._arrivals: dict[tuple[int, str], float] = {}  # (round, sender) -> when, until measured
        self._measured: set[tuple[int, str]] = set()
        self._senders: set[str] = set()

    # -- the round's moments ------------------------------------------------------------------

    def begin(self, round: int, now: float) -> None:
        self._started[round] = now
        for old in [r for r in self._started if r <= round - KEEP_ROUNDS]:
            self._started.pop(old, None)
            self._waiting.pop(old, None)
            self._settled.discard(old)
        for key in [key for key in (*self._arrivals, *self._measured) if key[0] <= round - KEEP_ROUNDS]:
            self._arrivals.pop(key, None)
            self._measured.discard(key)

    def w1_wait(self, expected: Iterable[str], *, grace_s: float) -> Wait:
        """The wait for the W1 neighbours' parameters after the inner phase: ``grace_s`` at most."""
        return self._wait(expected, timeout_s=grace_s)

    def w2_wait(self, round: int, now: float, expected: Iterable[str]) -> Wait:
        """Our W2 wait for ``round`` begins at ``now``, for the pseudo-gradients of ``expected``."""
        self._waiting[round] = now
        return self._wait(expected, timeout_s=self.w2_deadline_s())

    def _wait(self, expected: Iterable[str], *, timeout_s: float) -> Wait:
        expected = tuple(expected)
        return Wait(expected, tuple(self.waited_for(expected)), timeout_s, follow_view=self.adaptive)

    def waited_for(self, senders: Iterable[str]) -> list[str]:
        """Of ``senders``, those a wait blocks on: all with fixed pacing, the unflagged with adaptive."""
        flagged = self.slow.flagged() if self.adaptive else frozenset()
        return [s for s in senders if s not in flagged]

    def settle(self, round: int, expected: Iterable[str]) -> frozenset[str]:
        """The W2 wait for ``round`` is over: measure what arrived from ``expected``, check who is
        slow; the flagged learners."""
        self._settled.add(round)
        for sender in expected:
            if (round, sender) in self._arrivals:
                self._measure(round, sender)
        return self.slow.check()

    def arrived(self, round: int, sender: str, now: float) -> None:
        """A pseudo-gradient for ``round`` from ``sender`` arrived at ``now``."""
        key = (round, sender)
        current = max(self._started, default=0)
        if key in self._measured or key in self._arrivals or not current - KEEP_ROUNDS < round <= current + self.ahead:
            return  # measured already, or too old or too far ahead to count (bounded memory)
        self._arrivals[key] = now
        if round in self._settled:  # late: our wait for it is over
            self._measure(round, sender)

    def _measure(self, round: int, sender: str) -> None:
        at = self._arrivals.pop((round, sender))
        self._measured.add((round, sender))
        started, waiting = self._started.get(round), self._waiting.get(round)
        if started is None or waiting is None:
            return
        self._senders.add(sender)
        self.slow.observe(sender, max(0.0, at - started))
        if sender not in self.slow.flagged():
            self.deadline.observe(max(0.0, at - waiting))

    def keep_only(self, learners: Iterable[str]) -> None:
        """The learners that left (not in ``learners``) are no longer measured against the others."""
        for gone in self._senders - set(learners):
            self.slow.forget(gone)
            self._senders.discard(gone)

    # -- answers --------------------------------------------------------------------------------

    def w2_deadline_s(self) -> float:
        return self.deadline.deadline_s() if self.adaptive else self.ceiling_s

    def status(self) -> dict[str, Any]:
        """For ``/status``: the next W2 deadline and each learner's time over the others'."""
        return {"adaptive": self.adaptive, "next_w2_deadline_s": round(self.w2_deadline_s(), 3),
                "w2_deadline_ceiling_s": self.ceiling_s, "slow_learners": sorted(self.slow.flagged()),
                "learner_time_ratio": {peer: round(r, 3) for peer, r in sorted(self.slow.ratios().items())}}
