"""A stuck daemon can say where it is: ``kill -USR1 PID`` writes every thread's stack to its log
(stderr), and the daemon goes on serving."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, GossamerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

RUN = """
[run]
name = "diagnostics"
protocol = "none"
heartbeat_s = 1.0
"""


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_daemon_goes_on(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    log = tmp_path / "owner.log"
    owner = GossamerProcess(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                             "--identity_path", str(tmp_path / "owner.pem")], log_path=log)
    try:
        ready = owner.wait_ready()
        os.kill(owner.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        # The handler writes every thread's stack, the main thread's last: it must reach run_daemon,
        # in the event loop (polled until written: a read can land while the dump is being written).
        while "run_daemon" not in log.read_text(errors="replace").partition("Current thread")[2]:
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            assert owner.proc.poll() is None, "SIGUSR1 must not end the daemon"
            time.sleep(0.1)
        assert "asyncio" in log.read_text(errors="replace").partition("Current thread")[2]
        with urllib.request.urlopen(f"http://{ready['http']}/status", timeout=30) as reply:
            assert reply.status == 200
        assert owner.proc.poll() is None
    finally:
        assert owner.stop() == 0
