"""Two ways to slow one process down (a volunteer whose machine is busy) for ``slow_peer.py``:
a CPU quota (cgroup v1, root) and a duty cycle (SIGSTOP / SIGCONT, binds whatever the load)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup/cpu")


class CpuQuota:
    """A cgroup v1 cpu group limited to ``share`` of one CPU; ``wrapper`` starts a command inside it,
    ``move`` puts a running process in it (all its threads), ``release`` takes it out again. On a
    machine other jobs keep busy every process already gets less than that share, and the handicap
    vanishes: ``DutyCycle`` holds there."""

    def __init__(self, share: float, *, script: str) -> None:
        if not (CGROUP / "cgroup.procs").exists() or not os.access(CGROUP, os.W_OK):
            sys.exit(f"{script} needs a writable cgroup v1 cpu controller at {CGROUP} (root) to slow a peer")
        self.path = CGROUP / f"gossamer-slow-{os.getpid()}"
        self.path.mkdir()
        (self.path / "cpu.cfs_period_us").write_text("100000")
        (self.path / "cpu.cfs_quota_us").write_text(str(int(100000 * share)))
        self.wrapper = ("sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh")

    def move(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def release(self, pid: int) -> None:
        (CGROUP / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():  # leftovers go back to the root group
            (CGROUP / "cgroup.procs").write_text(pid)
        self.path.rmdir()


class DutyCycle:
    """Stops the process ``pid`` for ``1 - share`` of every ``period_s`` until ``stop()``. Only that
    process: its children (a peer's DHT node) keep running, so it stays reachable and published.
    The period is long (1 s) on purpose: the scheduler credits a task that slept, and over a short
    period a stopped task makes up most of what it lost (at 100 ms a 20% duty cycle still ran at ~30%)."""

    def __init__(self, pid: int, *, share: float, period_s: float = 1.0) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"share must be in (0, 1), got {share}")
        self.pid, self.share, self.period_s = pid, share, period_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"duty-cycle-{pid}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                if self._stopped.wait((1.0 - self.share) * self.period_s):  # the slowness itself
                    break
                os.kill(self.pid, signal.SIGCONT)
                self._stopped.wait(self.share * self.period_s)
        except ProcessLookupError:
            return
        finally:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

