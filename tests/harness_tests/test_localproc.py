"""``GossamerProcess`` around any program that prints JSON event lines: ``drain`` hands over what
has arrived, once, without waiting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gossamer_harness.localproc import GossamerProcess

SCRIPT = """
import json, sys
print(json.dumps({"event": "ready"}), flush=True)
line = sys.stdin.readline()
print("not an event", flush=True)
print(json.dumps({"event": "got", "line": line.strip()}), flush=True)
"""


def test_drain_returns_each_arrived_event_once_from_any_program(tmp_path: Path) -> None:
    proc = GossamerProcess([], log_path=tmp_path / "log", program=[sys.executable, "-c", SCRIPT],
                           stdin=subprocess.PIPE)
    try:
        proc.wait_ready(timeout_s=60)
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
