"""Suite-wide settings and guards: the test flag daemons read, hypothesis without per-example
deadlines, a last-resort watchdog per test, the ``processes`` fixture, and the check that fails the
run when a process it started is still running at its end (listed, then killed)."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from gossamer_harness.leftovers import OWNER_ENV, RUN_ENV, end, left_running
from gossamer_harness.localproc import Processes

os.environ.setdefault("GOSSAMER_TEST", "1")

from hypothesis import settings

# No timing assertions in unit tests: hypothesis's per-example deadline fails on a busy machine.
settings.register_profile("gossamer", deadline=None)
settings.load_profile("gossamer")

WATCHDOG_GRACE_S = float(os.environ.get("GOSSAMER_TEST_WATCHDOG_GRACE_S", "120"))


class Watchdog:
    """One daemon thread; ``arm`` sets the deadline of the running test, ``disarm`` clears it.

    pytest-timeout fails a test at its limit by raising in the main thread; if the test's teardown
    then hangs too (an event loop that never finishes cancelling its tasks), nothing fires again
    and the whole run waits for ever (CI once waited 90 minutes). The watchdog writes every
    thread's stack to stderr, kills the processes this process started, and ends it
    ``WATCHDOG_GRACE_S`` after the test's limit, so the run stops with a report naming the test
    (``scripts/test`` runs pytest-xdist with ``--max-worker-restart 0``). pytest's own
    faulthandler timer cannot do this: pytest cancels it as soon as a test fails."""

    def __init__(self, stderr_fd: int) -> None:
        self._fd = stderr_fd
        self._changed = threading.Condition()
        self._deadline: float | None = None
        self._test = ""
        threading.Thread(target=self._watch, name="test-watchdog", daemon=True).start()

    def arm(self, seconds: float, test: str) -> None:
        with self._changed:
            self._deadline, self._test = time.monotonic() + seconds, test
            self._changed.notify()

    def disarm(self) -> None:
        with self._changed:
            self._deadline = None
            self._changed.notify()

    def _watch(self) -> None:
        with self._changed:
            while self._deadline is None or time.monotonic() < self._deadline:
                self._changed.wait(None if self._deadline is None else self._deadline - time.monotonic())
            test = self._test
        os.write(self._fd, f"\n\nwatchdog: {test} is still running {WATCHDOG_GRACE_S:.0f} s past its "
                           f"timeout; every thread's stack, then this process ends:\n".encode())
        faulthandler.dump_traceback(file=self._fd, all_threads=True)
        mine = left_running(run_id=os.environ.get(RUN_ENV), owner=os.getpid(), under=os.getpid())
        for leftover in mine:
            os.write(self._fd, f"watchdog: killing {leftover.line()}\n".encode())
        end(leftover.pid for leftover in mine)
        os._exit(70)


watchdog_key = pytest.StashKey[Watchdog]()
run_id_key = pytest.StashKey[str]()
leftovers_key = pytest.StashKey[list[str]]()
WORKER_LEFTOVERS = "gossamer_leftovers"  # an xdist worker's leftovers, sent to the controller


def distributing(config: pytest.Config) -> bool:
    """Whether this is the controller of xdist workers (it runs no test itself)."""
    return not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no" \
        and bool(config.getoption("tx", None)) and not config.getoption("collectonly")


def pytest_configure(config: pytest.Config) -> None:
    stderr = sys.__stderr__
    assert stderr is not None
    config.stash[watchdog_key] = Watchdog(os.dup(stderr.fileno()))
    # The run's id marks every process it starts (inherited through the environment). A controller
    # of workers keeps it out of its own environment, so the workers it starts are not marked.
    workerinput = getattr(config, "workerinput", None)
    config.stash[run_id_key] = workerinput[RUN_ENV] if workerinput is not None else uuid.uuid4().hex
    config.stash[leftovers_key] = []
    if not distributing(config):
        os.environ[RUN_ENV], os.environ[OWNER_ENV] = config.stash[run_id_key], str(os.getpid())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: each worker gets the run's id."""
    node.workerinput[RUN_ENV] = node.config.stash[run_id_key]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist: what a worker found left running at its end."""
    node.config.stash[leftovers_key].extend(getattr(node, "workeroutput", {}).get(WORKER_LEFTOVERS, []))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every process the run started must have ended with its test: those still running are
    listed, killed, and the run fails. A worker looks below itself (and reports to the controller);
    the controller looks for the run's mark too, which outlives a parent that died."""
    config = session.config
    if hasattr(config, "workerinput"):
        found = left_running(run_id=config.stash[run_id_key], owner=os.getpid(), under=os.getpid())
        config.workeroutput[WORKER_LEFTOVERS] = [leftover.line() for leftover in found]  # type: ignore[attr-defined]
    else:
        found = left_running(run_id=config.stash[run_id_key], under=None if distributing(config) else os.getpid())
        config.stash[leftovers_key].extend(leftover.line() for leftover in found)
        if config.stash[leftovers_key] and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    end(leftover.pid for leftover in found)


def pytest_terminal_summary(terminalreporter) -> None:
    lines = terminalreporter.config.stash.get(leftovers_key, [])
    if lines:
        terminalreporter.section("processes left running (killed now; the run fails)", sep="=", red=True)
        for line in lines:
            terminalreporter.line(line, red=True)


@pytest.fixture
def processes() -> Iterator[Processes]:
    """The processes a test starts (``processes.start(args, log_path=...)``): each ends with the
    test, passed or failed, with everything it started."""
    with Processes() as started:
        yield started


def limit_s_of(item: pytest.Item) -> float:
    """The pytest-timeout limit that applies to ``item`` (its marker, else the ini value)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    return float(item.config.getini("timeout") or 0.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    limit = limit_s_of(item)
    watchdog = item.config.stash[watchdog_key]
    if limit > 0:
        watchdog.arm(limit + WATCHDOG_GRACE_S, item.nodeid)
    try:
        yield
    finally:
        watchdog.disarm()
