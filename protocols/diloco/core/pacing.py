"""A learner's pacing: how long its W2 window waits for pseudo-gradients, and which learners are
fail-slow (``hyper.pacing``: "fixed", the default, or "adaptive").

Measured, for every pseudo-gradient a learner sends us for round t (once per sender and round,
whether the inbox took it or refused it as stale or too far ahead), the moment it arrived against
two moments of our own round t:

- the start of the round: the sender's time, from a start the learners share (they leave the
  previous round's W2 together) to its pseudo-gradient. Fed to ``SlowPeers`` (over 1.3x the
  others' median, and ``MIN_GAP_S`` seconds over it, in 3 checks in a row: flagged). A
  message that came before our round started (its sender was ahead) counts as 0 s.
- the start of our W2 wait: how long we had to wait for it. Fed to ``AdaptiveDeadline`` (the
  next W2 deadline: a high quantile times a margin, ``w2_deadline_s`` its ceiling, ``w2_floor_s`` its
  floor), except from flagged learners.

Arrivals after our wait for round t ended (refused as stale) are measured too, when they come: a
deadline that was too short grows again, and a learner that is always late stays flagged. With
adaptive pacing a flagged learner is not waited for, in W1 or W2 (what it sent in time is still
used); with fixed pacing learners are measured and flagged alike, but every wait is the configured
one for everyone. Pure bookkeeping: every moment is given by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gossamer.protocols.core.pacing import AdaptiveDeadline, Pacing, SlowPeers

KEEP_ROUNDS = 8
"""Rounds whose start and W2 wait times are kept, for arrivals that come late."""
MIN_GAP_S = 0.5
"""How much later than the others' a learner's median must also be to count as slow."""


class LearnerPacing:
    """The W2 deadline and the fail-slow learners, from measured arrivals (see the module docstring)."""

    def __init__(self, w2_deadline_s: float, *, adaptive: bool, pacing: Pacing = Pacing(), ahead: int = 2) -> None:
        self.ceiling_s = w2_deadline_s
        self.ahead = ahead  # rounds ahead of ours whose arrivals are kept until we get there (the inbox's window)
        self.adaptive = adaptive
        self.deadline = AdaptiveDeadline(w2_deadline_s, pacing)
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

    def w2_wait(self, round: int, now: float) -> float:
        """Our W2 wait for ``round`` begins: how long it may last."""
        self._waiting[round] = now
        return self.w2_deadline_s()

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
