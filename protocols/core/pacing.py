"""Deadlines that follow the live peers' measured times (``AdaptiveDeadline``, tuned by ``Pacing``)
and fail-slow detection (``SlowPeers``). Pure: every duration is given by the caller, nothing here
reads a clock; the configured deadline is always the ceiling (README.md, "Pacing")."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median

from gossamer.protocols.core.errors import InvalidSetting, ProtocolError
from gossamer.protocols.core.settings import check, setting


class PacingError(ProtocolError):
    """A measured duration, a deadline ceiling or a ``SlowPeers`` parameter that makes no sense."""


@dataclass(frozen=True)
class Pacing:
    """How deadlines adapt: a high quantile of the last durations times a margin, never under the floor."""

    quantile: float = setting(0.9, low=0.5, high=1.0, doc="quantile of the measured durations a deadline follows")
    margin: float = setting(1.5, low=1.0, doc="factor over that quantile")
    floor_s: float = setting(0.5, above=0.0, doc="shortest deadline, in seconds")
    window: int = setting(32, low=1, doc="durations remembered (the latest)")
    min_samples: int = setting(4, low=1, doc="durations needed before the deadline adapts (until then: the ceiling)")

    def __post_init__(self) -> None:
        check(self)
        if self.min_samples > self.window:
            raise InvalidSetting(f"need min_samples <= window, got {self.min_samples} and {self.window}")


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
