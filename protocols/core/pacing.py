"""Deadlines that follow the live peers' measured times, and fail-slow detection. Pure: every
duration is given by the caller, nothing here reads a clock.

A fixed deadline (DiLoCo's ``w2_deadline_s``, a BlockTrain version's ``deadline_s``, a TL++ request
timeout) is either too short for a slow link or wastes time on a fast one. ``AdaptiveDeadline``
keeps the last ``window`` durations of one kind of wait (from the moment it starts to each awaited
arrival) and answers a high quantile of them times a margin, bounded below by ``floor_s`` and above
by the configured deadline, which stays the ceiling; with fewer than ``min_samples`` durations it
answers the ceiling.

``SlowPeers`` is fail-slow detection: each peer's last ``window`` durations of the same work; a
peer whose median is more than ``ratio`` times the median of the other peers' medians, in
``persist`` checks in a row, is flagged, and unflagged at the first check where it is back under.
With the default ratio of 1.3, jitter of +-5% never flags anyone: the medians then differ by at
most about 10%. ``min_gap_s`` (0 by default) also asks the median to be that many seconds over the
others': where the durations measured are near zero (a peer's message that was already there), a
ratio alone would flag noise. A protocol may stop waiting for a flagged peer (it does not block a step), while
still using what it sends in time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median

from gossamer.protocols.core.errors import ProtocolError


class PacingError(ProtocolError):
    """A pacing parameter or a measured duration that makes no sense."""


@dataclass(frozen=True)
class Pacing:
    """How deadlines adapt (see the module docstring)."""

    quantile: float = 0.9
    margin: float = 1.5
    floor_s: float = 0.5
    window: int = 32
    min_samples: int = 4

    def __post_init__(self) -> None:
        if not 0.5 <= self.quantile <= 1.0:
            raise PacingError(f"quantile must be in [0.5, 1], got {self.quantile}")
        if not (math.isfinite(self.margin) and self.margin >= 1.0):
            raise PacingError(f"margin must be a finite number >= 1, got {self.margin}")
        if not (math.isfinite(self.floor_s) and self.floor_s > 0):
            raise PacingError(f"floor_s must be a positive number, got {self.floor_s}")
        if self.window < 1 or self.min_samples < 1 or self.min_samples > self.window:
            raise PacingError(f"need 1 <= min_samples <= window, got {self.min_samples} and {self.window}")


def _duration(seconds: float) -> float:
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
        raise PacingError(f"a duration must be a finite number >= 0, got {seconds!r}")
    return float(seconds)


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of ``values`` by linear interpolation between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class AdaptiveDeadline:
    """The deadline of one kind of wait, from the durations measured so far."""

    def __init__(self, ceiling_s: float, pacing: Pacing = Pacing()) -> None:
        if not (math.isfinite(ceiling_s) and ceiling_s > 0):
            raise PacingError(f"the ceiling must be a positive number of seconds, got {ceiling_s}")
        self.ceiling_s = ceiling_s
        self.pacing = pacing
        self._seen: deque[float] = deque(maxlen=pacing.window)

    def observe(self, seconds: float) -> None:
        self._seen.append(_duration(seconds))

    @property
    def samples(self) -> int:
        return len(self._seen)

    def deadline_s(self) -> float:
        if len(self._seen) < self.pacing.min_samples:
            return self.ceiling_s
        wanted = quantile(list(self._seen), self.pacing.quantile) * self.pacing.margin
        return min(self.ceiling_s, max(self.pacing.floor_s, wanted))


class SlowPeers:
    """Fail-slow detection over per-peer durations of the same work (see the module docstring)."""

    def __init__(self, *, ratio: float = 1.3, window: int = 8, min_samples: int = 3, persist: int = 3,
                 min_gap_s: float = 0.0) -> None:
        if not (math.isfinite(ratio) and ratio > 1.0):
            raise PacingError(f"ratio must be a finite number > 1, got {ratio}")
        if not (math.isfinite(min_gap_s) and min_gap_s >= 0):
            raise PacingError(f"min_gap_s must be a finite number >= 0, got {min_gap_s}")
        if window < 1 or not 1 <= min_samples <= window or persist < 1:
            raise PacingError(f"need window >= 1, 1 <= min_samples <= window, persist >= 1; got {window}, "
                              f"{min_samples}, {persist}")
        self.ratio, self.window, self.min_samples, self.persist = ratio, window, min_samples, persist
        self.min_gap_s = min_gap_s
        self._seen: dict[str, deque[float]] = {}
        self._strikes: dict[str, int] = {}

    def observe(self, peer: str, seconds: float) -> None:
        self._seen.setdefault(peer, deque(maxlen=self.window)).append(_duration(seconds))

    def forget(self, peer: str) -> None:
        """A peer that left: its durations no longer count, and it is no longer flagged."""
        self._seen.pop(peer, None)
        self._strikes.pop(peer, None)

    def ratios(self) -> dict[str, float]:
        """Each measured peer's median over the median of the other measured peers' medians."""
        return {peer: ratio for peer, (ratio, _gap) in self._against_the_others().items()}

    def _against_the_others(self) -> dict[str, tuple[float, float]]:
        """Each measured peer's (ratio, seconds over) the median of the others' medians."""
        medians = {peer: median(seen) for peer, seen in self._seen.items() if len(seen) >= self.min_samples}
        out = {}
        for peer, own in medians.items():
            others = [m for other, m in medians.items() if other != peer]
            if others:
                reference = median(others)
                ratio = own / reference if reference > 0 else (1.0 if own == 0 else math.inf)
                out[peer] = (ratio, own - reference)
        return out

    def check(self) -> frozenset[str]:
        """Count a strike for every peer over the ratio (and ``min_gap_s``) now, reset the others;
        the flagged peers."""
        measured = self._against_the_others()
        for peer in list(self._strikes):
            if peer not in measured:
                del self._strikes[peer]
        for peer, (ratio, gap) in measured.items():
            slow = ratio > self.ratio and gap > self.min_gap_s
            self._strikes[peer] = self._strikes.get(peer, 0) + 1 if slow else 0
        return self.flagged()

    def flagged(self) -> frozenset[str]:
        return frozenset(peer for peer, strikes in self._strikes.items() if strikes >= self.persist)
