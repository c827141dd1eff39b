"""``GossamerProcess`` around any program that prints JSON event lines: ``drain`` hands over what
has arrived, once; a wait goes on while the process makes progress (events, log lines, CPU) and
gives up once it is quiet; ``stop`` and ``Processes`` end a process with all it started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gossamer_harness.localproc import GossamerProcess, Processes, alive, wait_until

SCRIPT = """
import json, sys
print(json.dumps({"event": "ready"}), flush=True)
line = sys.stdin.readline()
print("not an event", flush=True)
print(json.dumps({"event": "got", "line": line.strip()}), flush=True)
"""
READY = 'import json, sys, time\nprint(json.dumps({"event": "ready"}), flush=True)\n'
# its events come 0.5 s apart, for 4 s: never 2 s without one, 4 s in all (the process sleeps between)
TICKING = READY + """
for i in range(8):
    time.sleep(0.5)
    print(json.dumps({"event": "tick", "i": i}), flush=True)
print(json.dumps({"event": "done"}), flush=True)
time.sleep(600)
"""
LOGGING = READY + """
for i in range(8):
    time.sleep(0.5)
    print(f"log line {i}", file=sys.stderr, flush=True)
print(json.dumps({"event": "done"}), flush=True)
time.sleep(600)
"""
# silent while it computes (4 s of CPU), as a daemon starting up or training is
BUSY = READY + """
while time.process_time() < 4.0:
    pass
print(json.dumps({"event": "done"}), flush=True)
time.sleep(600)
"""
SILENT = READY + "time.sleep(600)\n"
SPINNING = READY + "while True:\n    pass\n"
# a daemon with a p2pd: a child in its session, which it never stops
WITH_CHILD = """
import json, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"event": "ready", "child": child.pid}), flush=True)
time.sleep(600)
"""


def program(tmp_path: Path, source: str, *, name: str = "log", **options) -> GossamerProcess:
    return GossamerProcess([], log_path=tmp_path / name, program=[sys.executable, "-c", source], **options)


def test_drain_returns_each_arrived_event_once_from_any_program(tmp_path: Path) -> None:
    proc = program(tmp_path, SCRIPT, stdin=subprocess.PIPE)
    try:
        proc.wait_ready()
        assert proc.drain() == []  # the program waits for its line: nothing more has arrived
        assert proc.proc.stdin is not None
        proc.proc.stdin.write(b"go\n")
        proc.proc.stdin.flush()
        assert proc.proc.wait(timeout=60) == 0
        events = proc.drain()
        assert [(e["event"], e["line"]) for e in events] == [("got", "go")]
        assert proc.drain() == []
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("source", [TICKING, LOGGING, BUSY], ids=["events", "log-lines", "cpu"])
def test_a_wait_goes_on_past_its_idle_timeout_while_the_process_makes_progress(tmp_path: Path, source: str) -> None:
    """Each program takes 4 s or more to its ``done`` event, twice the idle timeout, and shows
    progress all along: by events, by log lines, or by computing."""
    with Processes() as started:
        proc = started.add(program(tmp_path, source))
        proc.wait_ready()
        assert proc.wait_event(lambda e: e["event"] == "done", idle_timeout_s=2.0)["event"] == "done"


def test_a_wait_gives_up_once_the_process_is_quiet(tmp_path: Path) -> None:
    with Processes() as started:
        proc = started.add(program(tmp_path, SILENT))
        proc.wait_ready()
        with pytest.raises(AssertionError, match="no progress for 2 s"):
            proc.wait_event(lambda e: e["event"] == "done", idle_timeout_s=2.0)


def test_a_wait_gives_up_at_its_cap_however_busy_the_process(tmp_path: Path) -> None:
    with Processes() as started:
        proc = started.add(program(tmp_path, SPINNING))
        proc.wait_ready()
        with pytest.raises(AssertionError, match="within the cap of 3 s"):
            proc.wait_event(lambda e: e["event"] == "done", idle_timeout_s=60.0, cap_s=3.0)


def test_events_of_the_processes_it_also_watches_are_progress_and_stay_queued(tmp_path: Path) -> None:
    with Processes() as started:
        quiet = started.add(program(tmp_path, SILENT, name="quiet.log"))
        ticking = started.add(program(tmp_path, TICKING, name="ticking.log"))
        quiet.wait_ready()
        ticking.wait_ready()
        with pytest.raises(AssertionError, match="no progress for 2 s"):  # once the other is done too
            quiet.wait_event(lambda e: e["event"] == "done", idle_timeout_s=2.0, also=[ticking])
        assert [e["event"] for e in ticking.drain()] == [*["tick"] * 8, "done"]


def test_wait_until_reads_again_while_the_processes_make_progress_and_gives_up_once_they_are_quiet(
        tmp_path: Path) -> None:
    with Processes() as started:
        ticking = started.add(program(tmp_path, TICKING))
        ticking.wait_ready()
        # what no event announces, read again and again: here, what the process printed last
        assert wait_until(lambda: ticking.latest.get("done"), bool, watching=[ticking], idle_timeout_s=2.0)
        with pytest.raises(AssertionError, match="with no progress for 2 s"):
            wait_until(lambda: ticking.latest.get("never"), bool, watching=[ticking], idle_timeout_s=2.0)


def test_a_wait_ends_when_the_process_exits(tmp_path: Path) -> None:
    with Processes() as started:
        proc = started.add(program(tmp_path, READY))
        with pytest.raises(AssertionError, match="the process exited"):
            proc.wait_event(lambda e: e["event"] == "done")
        assert proc.wait_event(lambda e: e["event"] == "exited")["code"] == 0


def test_stop_ends_what_the_process_left_in_its_session(tmp_path: Path) -> None:
    proc = program(tmp_path, WITH_CHILD)
    try:
        child = proc.wait_ready()["child"]
        assert proc.children() == [child]
        assert proc.stop() != 0  # SIGTERM: the program has no handler
        assert proc.left_behind == [child] and not alive(child)
        assert proc.stop() == proc.proc.returncode  # again: nothing left to do
    finally:
        proc.stop()


def test_processes_end_every_process_and_what_each_started_even_a_stopped_one(tmp_path: Path) -> None:
    with Processes() as started:
        procs = [started.add(program(tmp_path, WITH_CHILD, name=f"{i}.log")) for i in range(2)]
        children = [proc.wait_ready()["child"] for proc in procs]
        procs[1].signal_group(19)  # SIGSTOP: it cannot take SIGTERM until continued
    assert all(proc.proc.poll() is not None for proc in procs)
    assert not any(alive(pid) for pid in children)
