"""Deadline-bounded waits on an ``asyncio.Condition`` that always give its lock back: the wait stays
in the calling task (``asyncio.timeout``), never in a second task that a twice-cancelled caller
would leave holding the lock (README.md of peer, "kit.conditions")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_until(condition: asyncio.Condition, predicate: Callable[[], object], *, timeout_s: float) -> bool:
    """Wait until ``predicate()`` holds after a notification (or already holds); at the timeout,
    whether it holds then."""
    async with condition:
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await condition.wait_for(predicate)
        except TimeoutError:
            return bool(predicate())
    return True


async def wait_notified(condition: asyncio.Condition, *, timeout_s: float) -> bool:
    """Wait for the next notification; False if none came within ``timeout_s``."""
    async with condition:
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await condition.wait()
        except TimeoutError:
            return False
    return True
