"""A fail-slow learner: l2's pseudo-gradients reach the others 1.2 s late in every round.

The verdicts run on a simulated clock (three learners' rounds as events, each learner's waits
decided by the ``LearnerPacing`` its role uses), so no load can change them: l0 and l1 flag l2
after exactly round 4 (3 samples, then 3 checks in a row), stop blocking their W2 wait on it from
round 5 (adaptive pacing only), and never flag each other. On a ``LocalNet``, where the machine's
load decides the measured times, the learners' ledgers and ``/status`` follow their pacing's
verdicts, whatever those are, and every ledger balances."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gossamer.protocols.diloco.core.pacing import LearnerPacing, Wait
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet

LEARNERS = ("l0", "l1", "l2")
COMPUTE_S, LINK_S, LATE_S, EVAL_S, W1_GRACE_S, W2_DEADLINE_S = 0.5, 0.05, 1.2, 0.1, 30.0, 30.0


@dataclass
class SimRound:
    """What one simulated round of a learner did (a ledger in short)."""

    slow: list[str]
    not_waited_for: list[str]
    deadline_s: float
    w2_wait_s: float
    used: list[str]


@dataclass
class SimLearner:
    name: str
    pacing: LearnerPacing
    round: int = 0
    phase: str = ""  # the kind of message its current wait is for ("params" or "pgrad"), "" when not waiting
    wait: Wait | None = None
    wait_began: float = 0.0
    inbox: dict[tuple[str, int], set[str]] = field(default_factory=dict)  # (kind, round) -> senders, in time
    rounds: list[SimRound] = field(default_factory=list)

    @property
    def others(self) -> list[str]:
        return [name for name in LEARNERS if name != self.name]


def simulate(rounds: int, *, adaptive: bool) -> dict[str, list[SimRound]]:
    """``rounds`` rounds of three learners on a simulated clock, each as its role runs one: send
    the parameters and compute for ``COMPUTE_S``; wait for the others' parameters (W1), send the
    pseudo-gradient and wait for the others' (W2), each wait as the learner's pacing says; then
    evaluate for ``EVAL_S``. Every message takes ``LINK_S``, l2's pseudo-gradients ``LATE_S`` more."""
    learners = {name: SimLearner(name, LearnerPacing(W2_DEADLINE_S, adaptive=adaptive)) for name in LEARNERS}
    events: list[tuple[float, int, Callable[[float], None]]] = []
    order = itertools.count()

    def at(when: float, action: Callable[[float], None]) -> None:
        heapq.heappush(events, (when, next(order), action))

    def send(me: SimLearner, kind: str, now: float) -> None:
        delay = LINK_S + (LATE_S if kind == "pgrad" and me.name == "l2" else 0.0)
        for name in me.others:
            at(now + delay, lambda now, to=learners[name], t=me.round: arrive(to, kind, me.name, t, now))

    def start(me: SimLearner, now: float) -> None:
        me.pacing.begin(me.round, now)
        me.pacing.keep_only(LEARNERS)
        send(me, "params", now)
        at(now + COMPUTE_S, lambda now: wait(me, "params", me.pacing.w1_wait(me.others, grace_s=W1_GRACE_S), now))

    def wait(me: SimLearner, kind: str, plan: Wait, now: float) -> None:
        me.phase, me.wait, me.wait_began = kind, plan, now
        if not end_if_heard(me, now):
            at(now + plan.timeout_s, lambda now, t=me.round: end(me, kind, t, now))

    def arrive(me: SimLearner, kind: str, sender: str, t: int, now: float) -> None:
        if kind == "pgrad":
            me.pacing.arrived(t, sender, now)  # measured whenever it comes, stale or not, as the role's receive does
        if t >= me.round:  # not stale: the inbox takes it
            me.inbox.setdefault((kind, t), set()).add(sender)
            end_if_heard(me, now)

    def end_if_heard(me: SimLearner, now: float) -> bool:
        if me.wait is not None and set(me.wait.wait_for) <= me.inbox.get((me.phase, me.round), set()):
            end(me, me.phase, me.round, now)
            return True
        return False

    def end(me: SimLearner, kind: str, t: int, now: float) -> None:
        if (me.phase, me.round) != (kind, t) or me.wait is None:
            return  # this wait ended already
        plan, me.wait, me.phase = me.wait, None, ""
        if kind == "params":
            send(me, "pgrad", now)
            wait(me, "pgrad", me.pacing.w2_wait(t, now, me.others), now)
            return
        slow = sorted(me.pacing.settle(t, me.others))
        me.rounds.append(SimRound(slow, plan.not_waited_for, plan.timeout_s, now - me.wait_began,
                                  sorted(me.inbox.pop(("pgrad", t), set()))))
        me.inbox.pop(("params", t), None)
        me.round += 1
        if me.round < rounds:
            at(now + EVAL_S, lambda now: start(me, now))

    for learner in learners.values():
        start(learner, 0.0)
    while events:
        when, _order, action = heapq.heappop(events)
        action(when)
    return {name: learner.rounds for name, learner in learners.items()}


