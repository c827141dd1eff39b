"""The suite's check for processes left running (tests/conftest.py), run on a tiny test file by a
pytest of its own, in this process and with two xdist workers: a process a test leaks (a child of
pytest, or an orphan found by the run's mark in its environment) fails the run, is listed with the
test that started it, and is killed; a test whose processes end with it (the ``processes``
fixture ends what a daemon left in its session) passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gossamer_harness.leftovers import RUN_ENV, environment
from gossamer_harness.localproc import alive

ROOT = Path(__file__).resolve().parents[2]
LEAKY = '''
import os, subprocess, sys
from pathlib import Path

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def record(name, pid):
    Path(os.environ["LEAK_RECORD"], name).write_text(str(pid))


def test_leaks_a_child():
    record("child", subprocess.Popen(SLEEPER, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)


def test_leaks_an_orphan():
    """Its parent exits at once: only the run's mark in its environment says where it came from."""
    spawn = (f"import subprocess; print(subprocess.Popen({SLEEPER!r}, start_new_session=True, "
             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    record("orphan", int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True,
                                        check=True).stdout))
'''
CLEAN = '''
import os, sys
from pathlib import Path

DAEMON = """
import json, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"event": "ready", "child": child.pid}), flush=True)
time.sleep(600)
"""


def test_starts_a_daemon_with_a_child_and_leaves_them_to_the_fixture(processes, tmp_path):
    daemon = processes.start([], log_path=tmp_path / "log", program=[sys.executable, "-c", DAEMON])
    child = daemon.wait_ready()["child"]
    Path(os.environ["LEAK_RECORD"], "daemon").write_text(str(daemon.proc.pid))
    Path(os.environ["LEAK_RECORD"], "child").write_text(str(child))
'''


def run_pytest(tmp_path: Path, source: str, workers: str) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    """``source`` as a test file run by its own pytest with the suite's conftest; its output and
    the PIDs its tests recorded, by name."""
    (tmp_path / "test_case.py").write_text(source)
    record = tmp_path / "record"
    record.mkdir()
    env = {**os.environ, "LEAK_RECORD": str(record)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "tests.conftest",
                             "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-n", workers,
                             "--dist", "loadfile", str(tmp_path / "test_case.py")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return result, {path.name: int(path.read_text()) for path in record.iterdir()}


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_leaked_process_fails_the_run_is_listed_and_killed(tmp_path: Path, workers: str) -> None:
    result, pids = run_pytest(tmp_path, LEAKY, workers)
    try:
        out = result.stdout
        assert "2 passed" in out, out + result.stderr
        assert result.returncode == 1, out + result.stderr
        assert "processes left running" in out, out
        assert sorted(pids) == ["child", "orphan"]
        for name, test in (("child", "test_leaks_a_child"), ("orphan", "test_leaks_an_orphan")):
            listed = [line for line in out.splitlines() if line.startswith(f"pid {pids[name]}, started by ")]
            assert listed and f"::{test} (call)" in listed[0], out
            assert not alive(pids[name]), f"the leaked {name} must be killed"
    finally:
        for pid in pids.values():
            if alive(pid) and environment(pid).get(RUN_ENV):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_test_whose_processes_end_with_it_passes(tmp_path: Path, workers: str) -> None:
    result, pids = run_pytest(tmp_path, CLEAN, workers)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "processes left running" not in result.stdout
        assert sorted(pids) == ["child", "daemon"] and not any(alive(pid) for pid in pids.values())
    finally:
        for pid in pids.values():
            if alive(pid) and environment(pid).get(RUN_ENV):
                os.kill(pid, signal.SIGKILL)
