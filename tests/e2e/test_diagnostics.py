"""A stuck daemon can say where it is: ``kill -USR1 PID`` writes every thread's stack to its log
(stderr), and the daemon goes on serving."""

from __future__ import annotations

import os
import signal
import urllib.request
from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, Processes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # the wait follows progress: this is the last resort

RUN = """
[run]
name = "diagnostics"
protocol = "none"
heartbeat_s = 1.0
"""


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_daemon_goes_on(processes: Processes,
                                                                              tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    owner = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                             "--identity_path", str(tmp_path / "owner.pem")], log_path=tmp_path / "owner.log")
    ready = owner.wait_ready()
    os.kill(owner.proc.pid, signal.SIGUSR1)
    # The handler writes every thread's stack, the main thread's last: it must reach run_daemon,
    # in the event loop (looked at until written: a read can land while the dump is being written).
    # The wait fails if SIGUSR1 ends the daemon.
    log = owner.wait_log(lambda text: "run_daemon" in text.partition("Current thread")[2])
    assert "asyncio" in log.partition("Current thread")[2]
    with urllib.request.urlopen(f"http://{ready['http']}/status", timeout=60) as reply:
        assert reply.status == 200
    assert owner.proc.poll() is None
    assert owner.stop() == 0
