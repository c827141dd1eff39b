"""Suite-wide settings: the test flag daemons read, hypothesis without per-example deadlines, and a
last-resort watchdog per test.

pytest-timeout fails a test at its limit by raising in the main thread; if the test's teardown
then hangs too (an event loop that never finishes cancelling its tasks), nothing fires again and
the whole run waits for ever (CI once waited 90 minutes). The watchdog writes every thread's stack
to stderr and ends the process ``WATCHDOG_GRACE_S`` after the test's limit, so the run stops with
a report naming the test (``scripts/test`` runs pytest-xdist with ``--max-worker-restart 0``).
pytest's own faulthandler timer cannot do this: pytest cancels it as soon as a test fails."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import pytest

os.environ.setdefault("GOSSAMER_TEST", "1")

from hypothesis import settings

# No timing assertions in unit tests: hypothesis's per-example deadline fails on a busy machine.
settings.register_profile("gossamer", deadline=None)
settings.load_profile("gossamer")

WATCHDOG_GRACE_S = float(os.environ.get("GOSSAMER_TEST_WATCHDOG_GRACE_S", "120"))


class Watchdog:
    """One daemon thread; ``arm`` sets the deadline of the running test, ``disarm`` clears it."""

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
        os._exit(70)


watchdog_key = pytest.StashKey[Watchdog]()


def pytest_configure(config: pytest.Config) -> None:
    stderr = sys.__stderr__
    assert stderr is not None
    config.stash[watchdog_key] = Watchdog(os.dup(stderr.fileno()))


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
