"""Deadline-bounded waits on an ``asyncio.Condition`` that always give its lock back.

The wait stays in the calling task (``asyncio.timeout``). ``asyncio.wait_for`` around ``cond.wait_for``
runs it in a second task instead: when the caller is cancelled twice (a role stopped, then its
event loop torn down), the caller leaves without waiting for that task, which later takes the
lock back and finishes holding it; every other waiter on the condition then hangs for good. A
FoMoE test's teardown hung for an hour that way, four roles sharing one view condition.
"""

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
