"""The processes a test run leaves running: every process the run starts carries the run's id in its
environment (``RUN_ENV``, inherited, or added by ``stamped``), so one that outlived its parent
(re-parented to PID 1) is still found by ``left_running``, beside the descendants of a live pytest
process; ``end`` kills them. Read from /proc (Linux)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gossamer.peer.processes import stat_fields

RUN_ENV = "GOSSAMER_TEST_RUN"  # the test run's unique id (tests/conftest.py sets it in every pytest process)
OWNER_ENV = "GOSSAMER_TEST_OWNER"  # the PID of the pytest process (an xdist worker, say) that started it
TEST_ENV = "PYTEST_CURRENT_TEST"  # pytest's own: the test and phase running when it was started
MARKS = (RUN_ENV, OWNER_ENV, TEST_ENV)
LIFELONG = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")  # they end with their parent
END_WAIT_S = 10.0  # how long ``end`` waits for the killed processes to be gone


@dataclass(frozen=True)
class Leftover:
    """A process still running: its PID, command line and the test that started it (as its
    environment says: ``PYTEST_CURRENT_TEST``, "" when it has none)."""

    pid: int
    command: str
    test: str

    def line(self) -> str:
        return f"pid {self.pid}, started by {self.test or 'an unknown test'}: {self.command[:300]}"


def stamped(env: Mapping[str, str] | None) -> dict[str, str] | None:
    """``env`` (None: inherit this process's, marks included) with this process's marks added."""
    if env is None:
        return None
    return {**env, **{name: os.environ[name] for name in MARKS if name in os.environ}}


def _read(pid: int, what: str) -> list[str]:
    """/proc/PID/<what> split at its NULs ([] when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


def living() -> dict[int, list[str]]:
    """Every process that is not a zombie, by PID: its /proc stat fields after the command name
    (state, ppid, pgrp, session, ...)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := stat_fields(entry)) is not None and fields[0] not in ("Z", "X"):
            table[int(entry)] = fields
    return table


def descendants(root: int, table: Mapping[int, list[str]]) -> set[int]:
    """The PIDs below ``root`` in ``table`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def in_session(session: int) -> list[int]:
    """The living processes of session ``session`` (a process started with ``start_new_session``
    leads one; what it starts stays in it unless it calls setsid itself)."""
    return [pid for pid, fields in living().items() if int(fields[3]) == session]


def environment(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with ({} when it cannot be read)."""
    return dict(item.partition("=")[::2] for item in _read(pid, "environ"))


def left_running(*, run_id: str | None, owner: int | None = None, under: int | None = None) -> list[Leftover]:
    """The living processes marked with ``run_id`` (and, with ``owner``, started by that pytest
    process), and every descendant of ``under``; never this process, and never the multiprocessing
    helpers that end with their parent."""
    table = living()
    below = descendants(under, table) if under is not None else set()
    found = []
    for pid in table:
        if pid == os.getpid():
            continue
        env = environment(pid) if run_id is not None or pid in below else {}
        marked = run_id is not None and env.get(RUN_ENV) == run_id and \
            (owner is None or env.get(OWNER_ENV) == str(owner))
        command = " ".join(_read(pid, "cmdline"))
        if (marked or pid in below) and not any(helper in command for helper in LIFELONG):
            found.append(Leftover(pid=pid, command=command, test=env.get(TEST_ENV, "")))
    return sorted(found, key=lambda leftover: leftover.pid)


def end(pids: Iterable[int], *, wait_s: float = END_WAIT_S) -> list[int]:
    """SIGKILL each of ``pids`` and wait (up to ``wait_s``) until they are gone; the ones still there."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass
    deadline = time.monotonic() + wait_s
    while (alive := [pid for pid in pids if pid in living()]) and time.monotonic() < deadline:
        time.sleep(0.05)  # a killed process is gone once its parent (or init) has reaped it
    return alive
