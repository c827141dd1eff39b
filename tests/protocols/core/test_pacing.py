"""Adaptive deadlines and fail-slow detection (pure): the deadline follows the measured quantile
within [floor, ceiling], a persistently slow peer is flagged and unflagged, jitter flags nobody."""

from __future__ import annotations

import math
import random

import pytest

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.pacing import AdaptiveDeadline, Pacing, PacingError, SlowPeers, quantile


def test_the_ceiling_holds_until_enough_durations_are_seen() -> None:
    deadline = AdaptiveDeadline(60.0, Pacing(min_samples=4))
    for _ in range(3):
        deadline.observe(2.0)
        assert deadline.deadline_s() == 60.0

    deadline.observe(2.0)

    assert deadline.deadline_s() == pytest.approx(3.0)  # 2.0 x margin 1.5


def test_the_deadline_is_a_quantile_times_the_margin_between_floor_and_ceiling() -> None:
    durations = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    deadline = AdaptiveDeadline(100.0, Pacing(quantile=0.9, margin=2.0, min_samples=1))
    for seconds in durations:
        deadline.observe(seconds)

    assert deadline.deadline_s() == pytest.approx(2.0 * quantile(durations, 0.9)) == pytest.approx(18.2)
    capped = AdaptiveDeadline(5.0, Pacing(min_samples=1))
    capped.observe(30.0)
    floored = AdaptiveDeadline(5.0, Pacing(min_samples=1, floor_s=0.5))
    floored.observe(0.001)
    assert capped.deadline_s() == 5.0 and floored.deadline_s() == 0.5


def test_only_the_last_window_counts_so_a_link_that_slows_down_is_followed() -> None:
    deadline = AdaptiveDeadline(100.0, Pacing(window=8, min_samples=4, margin=1.0, quantile=1.0))
    for _ in range(8):
        deadline.observe(1.0)
    fast = deadline.deadline_s()
    for _ in range(8):
        deadline.observe(10.0)

    assert fast == 1.0 and deadline.deadline_s() == 10.0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "2"])
def test_a_duration_that_makes_no_sense_is_refused(bad: object) -> None:
    with pytest.raises(PacingError, match="a duration must be a finite number"):
        AdaptiveDeadline(10.0).observe(bad)  # type: ignore[arg-type]
    with pytest.raises(PacingError, match="a duration must be a finite number"):
        SlowPeers().observe("a", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"quantile": 0.2}, "quantile must be >= 0.5"), ({"margin": 0.5}, "margin must be >= 1"),
    ({"floor_s": 0.0}, "floor_s must be > 0"), ({"margin": math.inf}, "margin must be a finite number"),
    ({"window": 2, "min_samples": 3}, "min_samples <= window")])
def test_pacing_settings_that_cannot_work_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidSetting, match=message):
        Pacing(**kwargs)


def test_a_peer_persistently_slower_is_flagged_after_persist_checks_and_unflagged_when_back() -> None:
    peers = SlowPeers(ratio=1.3, window=4, min_samples=3, persist=3)
    flagged_at = []
    for check in range(8):
        for peer in ("a", "b", "c"):
            peers.observe(peer, 1.0)
        peers.observe("slow", 1.5)
        if peers.check():
            flagged_at.append(check)
    for _ in range(4):  # it recovers: its window fills with normal durations
        for peer in ("a", "b", "c", "slow"):
            peers.observe(peer, 1.0)
        recovered = peers.check()

    assert flagged_at[0] == 4  # min_samples durations at check 2, then three strikes in a row
    assert peers.ratios()["slow"] == pytest.approx(1.0) and recovered == frozenset()


def test_two_peers_are_enough_and_the_fast_one_is_never_flagged() -> None:
    peers = SlowPeers(persist=1, min_samples=1)
    peers.observe("fast", 1.0)
    peers.observe("slow", 2.0)

    assert peers.check() == {"slow"} and peers.ratios()["fast"] == pytest.approx(0.5)


def test_jitter_of_five_percent_never_flags_anyone() -> None:
    rng = random.Random(7)
    peers = SlowPeers()
    ever = set()
    for _ in range(2000):
        for peer in "abcdefgh":
            peers.observe(peer, 1.0 * (1 + rng.uniform(-0.05, 0.05)))
        ever |= peers.check()

    assert ever == set()


def test_a_peer_that_leaves_is_forgotten() -> None:
    peers = SlowPeers(persist=1, min_samples=1)
    for peer, seconds in (("a", 1.0), ("b", 1.0), ("slow", 3.0)):
        peers.observe(peer, seconds)
    assert peers.check() == {"slow"}

    peers.forget("slow")

    assert peers.flagged() == frozenset() and "slow" not in peers.ratios()


def test_min_gap_keeps_near_zero_durations_from_flagging_anyone() -> None:
    """Messages that were already there measure ~0 s: a ratio alone would flag 0.02 s against 0.001 s."""
    gapless, gapped = SlowPeers(min_samples=1, persist=1), SlowPeers(min_samples=1, persist=1, min_gap_s=0.5)
    for peers in (gapless, gapped):
        for peer, seconds in (("a", 0.001), ("b", 0.0), ("c", 0.02)):
            peers.observe(peer, seconds)

    assert gapless.check() == {"c"} and gapped.check() == frozenset()
    gapped.observe("c", 3.0)
    gapped.observe("c", 3.0)
    assert gapped.check() == {"c"}  # 3 s over the others is slow, whatever the ratio's base
    with pytest.raises(PacingError, match="min_gap_s"):
        SlowPeers(min_gap_s=-1.0)
