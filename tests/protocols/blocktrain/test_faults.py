"""Faults injected by (peer, version, phase) into a BlockTrain run on LocalNet: four block workers,
the block coordinator and two block servers holding both blocks (``protocols.blocktrain.faultcase``
tables what each fault does to each role), trained to version 3, then two client passes:

- a pair on two workers: w2's update of version 1 is slow (inside the deadline: used), w3 dies
  with its update of version 1 in flight (not used; its block is covered by the others);
- a pair on two roles: the coordinator dies mid-aggregate of version 1 (averaged in memory,
  nothing written; started again, it resumes from disk and the workers train that version again)
  and h0 dies as it is about to load version 2;
- the coordinator dies with version 2 of a block on disk but not yet served (its next life
  serves it);
- h0 dies with the client's pass in hand (the client routes around it, through h1).

Pass (``protocols.blocktrain.faultchecks``): the run finishes; every ledger of every coordinator
life balances; every version that reached the disk is, within 1e-5, the protocol's
``next_block`` over exactly the updates its ledger used, as the workers sent them; the faulted
workers' updates are used only as the protocol allows; every copy of a version (served, resumed,
held by a live server) is bit-identical; the client's passes equal the protocol's pass bit for
bit. The bounds on waits are generous (``slack_s``): no assertion is about speed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer.protocols.core.text_data import load_text
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.blocktrain.faultcase import CaseConfig, Fault
from gossamer_harness.blocktrain.faultchecks import run_case

pytestmark = pytest.mark.timeout(300)
VERSIONS = 3


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(load_text("builtin:pydoc")[:200_000])
    return path


@pytest.mark.parametrize("faults", [
    [("slow_send", "w2", 1), ("crash_mid_send", "w3", 1)],
    [("crash_mid_aggregate", "c", 1), ("crash_before", "h0", 2)],
    [("crash_mid_send", "c", 1)],
    [("crash_mid_send", "h0", VERSIONS)],
], ids=["worker-slow+worker-crash-mid-send", "coordinator-crash-mid-aggregate+host-crash-before",
        "coordinator-crash-mid-send", "host-crash-mid-pass"])
async def test_the_survivors_agree_with_the_protocol_over_what_survived(faults: list[Fault], tmp_path: Path,
                                                                         text_file: Path) -> None:
    config = CaseConfig(data=text_file, versions=VERSIONS, deadline_s=8.0, slow_s=0.5, hang_s=12.0,
                        route_timeout_s=8.0, slack_s=30.0, timeout_s=200.0)

    result = await run_case(faults, config=config, plugins=PLUGINS, workdir=tmp_path)

    assert result["problems"] == [], result
    assert result["rechecked"] >= 2 * VERSIONS and result["recheck_gap"] <= 1e-5
    assert result["identical"] and result["passes"] == ["equal", "equal"]
    crashed_coordinator = any(peer == "c" for _, peer, _ in faults)
    assert result["lives"] == (2 if crashed_coordinator else 1)
