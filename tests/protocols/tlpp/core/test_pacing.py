"""The TL++ node pacing (``protocols.tlpp.core.pacing``), pure: +-5% jitter flags and cuts nobody; a
node persistently slower than the others is flagged after exactly the persistence count, still
waited for inside the margin and cut past it; a deadline at its floor grows back at once when every
node slows; fixed pacing always waits the ceiling."""

from __future__ import annotations

import random

import pytest

from gossamer.protocols.tlpp.core.pacing import NodePacing

FORWARD_S, BACKWARD_S = 2.0, 1.0
CEILING_S, FLOOR_S = 30.0, 1.0
NODES = [f"n{i}" for i in range(6)]


def pacing(adaptive: bool = True) -> NodePacing:
    return NodePacing(ceiling_s=CEILING_S, floor_s=FLOOR_S, adaptive=adaptive)


def step(pace: NodePacing, times: dict[str, tuple[float, float]]) -> list[str]:
    """One step as the driver measures it when every node answers: (forward, backward) per node."""
    for node, (forward, backward) in times.items():
        pace.observe("forward", node, forward)
        pace.observe("backward", node, backward)
    return pace.settle()


@pytest.mark.parametrize("adaptive", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jitter_of_5_percent_flags_nobody_and_no_node_is_ever_late(adaptive: bool, seed: int) -> None:
    rng, pace = random.Random(seed), pacing(adaptive)
    for _ in range(500):
        times = {n: (FORWARD_S * rng.uniform(0.95, 1.05), BACKWARD_S * rng.uniform(0.95, 1.05)) for n in NODES}
        deadlines = {phase: pace.deadline_s(phase) for phase in ("forward", "backward")}

        flagged = step(pace, times)

        assert flagged == []
        assert all(f < deadlines["forward"] and b < deadlines["backward"] for f, b in times.values())
    assert pace.deadline_s("forward") < CEILING_S if adaptive else pace.deadline_s("forward") == CEILING_S


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_node_persistently_slower_is_flagged_after_exactly_the_persistence_count(adaptive: bool) -> None:
    """1.5x slower under +-5% jitter is always over 1.3x the others: flagged at the 5th step (3
    samples, then 3 checks in a row), and unflagged at the first step its median is back."""
    rng, pace = random.Random(7), pacing(adaptive)
    flags = []
    for _ in range(8):
        times = {n: (FORWARD_S * rng.uniform(0.95, 1.05), BACKWARD_S * rng.uniform(0.95, 1.05)) for n in NODES}
        times["n5"] = (1.5 * times["n5"][0], 1.5 * times["n5"][1])
        flags.append(step(pace, times))
    while "n5" in pace.flagged():
        flags.append(step(pace, {n: (FORWARD_S, BACKWARD_S) for n in NODES}))

    assert flags[:4] == [[]] * 4 and all(f == ["n5"] for f in flags[4:-1]) and flags[-1] == []
    assert len(flags) - 8 <= 8  # back under within its window of 8 steps
    assert pace.status()["slow_nodes"] == [] and set(pace.status()["node_time_ratio"]) == set(NODES)


def test_a_flagged_node_30_percent_slower_is_still_waited_for_and_a_much_slower_one_is_cut() -> None:
    """The deadline follows the unflagged nodes' times: 1.5x their quantile, so a node 30% slower
    (flagged) still answers in time, while one 3x slower is past it."""
    for factor, late in ((1.32, False), (3.0, True)):
        pace = pacing()
        for _ in range(5):
            step(pace, {"a": (2.0, 1.0), "b": (2.0, 1.0), "c": (2.0, 1.0), "slow": (2.0 * factor, 1.0 * factor)})

        cutoff = pace.cutoff_s("forward")

        assert pace.flagged() == {"slow"} and cutoff == pytest.approx(3.0)  # 1.5 x 2.0: the others' pace
        assert (2.0 * factor > cutoff) is late


def test_a_deadline_at_its_floor_grows_back_at_once_when_every_node_slows() -> None:
    pace = pacing()
    for _ in range(8):
        step(pace, {n: (0.1, 0.1) for n in NODES[:3]})
    assert pace.deadline_s("forward") == FLOOR_S == pace.cutoff_s("backward")

    # nobody answers by the cutoff (1 s): ``paced`` waits for every node, whose times are measured
    step(pace, {n: (3.0, 3.0) for n in NODES[:3]})
    after_one = pace.deadline_s("forward")
    for _ in range(7):
        step(pace, {n: (3.0, 3.0) for n in NODES[:3]})

    assert after_one > 3.0 and pace.deadline_s("forward") == pytest.approx(4.5) == pace.deadline_s("backward")


def test_a_cut_node_stays_flagged_but_its_lower_bound_never_moves_the_deadline() -> None:
    pace = pacing()
    flags = []
    for _ in range(6):
        for node in "abc":
            pace.observe("forward", node, 1.0)
            pace.observe("backward", node, 1.0)
        pace.record("forward", answered={}, cut={"d": 5.0})
        flags.append(pace.settle())

    assert flags[4] == flags[5] == ["d"] and pace.deadline_s("forward") == pytest.approx(1.5)


def test_fixed_pacing_waits_the_ceiling_and_still_flags() -> None:
    pace = pacing(adaptive=False)
    for _ in range(6):
        step(pace, {"a": (0.1, 0.1), "b": (0.1, 0.1), "slow": (4.0, 0.1)})

    assert pace.flagged() == {"slow"} and pace.cutoff_s("forward") is None
    assert pace.deadlines() == {"forward": CEILING_S, "backward": CEILING_S}
    assert pace.status()["adaptive"] is False and pace.status()["slow_nodes"] == ["slow"]


def test_a_node_that_left_is_forgotten() -> None:
    pace = pacing()
    for _ in range(6):
        step(pace, {"a": (1.0, 1.0), "b": (1.0, 1.0), "slow": (9.0, 1.0)})
    assert pace.flagged() == {"slow"}

    pace.keep_only(["a", "b"])

    assert pace.flagged() == frozenset() and set(pace.status()["node_time_ratio"]) == {"a", "b"}
    assert pace.deadline_s("forward") == pytest.approx(1.5)
