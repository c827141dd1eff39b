"""Faults injected into a TL++ run by (peer, step, phase) (``protocols.tlpp.fault_runs``: the
real roles on a LocalNet, the orchestrator writing its state every step), one case per test:

- base mode, a pair in step 1: node1 crashes mid-send (its activations went out, its gradients
  never did) while node2 answers slowly (inside the deadline): node1 is dropped, node2 used;
- base mode: the orchestrator crashes mid-aggregate in step 1 (the gradient summed, not applied),
  is restarted with the same identity and checkpoint folder, and ends bit-identical to a run
  without the fault;
- secure mode, a pair in step 1: node3 crashes before the step and the helper crashes after it
  summed its shares, before answering: training stops with ``HelperFailed`` with nothing of step 1
  applied, and the helper and the orchestrator restarted go on from step 1 (which the nodes that
  answered it refuse to replay: it applies nothing) to the end;
- secure mode, a pair in step 1: node2 hangs (past the deadline: dropped when it runs out) and
  the orchestrator stalls before its backward requests.

Each case passes ``fault_checks``: the run finishes, every stop is the one the fault explains and
left nothing half-applied, the resumed orchestrator starts from exactly its last step's state,
every ledger of every life balances, every applied step is within 1e-5 (base) or the fixed-point
bound (secure) of the protocol's gradient over exactly the nodes its ledger says it used, the
failed nodes are never used from their step on, every later step used every node it planned,
and no step waited past its deadline. Waits are on the roles' own events (``done``, the view);
nothing sleeps to synchronise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer.protocols.registry import PLUGINS
from gossamer_harness.tlpp.fault_runs import Fault, RunShape, identities, reference, run_case

pytestmark = pytest.mark.timeout(300)
BASE = RunShape(mode="base", nodes=3, deadline_s=30.0, hang_s=31.0)
SECURE = RunShape(mode="secure", nodes=4, deadline_s=30.0, hang_s=31.0)


async def checked(faults: list[Fault], shape: RunShape, tmp_path: Path, *, identical: bool = False) -> dict:
    ids = identities(shape)
    want = await reference(shape=shape, ids=ids, workdir=tmp_path / "reference", plugins=PLUGINS) if identical else None
    result = await run_case(faults, shape=shape, ids=ids, workdir=tmp_path / "case", plugins=PLUGINS, reference=want,
                            timeout_s=200)
    assert result["passed"], result["problems"]
    return result


async def test_a_node_crashing_mid_send_beside_a_slow_one_is_dropped_and_the_slow_one_used(tmp_path: Path) -> None:
    result = await checked([("crash_mid_send", "node1", 1), ("slow", "node2", 1)], BASE, tmp_path)

    assert result["stops"] == [] and result["applied"] == BASE.steps


async def test_an_orchestrator_crashed_mid_aggregate_resumes_and_ends_bit_identical(tmp_path: Path) -> None:
    result = await checked([("crash_mid_aggregate", "orchestrator", 1)], BASE, tmp_path, identical=True)

    assert [(stop["how"], stop["step"], stop["intact"]) for stop in result["stops"]] == [("killed", 1, True)]
    assert result["identical"] is True and result["applied"] == BASE.steps


async def test_a_helper_crashing_mid_aggregate_stops_secure_training_and_a_restart_goes_on(tmp_path: Path) -> None:
    result = await checked([("crash_before", "node3", 1), ("crash_mid_aggregate", "helper", 1)], SECURE, tmp_path)

    assert [(stop["how"], stop["step"], stop["intact"]) for stop in result["stops"]] == [("HelperFailed", 1, True)]
    assert result["applied"] == SECURE.steps - 1  # step 1 replayed: the nodes that answered it refuse


async def test_a_hung_node_is_dropped_at_its_deadline_beside_a_stalled_orchestrator(tmp_path: Path) -> None:
    shape = RunShape(mode="secure", nodes=4, deadline_s=6.0, hang_s=7.0)
    result = await checked([("hang", "node2", 1), ("slow", "orchestrator", 1)], shape, tmp_path)

    assert result["stops"] == [] and result["applied"] == shape.steps
