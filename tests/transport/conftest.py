"""Fixtures shared by the TCP transport tests: leak checks, a server/client harness, log waiters."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from tests.transport.support import LeakCheck, LogWaiter, TcpNet, log_waiters


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    """Fail the test if it leaves tasks running or file descriptors open."""
    check = LeakCheck()
    yield
    check.verify()


@pytest.fixture
async def net(no_leaks: None) -> AsyncIterator[TcpNet]:
    net = TcpNet()
    yield net
    await net.aclose()


@pytest.fixture
def server_log() -> Iterator[Callable[[str], LogWaiter]]:
    """``server_log(needle)`` returns a LogWaiter attached to the server's logger."""
    with log_waiters("gossamer.transport.tcp_server") as attach:
        yield attach
