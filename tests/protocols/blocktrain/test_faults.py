"""Faults by (peer, version, phase) in a BlockTrain run on LocalNet (``gossamer_harness.blocktrain``):
a slow and a crashed worker; the coordinator dead mid-aggregate with a host dead before loading;
the coordinator dead with a version on disk but not served; a host dead with a pass in hand. Each
must finish with the survivors agreeing with the protocol over what survived (``faultchecks``);
the bounds on waits are generous (``slack_s``): no assertion is about speed."""

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