@pytest.mark.parametrize("adaptive", [True, False])
def test_a_learner_late_in_every_round_is_flagged_after_round_4_on_a_simulated_clock(adaptive: bool) -> None:
    rounds = simulate(12, adaptive=adaptive)

    for name, other in (("l0", "l1"), ("l1", "l0")):
        ledgers = rounds[name]
        assert len(ledgers) == 12
        assert [lg.slow for lg in ledgers] == [[]] * 4 + [["l2"]] * 8  # 3 samples, then 3 checks in a row
        for lg in ledgers[:5]:  # until the flag every W2 wait blocks on l2, and l2's came in time
            assert lg.not_waited_for == [] and lg.used == [other, "l2"], lg
        for lg in ledgers[5:]:  # from the round after, only adaptive pacing stops waiting for l2
            if adaptive:
                assert lg.not_waited_for == ["l2"] and lg.used == [other] and lg.w2_wait_s == pytest.approx(LINK_S)
            else:
                assert lg.not_waited_for == [] and lg.used == [other, "l2"] and lg.w2_wait_s > 10 * LINK_S, lg
        assert all(lg.deadline_s <= W2_DEADLINE_S for lg in ledgers)
        assert (ledgers[-1].deadline_s < W2_DEADLINE_S) is adaptive
    assert all(lg.slow == [] for lg in rounds["l2"])  # the other two arrive alike: nobody is slow to l2


ROUNDS = 7
RUN = {
    "run": {"name": "slow", "protocol": "diloco", "heartbeat_s": 30.0},
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "hyper": {"rounds": ROUNDS, "batch_size": 4, "eval_batches": 1, "min_learners": 3, "w1_grace_s": 30.0,
              "w2_deadline_s": W2_DEADLINE_S, "pacing": "adaptive", "diloco": {"inner_steps": 2, "inner_lr": 0.003},
              "mixing": {"w1": "global", "w2": "global"}, "aggregator": {"name": "mean"}},
}


@pytest.mark.timeout(300)
async def test_on_a_localnet_the_ledgers_and_status_follow_the_pacing_verdicts(tmp_path: Path) -> None:
    net = await LocalNet.create(RUN, plugins=PLUGINS, workdir=tmp_path)
    roles: list[LearnerRole] = [(await net.add(f"l{i}", ("learner",))).role for i in range(3)]  # type: ignore[misc]
    net.slow("l2", LATE_S, op="pgrad")
    try:
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles[:2])), timeout=240)

        for role in roles[:2]:
            ledgers = [lg for t in range(ROUNDS) if (lg := role.history.get(t)) is not None]
            assert ledgers and all(lg.balance_problems() == [] for lg in ledgers)
            assert all(0.5 <= lg.w2_deadline_s <= W2_DEADLINE_S for lg in ledgers)
            assert ledgers[0].round > 0 or ledgers[0].not_waited_for == []
            for before, lg in itertools.pairwise(ledgers):  # a W2 wait skips whom the last one flagged
                if lg.round == before.round + 1:
                    assert lg.not_waited_for == sorted(set(before.slow) & set(lg.pseudo_gradients.expected))
            status = role.status()["pacing"]
            assert status["adaptive"] and status["slow_learners"] == ledgers[-1].slow
            assert set(status["learner_time_ratio"]) <= {r.peer_id for r in roles} - {role.peer_id}
    finally:
        await net.aclose()
