"""Two daemons with one identity on one host (the README's join command run beside the
orchestrator, both on ~/.gossamer/identity.pem): the second sees the first's record being
republished in the run's view and refuses to start, naming the fix, instead of silently
overwriting the first's record."""

from __future__ import annotations

from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, Processes, gossamer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # the waits follow progress: this is the last resort

RUN = """
[run]
name = "twins"
protocol = "none"
heartbeat_s = 1.0
"""


def test_a_second_live_daemon_with_the_same_identity_is_refused(processes: Processes, tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    owner = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                             "--identity_path", str(tmp_path / "owner.pem")], log_path=tmp_path / "owner.log")
    ready = owner.wait_ready()
    twin = gossamer(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], *LOOPBACK,
                     "--identity_path", str(tmp_path / "owner.pem")])
    assert twin.returncode == 2, twin.stderr[-2000:]
    assert "another live daemon uses this identity" in twin.stderr and "--identity_path" in twin.stderr
    assert "Traceback" not in twin.stderr

    other = gossamer(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], *LOOPBACK,
                      "--identity_path", str(tmp_path / "nobody" / "missing" / "x.pem"), "--roles", "learner"])
    assert other.returncode == 2 and "learner" in other.stderr
    assert not (tmp_path / "nobody").exists(), "no identity is created for arguments that do not validate"
    assert owner.proc.poll() is None, "the first daemon keeps running"
