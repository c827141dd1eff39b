"""Who the TL++ orchestrator schedules after a failure (roles in one process over loopback TCP): a
node that failed a step comes back within the epoch once its record is renewed, one that keeps
failing stays out longer, and a ``private`` node is never scheduled until its record says it can
be reached."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gossamer.peer.run.records import PRIVATE, RELAYED
from tests.protocols.tlpp.harness import Tlpp
from tests.protocols.tlpp.test_roles import HYPER, SOURCES

pytestmark = pytest.mark.timeout(120)
STEPS = 20


async def train(net: Tlpp, renew_at: set[int]) -> list[Any]:
    """Run the orchestrator to its end; at the events of the steps in ``renew_at`` the network's
    clock moves on a second and every record is published again (a heartbeat of every peer)."""
    def renew(_peer: str, event: str, fields: Mapping[str, Any]) -> None:
        if event == "tlpp.step" and fields["step"] in renew_at:
            net.skip(1.0)
            net.announce()

    net.watchers.append(renew)
    await net.orchestrator.start()
    await asyncio.wait_for(net.orchestrator.done.wait(), 90)
    assert net.orchestrator.finished
    return list(net.orchestrator.history)


async def test_a_node_that_failed_once_is_scheduled_again_once_its_record_is_renewed(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": "base", "steps": STEPS}, sources=SOURCES, helper=False)
    net.fail("node1", 1, "backward")
    node1 = net.id_of("node1")
    try:
        ledgers = await train(net, renew_at={2})
        planned = [ledger.step for ledger in ledgers if node1 in ledger.planned]
        assert all(ledger.applied for ledger in ledgers) and len(ledgers) == STEPS
        assert list(ledgers[1].rejected) == [node1]
        # out from the step after its failure until its record was renewed (at step 2's event), then back
        assert planned[:2] == [0, 1] and 2 not in planned and len(planned) > 2, planned
        assert planned[2:] == list(range(planned[2], STEPS)), planned
        assert all(node1 in ledger.used for ledger in ledgers[planned[2]:])
    finally:
        await net.aclose()


async def test_a_node_that_fails_again_stays_out_longer_than_a_heartbeat(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": "base", "steps": STEPS}, sources=SOURCES, helper=False)
    for step in range(1, STEPS):
        net.fail("node1", step, "backward")
    node1 = net.id_of("node1")
    try:
        # a renewed record every step from step 2 on: one second each, far less than the 30 s
        # heartbeat the second failure leaves it out for
        ledgers = await train(net, renew_at=set(range(2, STEPS)))
        planned = [ledger.step for ledger in ledgers if node1 in ledger.planned]
        assert all(ledger.applied for ledger in ledgers) and len(ledgers) == STEPS
        assert len(planned) == 3 and planned[:2] == [0, 1] and planned[2] >= 3, planned
        assert [ledger.step for ledger in ledgers if node1 in ledger.rejected] == planned[1:]
    finally:
        await net.aclose()


async def test_a_private_node_is_never_scheduled_until_its_record_says_it_is_relayed(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": "base", "steps": STEPS, "min_nodes": 2},
                            sources=SOURCES, helper=False)
    node1 = net.id_of("node1")
    net.peers["node1"].reachability = PRIVATE
    await net.publish()

    def relayed(_peer: str, event: str, fields: Mapping[str, Any]) -> None:
        if event == "tlpp.step" and fields["step"] == 3:  # it took a relay: its next record says so
            net.peers["node1"].reachability = RELAYED
            net.skip(1.0)
            net.announce()

    net.watchers.append(relayed)
    try:
        await net.orchestrator.start()
        await asyncio.wait_for(net.orchestrator.done.wait(), 90)
        ledgers = list(net.orchestrator.history)
        planned = [ledger.step for ledger in ledgers if node1 in ledger.planned]
        assert all(ledger.applied for ledger in ledgers) and len(ledgers) == STEPS
        assert not any(node1 in ledger.rejected for ledger in ledgers), "no step was spent asking a private node"
        assert planned and planned[0] > 3 and planned == list(range(planned[0], STEPS)), planned
        assert all(node1 in ledger.used for ledger in ledgers[planned[0]:])
    finally:
        await net.aclose()
