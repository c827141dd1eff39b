"""A persistently slow TL++ data node (node2 stalls in every forward; real roles over loopback TCP):
either pacing flags it from the fifth step and no other; adaptive pacing then drops it as late and
the step applies exactly the other two's gradient (``recheck``), fixed pacing uses it every step.
Assertions are on the ledgers; nothing sleeps to synchronise and nothing is timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer_harness.tlpp.fault_checks import BASE_TOLERANCE, SECURE_TOLERANCE
from gossamer_harness.tlpp.recheck import StepStates, recheck
from tests.protocols.tlpp.harness import Tlpp

pytestmark = pytest.mark.timeout(240)
SOURCES = [f"builtin:digits:shard={i}/3" for i in range(3)]
HYPER = {"mode": "base", "batch_size": 24, "optimizer": "sgd", "lr": 0.2, "eval_every": 0, "min_nodes": 3,
         "node_timeout_s": 60.0}
# secure mode: Adam, the helper, k = 2 nodes and 20 samples left when node2 is dropped
SECURE = {**HYPER, "mode": "secure", "optimizer": "adam", "lr": 0.01, "batch_size": 48, "helper_timeout_s": 60.0}
FLAGGED_FROM = 4  # the step whose end first flags it


async def run(tmp_path: Path, *, hyper: dict, stall_s: float) -> tuple[Tlpp, list[StepLedger], StepStates]:
    net = await Tlpp.create(tmp_path, hyper=hyper, sources=SOURCES, helper=hyper["mode"] == "secure")
    net.slow("node2", stall_s, op="forward")  # every step: the node's forward stalls before it answers
    states = StepStates(lambda name: net.orchestrator if name == "orchestrator" else None, net.orchestrator)
    net.watchers.append(states)
    await net.orchestrator.start()
    await net.orchestrator.done.wait()
    return net, list(net.orchestrator.history), states


def gap(net: Tlpp, states: StepStates, step: int) -> float:
    """How far the applied step is from the protocol's gradient over exactly the nodes it used."""
    data = {net.id_of(f"node{i}"): net.peers[f"node{i}"].role.data for i in range(3)}  # type: ignore[attr-defined]
    return recheck(step, states=states, settings=net.orchestrator.settings, data=data)


def check_flags(net: Tlpp, ledgers: list[StepLedger]) -> None:
    slow = net.id_of("node2")
    assert all(not ledger.balance_problems() for ledger in ledgers), [x.balance_problems() for x in ledgers]
    assert [ledger.slow for ledger in ledgers[:FLAGGED_FROM]] == [[]] * FLAGGED_FROM
    assert all(ledger.slow == [slow] for ledger in ledgers[FLAGGED_FROM:]), [x.slow for x in ledgers]
    assert net.orchestrator.status()["pacing"]["slow_nodes"] == [slow]


@pytest.mark.parametrize("hyper", [HYPER, SECURE], ids=["base", "secure"])
async def test_with_adaptive_pacing_a_slow_node_is_flagged_and_then_not_waited_for(tmp_path: Path, hyper: dict) -> None:
    adaptive = {**hyper, "pacing": "adaptive", "node_floor_s": 2.0, "steps": 7}
    net, ledgers, states = await run(tmp_path, hyper=adaptive, stall_s=4.0)
    try:
        slow, others = net.id_of("node2"), {net.id_of("node0"), net.id_of("node1")}
        check_flags(net, ledgers)
        assert all(set(ledger.used) == {*others, slow} for ledger in ledgers[:FLAGGED_FROM + 1])
        after = ledgers[FLAGGED_FROM + 1]  # the first step with node2 flagged: the others' pace
        assert 2.0 <= after.deadline_s["forward"] < 4.0  # the floor, unless node0 and node1 were slowed too
        assert slow in after.planned and after.applied and set(after.used) == others
        assert after.rejected[slow].startswith("forward: late: no answer within the adaptive deadline of ")
        assert all(ledger.applied and others <= set(ledger.used) for ledger in ledgers)
        assert all(set(ledger.rejected) <= {slow} for ledger in ledgers)
        tolerance = SECURE_TOLERANCE if hyper["mode"] == "secure" else BASE_TOLERANCE
        assert all(gap(net, states, ledger.step) <= tolerance for ledger in ledgers)  # exact over the nodes used
        assert net.orchestrator.finished and net.orchestrator.status()["pacing"]["adaptive"] is True
    finally:
        await net.aclose()


async def test_with_fixed_pacing_a_slow_node_is_flagged_and_still_waited_for(tmp_path: Path) -> None:
    net, ledgers, _ = await run(tmp_path, hyper={**HYPER, "steps": 6}, stall_s=1.0)
    try:
        check_flags(net, ledgers)
        everyone = {net.id_of(f"node{i}") for i in range(3)}
        assert all(ledger.applied and set(ledger.used) == everyone for ledger in ledgers)
        assert all(ledger.deadline_s == {"forward": 60.0, "backward": 60.0} for ledger in ledgers)
    finally:
        await net.aclose()
