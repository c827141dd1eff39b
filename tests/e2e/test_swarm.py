"""``gossamer swarm --preset demo`` (what scripts/demo runs): an orchestrator and three learners
find each other, train with the loss falling, write checkpoints, print a sample, and everything
stops cleanly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gossamer.transport.safetensors_stream import load_file
from gossamer_harness.localproc import gossamer

# The run goes on as long as the swarm's processes are busy; this limit is the last resort (the
# run takes about a minute at load 2, and many times that on a machine as loaded as a busy CI host)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def test_demo_preset_trains_and_exits_cleanly(tmp_path: Path) -> None:
    result = gossamer(["swarm", "--preset", "demo", "--workdir", str(tmp_path)])
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "all 4 peers see each other" in out
    assert "the run is finished (all 3 peers)" in out and "sample from" in out
    assert "stopped 4 process(es) cleanly" in out
    heldout = [float(x) for x in re.findall(r"\[peer-1\] \[[#-]+\] +\d+/8  round \d+: .*?held-out (\d+\.\d+)", out)]
    assert len(heldout) == 8 and heldout[-1] < heldout[0] - 0.2, heldout
    checkpoints = sorted((tmp_path / "checkpoints").glob("demo-*-round8.safetensors"))
    assert len(checkpoints) == 3
    tensors, metadata = load_file(checkpoints[0])
    assert metadata["round"] == "8" and "embed.weight" in tensors
