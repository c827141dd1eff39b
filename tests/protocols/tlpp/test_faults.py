"""Faults injected into a TL++ run by (peer, step, phase) (``gossamer_harness.tlpp.fault_runs``: the
real roles on a LocalNet, the orchestrator writing its state every step), one case per test; each
case passes ``fault_checks`` (what that means: ``protocols/tlpp/README.md``, "Faults"). Waits are
on the roles' own events; nothing sleeps to synchronise."""

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
    """node1's activations went out, its gradients never did; node2 answers inside the deadline."""
    result = await checked([("crash_mid_send", "node1", 1), ("slow", "node2", 1)], BASE, tmp_path)

    assert result["stops"] == [] and result["applied"] == BASE.steps


async def test_an_orchestrator_crashed_mid_aggregate_resumes_and_ends_bit_identical(tmp_path: Path) -> None:
    """The gradient of step 1 summed, not applied; restarted with the same identity and checkpoint folder."""
    result = await checked([("crash_mid_aggregate", "orchestrator", 1)], BASE, tmp_path, identical=True)

    assert [(stop["how"], stop["step"], stop["intact"]) for stop in result["stops"]] == [("killed", 1, True)]
    assert result["identical"] is True and result["applied"] == BASE.steps


async def test_a_helper_crashing_mid_aggregate_stops_secure_training_and_a_restart_goes_on(tmp_path: Path) -> None:
    """node3 crashes before step 1, the helper after it summed its shares, before answering:
    ``HelperFailed`` with nothing of step 1 applied; the helper and the orchestrator restarted go
    on from step 1 (which the nodes that answered it refuse to replay) to the end."""
    result = await checked([("crash_before", "node3", 1), ("crash_mid_aggregate", "helper", 1)], SECURE, tmp_path)

    assert [(stop["how"], stop["step"], stop["intact"]) for stop in result["stops"]] == [("HelperFailed", 1, True)]
    assert result["applied"] == SECURE.steps - 1  # step 1 replayed: the nodes that answered it refuse


async def test_a_hung_node_is_dropped_at_its_deadline_beside_a_stalled_orchestrator(tmp_path: Path) -> None:
    """Secure mode: node2 hangs past the deadline while the orchestrator stalls before its backward requests."""
    shape = RunShape(mode="secure", nodes=4, deadline_s=6.0, hang_s=7.0)
    result = await checked([("hang", "node2", 1), ("slow", "orchestrator", 1)], shape, tmp_path)

    assert result["stops"] == [] and result["applied"] == shape.steps
