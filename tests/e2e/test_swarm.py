"""``gossamer swarm`` (what scripts/demo runs): an orchestrator and three peers find each other and
everything stops cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_demo_preset_swarm_finds_all_peers_and_exits_cleanly(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "peer.cli", "swarm", "--preset", "demo", "--duration_s", "20",
                             "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 4 peers see each other" in result.stdout
    assert "stopped 4 process(es) cleanly" in result.stdout
    assert "live peers of demo@" in result.stdout
