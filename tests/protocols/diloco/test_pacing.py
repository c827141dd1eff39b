"""A learner's W2 pacing on a simulated clock (every moment given, none read): under +-5% jitter
nobody is flagged and the deadline follows the measured waits under its ceiling; a learner
persistently later than the others is flagged and, with adaptive pacing only, no longer waited
for; an arrival after the wait ended still counts, so a deadline that was too short grows again."""

from __future__ import annotations

import random

import pytest

from gossamer.protocols.diloco.core.pacing import LearnerPacing, Wait, catch_up_limit_s

PEERS = ["a", "b", "c", "d"]
COMPUTE_S = 2.0  # every learner's time from the round's start to its pseudo-gradient


def play_round(pacing: LearnerPacing, t: int, times: dict[str, float], *, mine_s: float = COMPUTE_S) -> frozenset[str]:
    """Round t starting at 100 t: each learner's pseudo-gradient comes ``times[peer]`` after the
    start; ours is ready at ``mine_s``, when the W2 wait begins. What arrived past the wait's
    deadline comes after it is settled, as a stale message would."""
    start = 100.0 * t
    pacing.begin(t, start)
    wait = pacing.w2_wait(t, start + mine_s, times)
    on_time = {peer: s for peer, s in times.items() if s <= mine_s + wait.timeout_s}
    for peer, seconds in sorted(on_time.items(), key=lambda kv: kv[1]):
        pacing.arrived(t, peer, start + seconds)
    flagged = pacing.settle(t, times)
    assert set(wait.wait_for) <= set(times) and wait.follow_view is pacing.adaptive
    assert wait.not_waited_for == sorted(set(times) - set(wait.wait_for))
    for peer, seconds in times.items():
        if peer not in on_time:
            pacing.arrived(t, peer, start + seconds)
    return flagged


@pytest.mark.parametrize("adaptive", [True, False])
def test_five_percent_jitter_flags_nobody_over_500_rounds(adaptive: bool) -> None:
    rng = random.Random(5)
    pacing = LearnerPacing(15.0, adaptive=adaptive)
    for t in range(500):
        times = {peer: COMPUTE_S * rng.uniform(0.95, 1.05) for peer in PEERS}
        assert play_round(pacing, t, times, mine_s=COMPUTE_S * rng.uniform(0.95, 1.05)) == frozenset(), t
        assert pacing.waited_for(PEERS) == PEERS

    assert pacing.status()["slow_learners"] == []
    # the waits measured are at most 10% of 2 s: the deadline is at its floor when adaptive
    assert pacing.w2_deadline_s() == (0.5 if adaptive else 15.0)


def test_a_persistently_late_learner_is_flagged_and_only_adaptive_pacing_stops_waiting_for_it() -> None:
    runs = {}
    for adaptive in (True, False):
        rng = random.Random(7)
        pacing = LearnerPacing(15.0, adaptive=adaptive)
        flags = []
        for t in range(12):
            times = {peer: COMPUTE_S * rng.uniform(0.95, 1.05) for peer in PEERS}
            times["d"] = 3.0 * COMPUTE_S  # 4 s later than the others every round
            flags.append(play_round(pacing, t, times))
        runs[adaptive] = (pacing, flags)

    for pacing, flags in runs.values():
        assert flags[:4] == [frozenset()] * 4  # 3 samples before it counts, then 3 checks in a row
        assert all(flag == {"d"} for flag in flags[4:]), flags
        assert pacing.status()["slow_learners"] == ["d"] and pacing.status()["learner_time_ratio"]["d"] > 2.5
    assert runs[True][0].waited_for(PEERS) == ["a", "b", "c"]
    assert runs[False][0].waited_for(PEERS) == PEERS and runs[False][0].w2_deadline_s() == 15.0
    assert runs[True][0].w2_deadline_s() < 15.0


def test_arrivals_after_the_wait_count_so_a_deadline_too_short_grows_again() -> None:
    pacing = LearnerPacing(30.0, adaptive=True)
    for t in range(8):  # everyone at once: the deadline goes down to its floor
        play_round(pacing, t, dict.fromkeys(PEERS, COMPUTE_S))
    assert pacing.w2_deadline_s() == 0.5
    for t in range(8, 40):  # then everyone's link gets slower alike: 3 s more for every message
        play_round(pacing, t, dict.fromkeys(PEERS, COMPUTE_S + 3.0))

    assert pacing.w2_deadline_s() == pytest.approx(4.5)  # 3 s of waiting x margin 1.5, nobody flagged
    assert pacing.status()["slow_learners"] == []


def test_a_learner_that_left_is_forgotten() -> None:
    pacing = LearnerPacing(15.0, adaptive=True)
    for t in range(6):
        play_round(pacing, t, {"a": COMPUTE_S, "b": COMPUTE_S, "c": 4 * COMPUTE_S})
    assert pacing.status()["slow_learners"] == ["c"]

    pacing.keep_only(["a", "b"])

    assert pacing.status()["slow_learners"] == [] and "c" not in pacing.status()["learner_time_ratio"]


def test_arrivals_too_far_ahead_or_too_old_are_not_kept() -> None:
    pacing = LearnerPacing(15.0, adaptive=True)
    pacing.begin(10, 0.0)
    for round in (1_000_000, 13, 2):  # past the inbox's window ahead, and older than the rounds kept
        pacing.arrived(round, "a", 1.0)
    pacing.arrived(12, "a", 1.0)

    assert list(pacing._arrivals) == [(12, "a")]


def test_the_w1_wait_blocks_on_the_same_learners_for_its_grace_and_the_floor_never_tops_the_ceiling() -> None:
    pacing = LearnerPacing(15.0, adaptive=True)
    for t in range(6):
        play_round(pacing, t, {"a": COMPUTE_S, "b": COMPUTE_S, "c": 4 * COMPUTE_S})

    assert pacing.w1_wait(["a", "c"], grace_s=2.0) == Wait(("a", "c"), ("a",), 2.0, follow_view=True)

    short = LearnerPacing(0.2, adaptive=True, floor_s=0.5)
    for t in range(8):
        play_round(short, t, dict.fromkeys(PEERS, COMPUTE_S))
    assert short.w2_deadline_s() == 0.2
    assert catch_up_limit_s(3, 15.0) == 45.0
