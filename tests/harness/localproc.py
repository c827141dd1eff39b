"""Local ``gossamer`` processes for end-to-end tests and benchmarks: start one through the CLI,
read its ``--events`` JSON lines (with ``select``, no threads), find its children (hivemind's
p2pd), stop it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from gossamer.peer.processes import child_pids, stat_fields

LOOPBACK = ["--host", "127.0.0.1", "--host_maddrs", "/ip4/127.0.0.1/tcp/0"]


class GossamerProcess:
    """One ``python -m peer.cli ...`` process (or ``program`` + args: any process that prints JSON
    event lines); stderr goes to ``log_path``, events are read from stdout. ``env`` replaces the
    environment (e.g. a ``PYTHONPATH`` that runs another version of gossamer)."""

    def __init__(self, args: list[str], *, log_path: Path, env: dict[str, str] | None = None,
                 wrapper: tuple[str, ...] = (), program: list[str] | None = None, stdin: int | None = None) -> None:
        """``wrapper`` runs the process under a command (e.g. ``("taskset", "-c", "1")`` in a benchmark);
        ``program`` replaces ``python -m gossamer.peer.cli``; ``stdin`` (e.g. subprocess.PIPE) its input."""
        self.log_path = log_path
        self.started_at = time.monotonic()
        self.started_wall_time = time.time()
        self._log = open(log_path, "wb")  # closed in stop()
        program = program or [sys.executable, "-m", "gossamer.peer.cli"]
        self.proc = subprocess.Popen([*wrapper, *program, *args], stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=stdin, start_new_session=True, env=env)
        self._buffer = b""
        self._pending: deque[dict[str, Any]] = deque()
        self.recent: deque[dict[str, Any]] = deque(maxlen=12)  # the last events read: a failed wait shows them
        self._eof = False
        self.latest: dict[str, dict[str, Any]] = {}

    def _next_event(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while not self._pending and not self._eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            assert self.proc.stdout is not None
            readable, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if readable:
                self._absorb(os.read(self.proc.stdout.fileno(), 1 << 16))
        if self._pending:
            return self._pending.popleft()
        return {"event": "exited", "code": self.proc.wait()}

    def _absorb(self, chunk: bytes) -> None:
        if not chunk:
            self._eof = True
            return
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            event["at_s"] = time.monotonic() - self.started_at
            event["read_wall_time"] = time.time()
            self._pending.append(event)
            self.recent.append(event)
            self.latest[event.get("event", "")] = event

    def drain(self) -> list[dict[str, Any]]:
        """Every event that has arrived so far, without waiting (they are not returned again)."""
        self.pump()
        events = list(self._pending)
        self._pending.clear()
        return events

    def wait_event(self, predicate, *, timeout_s: float) -> dict[str, Any]:
        """The first event satisfying ``predicate``; AssertionError (with the log) otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._next_event(max(0.0, deadline - time.monotonic()))
            if event is not None and predicate(event):
                return event
            if event is None or event["event"] == "exited":
                recent = "\n".join(json.dumps(e, default=str)[:600] for e in self.recent)
                raise AssertionError(f"no matching event within {timeout_s}s ({event}); last events:\n{recent}\n"
                                     f"log:\n{self.log()[-3000:]}")

    def poll_events(self) -> list[dict[str, Any]]:
        """The events that have arrived so far and were not returned yet, without waiting."""
        assert self.proc.stdout is not None
        while not self._eof and select.select([self.proc.stdout], [], [], 0)[0]:
            self._absorb(os.read(self.proc.stdout.fileno(), 1 << 16))
        events = list(self._pending)
        self._pending.clear()
        return events

    def wait_ready(self, timeout_s: float = 60.0) -> dict[str, Any]:
        return self.wait_event(lambda e: e["event"] == "ready", timeout_s=timeout_s)

    def pump(self) -> None:
        """Read the events that have arrived, without waiting: they stay queued for ``wait_event``
        and ``latest`` is current. A test that waits on another process calls this now and then,
        so this one never blocks writing to a full stdout pipe."""
        assert self.proc.stdout is not None
        while not self._eof and select.select([self.proc.stdout], [], [], 0.0)[0]:
            self._absorb(os.read(self.proc.stdout.fileno(), 1 << 16))

    def wait_peer_count(self, count: int, timeout_s: float) -> dict[str, Any]:
        """Wait until the process's live peer table has ``count`` peers (now, or by a later event)."""
        self.drain()  # what has already arrived: ``latest`` is current, older events are not waited on
        latest = self.latest.get("peers")
        if latest is not None and latest["count"] == count:
            return latest
        return self.wait_event(lambda e: e["event"] == "peers" and e["count"] == count, timeout_s=timeout_s)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def children(self) -> list[int]:
        return child_pids(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None:
                pipe.close()
        self._log.close()
        return code


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def gossamer(args: list[str], *, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run a short-lived ``gossamer`` command to completion."""
    return subprocess.run([sys.executable, "-m", "gossamer.peer.cli", *args], capture_output=True, text=True, timeout=timeout_s)
