"""Local ``gossamer`` processes for end-to-end tests and benchmarks: start one through the CLI in
its own session, read its ``--events`` JSON lines (``select``, no threads), wait for an event as
long as the work goes on, stop it with everything it started (hivemind's p2pd); ``Processes``
stops every one a test or fixture started."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gossamer.peer.processes import child_pids, stat_fields
from gossamer_harness.leftovers import descendants, end, in_session, living, stamped

LOOPBACK = ["--host", "127.0.0.1", "--host_maddrs", "/ip4/127.0.0.1/tcp/0"]
IDLE_TIMEOUT_S = 120.0
"""A wait gives up once the processes it watches were quiet this long: no event, no log line, none
of them busy. Longer than any deadline the e2e runs wait out (a withheld update, a dead peer)."""
CAP_S = 900.0  # a wait gives up after this long however busy the processes are (the backstop)
BUSY_SHARE = 0.5  # busy: its threads wanted the CPU (ran or waited to) for this share of the time
LOOK_S = 1.0  # how often a wait looks at the processes' CPU use and logs
Event = dict[str, Any]


class GossamerProcess:
    """One ``python -m peer.cli ...`` process (or ``program`` + args: any process that prints JSON
    event lines), leading its own session; stderr goes to ``log_path``, events are read from
    stdout. ``env`` replaces the environment (e.g. a ``PYTHONPATH`` that runs another version of
    gossamer); the test run's marks (``leftovers.MARKS``) are kept in it."""

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
                                     stdin=stdin, start_new_session=True, env=stamped(env))
        self._buffer = b""
        self._pending: deque[Event] = deque()
        self.recent: deque[Event] = deque(maxlen=12)  # the last events read: a failed wait shows them
        self._eof = False
        self.latest: dict[str, Event] = {}
        self.output_at = self.started_at  # when a line (an event or not) was last read from stdout
        self.left_behind: list[int] = []  # ``stop``: its session's processes still there when it ended

    # -- reading events ---------------------------------------------------------------------------

    def _next_event(self, timeout_s: float) -> Event | None:
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
        if lines:
            self.output_at = time.monotonic()
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

    def pump(self) -> None:
        """Read the events that have arrived, without waiting: they stay queued for ``wait_event``
        and ``latest`` is current. A test that waits on another process calls this now and then
        (or passes this one as ``also``), so this one never blocks writing to a full stdout pipe."""
        assert self.proc.stdout is not None
        while not self._eof and select.select([self.proc.stdout], [], [], 0.0)[0]:
            self._absorb(os.read(self.proc.stdout.fileno(), 1 << 16))

    def drain(self) -> list[Event]:
        """Every event that has arrived so far, without waiting (they are not returned again)."""
        self.pump()
        events = list(self._pending)
        self._pending.clear()
        return events

    poll_events = drain

    # -- waiting ----------------------------------------------------------------------------------

    def wait_event(self, predicate: Callable[[Event], bool], *, timeout_s: float | None = None,
                   idle_timeout_s: float = IDLE_TIMEOUT_S, cap_s: float = CAP_S,
                   also: Sequence[GossamerProcess] = ()) -> Event:
        """The first event satisfying ``predicate`` (an ``exited`` event once the process ended);
        AssertionError with the last events and the log otherwise. With ``timeout_s``, within that
        many seconds. Otherwise for as long as the work goes on: until this process and ``also``
        (their events are read and queued meanwhile) have been quiet for ``idle_timeout_s`` (see
        ``Progress``), or ``cap_s`` has passed."""
        also = [other for other in also if other is not self]
        started = time.monotonic()
        progress = None if timeout_s is not None else Progress([self, *also], now=started)
        while True:
            now = time.monotonic()
            if progress is None:
                wait_s = started + timeout_s - now  # type: ignore[operator]
            else:
                wait_s = min(LOOK_S, progress.last + idle_timeout_s - now, started + cap_s - now)
            event = self._next_event(max(0.0, wait_s))
            if event is not None and predicate(event):
                return event
            if event is not None and event["event"] == "exited":
                self._fail(f"the process exited ({event}) before a matching event")
            for other in also:
                other.pump()
            now = time.monotonic()
            if progress is None:
                if now >= started + timeout_s:  # type: ignore[operator]
                    self._fail(f"no matching event within {timeout_s} s")
            elif now >= progress.look(now) + idle_timeout_s:
                self._fail(f"no matching event: no progress for {idle_timeout_s:.0f} s (no event, no log "
                           f"line, no process busy), {now - started:.0f} s into the wait")
            elif now >= started + cap_s:
                self._fail(f"no matching event within the cap of {cap_s:.0f} s (progress went on)")

    def _fail(self, why: str) -> NoReturn:
        recent = "\n".join(json.dumps(e, default=str)[:600] for e in self.recent)
        raise AssertionError(f"{why}; last events:\n{recent}\nlog:\n{self.log()[-3000:]}")

    def wait_ready(self, **wait: Any) -> Event:
        """The ``ready`` event (start-up prints nothing before it, but keeps the process ``Busy``)."""
        return self.wait_event(lambda e: e["event"] == "ready", **wait)

    def wait_peer_count(self, count: int, **wait: Any) -> Event:
        """Wait until the process's live peer table has ``count`` peers (now, or by a later event)."""
        self.drain()  # what has already arrived: ``latest`` is current, older events are not waited on
        latest = self.latest.get("peers")
        if latest is not None and latest["count"] == count:
            return latest
        return self.wait_event(lambda e: e["event"] == "peers" and e["count"] == count, **wait)

    def wait_log(self, holds: Callable[[str], bool], *, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 cap_s: float = CAP_S) -> str:
        """The log (stderr) once ``holds`` of it, looked at every 0.1 s (events are queued
        meanwhile); AssertionError when the process ends first or is quiet for ``idle_timeout_s``
        (see ``Progress``), or after ``cap_s``."""
        started = time.monotonic()
        progress = Progress([self], now=started)
        while not holds(text := self.log()):
            if self.proc.poll() is not None:
                self._fail(f"the process exited (code {self.proc.returncode}) before its log showed it")
            now = time.monotonic()
            if now >= progress.look(now) + idle_timeout_s or now >= started + cap_s:
                self._fail(f"its log did not show it, {now - started:.0f} s into the wait")
            assert self.proc.stdout is not None
            if not self._eof and select.select([self.proc.stdout], [], [], 0.1)[0]:  # the wait between looks
                self._absorb(os.read(self.proc.stdout.fileno(), 1 << 16))
        return text

    # -- what it is doing ---------------------------------------------------------------------------

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_bytes(self) -> int:
        """How much the process has written to its log so far."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def children(self) -> list[int]:
        return child_pids(self.proc.pid)

    # -- the end ----------------------------------------------------------------------------------

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process and every process of its group (what it started)."""
        try:
            os.killpg(self.proc.pid, sig)
        except OSError:  # every process of the group is gone
            pass

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Send ``sig`` (0: none, just wait) and wait for the exit; SIGKILL to the whole group
        after ``timeout_s``. Then whatever is left of its session (a p2pd its daemon did not
        stop) is noted in ``left_behind`` and killed. The exit code; callable again."""
        if self.proc.poll() is None and sig:
            self.proc.send_signal(sig)
            self.signal_group(signal.SIGCONT)  # a stopped process takes its signal once continued
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            code = self.proc.wait()
        left = in_session(self.proc.pid)
        self.left_behind = self.left_behind or left
        end(left)
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None:
                pipe.close()
        self._log.close()
        return code


class Busy:
    """Whether a process and what it started (its descendants) kept busy between two looks: their
    threads wanted the CPU (ran, or waited in a run queue) ``BUSY_SHARE`` of the time or more. Work
    that goes on, however slowly a loaded machine lets it, is busy; an idle daemon waiting on the
    network wants well under 5%. Read from /proc/PID/task/*/schedstat."""

    def __init__(self, pid: int, *, now: float) -> None:
        self.pid = pid
        self._cpu_s, self._at = self._wanted_s(), now

    def _wanted_s(self, table: dict[int, list[str]] | None = None) -> float:
        table = living() if table is None else table
        total_ns = 0
        for pid in (self.pid, *descendants(self.pid, table)):
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                        running_ns, waiting_ns, _ = f.read().split()
                except (OSError, ValueError):
                    continue
                total_ns += int(running_ns) + int(waiting_ns)
        return total_ns / 1e9

    def look(self, now: float, table: dict[int, list[str]] | None = None) -> bool:
        """Whether it was busy since the last look (``table``: ``leftovers.living()``, if read)."""
        cpu_s = self._wanted_s(table)
        busy = cpu_s - self._cpu_s >= BUSY_SHARE * (now - self._at)
        self._cpu_s, self._at = cpu_s, now
        return busy


class Progress:
    """When a set of processes last made progress, as a wait sees it: an event or another line read
    from one's stdout, a line in one's log, or one ``Busy``."""

    def __init__(self, procs: Iterable[GossamerProcess], *, now: float) -> None:
        self.procs = list(procs)
        self.last = now
        self._looked = now
        self._logs = [proc.log_bytes() for proc in self.procs]
        self._busy = [Busy(proc.proc.pid, now=now) for proc in self.procs]

    def look(self, now: float) -> float:
        """The last time progress was seen (looking at logs and CPU use at most every ``LOOK_S``)."""
        self.last = max([self.last, *(proc.output_at for proc in self.procs)])
        if now - self._looked < LOOK_S:
            return self.last
        logs = [proc.log_bytes() for proc in self.procs]
        table = living()
        busy = [busy.look(now, table) for busy in self._busy]  # every one: each measures from its last look
        if any(busy) or logs != self._logs:
            self.last = now
        self._looked, self._logs = now, logs
        return self.last


class Processes:
    """The processes one test or fixture started (``start``, or ``add`` for one made elsewhere):
    ``close`` (or the end of a ``with`` block) ends every one still running, side by side (SIGTERM,
    then SIGKILL to its group after ``timeout_s``), each with all it started."""

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.started: list[GossamerProcess] = []

    def start(self, args: list[str], **options: Any) -> GossamerProcess:
        """A ``GossamerProcess(args, **options)``, ended by ``close``."""
        return self.add(GossamerProcess(args, **options))

    def add(self, proc: GossamerProcess) -> GossamerProcess:
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.proc.poll() is None:
                proc.proc.terminate()
                proc.signal_group(signal.SIGCONT)
        for proc in self.started:
            proc.stop(sig=0, timeout_s=self.timeout_s)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(read: Callable[[], Any], holds: Callable[[Any], bool], *, watching: Sequence[GossamerProcess],
               idle_timeout_s: float = IDLE_TIMEOUT_S, cap_s: float = CAP_S, every_s: float = 0.25) -> Any:
    """``read()`` again (every ``every_s``, the ``watching`` processes' events queued meanwhile)
    until ``holds`` of it, for as long as those processes make ``Progress``, at most ``cap_s``;
    AssertionError with the last value otherwise. For what no event announces (a page, a table)."""
    started = time.monotonic()
    progress = Progress(watching, now=started)
    while not holds(value := read()):
        now = time.monotonic()
        if now >= progress.look(now) + idle_timeout_s:
            raise AssertionError(f"not so, with no progress for {idle_timeout_s:.0f} s ({now - started:.0f} s "
                                 f"into the wait): {value}")
        if now >= started + cap_s:
            raise AssertionError(f"not so within the cap of {cap_s:.0f} s (progress went on): {value}")
        pipes = [proc.proc.stdout for proc in watching if not proc._eof]
        select.select(pipes, [], [], every_s) if pipes else time.sleep(every_s)  # the wait between looks
        for proc in watching:
            proc.pump()
    return value


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


def gossamer(args: list[str], *, timeout_s: float | None = None, idle_timeout_s: float = IDLE_TIMEOUT_S,
             cap_s: float = CAP_S, wrapper: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run a ``gossamer`` command (under ``wrapper``) to completion, its output captured: within
    ``timeout_s``, or else for as long as it stays ``Busy`` (never idle ``idle_timeout_s``, at most
    ``cap_s``); subprocess.TimeoutExpired otherwise, once it and all it started are killed. What
    it started and left in its session is killed when it ends."""
    command = [*wrapper, sys.executable, "-m", "gossamer.peer.cli", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        started = last = time.monotonic()
        busy = Busy(proc.pid, now=started)
        while True:
            try:
                out, err = proc.communicate(timeout=LOOK_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if busy.look(now):
                last = now
            if now >= started + timeout_s if timeout_s is not None else \
                    (now >= last + idle_timeout_s or now >= started + cap_s):
                end([*descendants(proc.pid, living()), proc.pid])
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(command, now - started, out, err)
    end(in_session(proc.pid))
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
