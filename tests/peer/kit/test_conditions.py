"""Deadline-bounded condition waits: the answer at a notification and at the deadline, and a waiter
cancelled twice (a role stopped, then its loop torn down) gives the lock back, so the next waiter
is woken (with ``asyncio.wait_for`` around ``Condition.wait_for`` the lock stayed taken)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from gossamer.peer.kit.conditions import wait_notified, wait_until


async def started(tasks: list[asyncio.Task], condition: asyncio.Condition) -> None:
    """Let every task reach its wait (each needs a few passes of the loop, none needs time)."""
    for _ in range(10):
        await asyncio.sleep(0)
    async with condition:  # the lock is free again once they all wait
        pass
    assert not any(task.done() for task in tasks)


async def test_wait_until_returns_true_once_the_predicate_holds_after_a_notification() -> None:
    condition, state = asyncio.Condition(), {"ready": False}
    waiter = asyncio.create_task(wait_until(condition, lambda: state["ready"], timeout_s=600))
    await started([waiter], condition)
    async with condition:
        condition.notify_all()  # not ready yet: it goes on waiting
    await started([waiter], condition)
    state["ready"] = True
    async with condition:
        condition.notify_all()
    assert await waiter is True


async def test_at_the_deadline_the_answer_is_whether_the_predicate_holds_then() -> None:
    condition = asyncio.Condition()
    assert await wait_until(condition, lambda: False, timeout_s=0.0) is False
    assert await wait_until(condition, lambda: True, timeout_s=0.0) is True
    assert await wait_notified(condition, timeout_s=0.0) is False
    assert not condition.locked()


async def test_wait_notified_returns_true_on_a_notification() -> None:
    condition = asyncio.Condition()
    waiter = asyncio.create_task(wait_notified(condition, timeout_s=600))
    await started([waiter], condition)
    async with condition:
        condition.notify_all()
    assert await waiter is True


async def test_waiters_cancelled_twice_give_the_lock_back_and_the_next_waiter_is_woken() -> None:
    condition, state = asyncio.Condition(), {"ready": False}
    waiters = [asyncio.create_task(wait_until(condition, lambda: False, timeout_s=600)) for _ in range(3)]
    waiters.append(asyncio.create_task(wait_notified(condition, timeout_s=600)))
    await started(waiters, condition)
    for task in waiters:
        task.cancel()
    await asyncio.sleep(0)  # the first cancellation is under way
    for task in waiters:
        task.cancel()
    results = await asyncio.gather(*waiters, return_exceptions=True)

    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert not condition.locked()
    later = asyncio.create_task(wait_until(condition, lambda: state["ready"], timeout_s=600))
    await started([later], condition)
    state["ready"] = True
    async with condition:
        condition.notify_all()
    assert await later is True


def test_no_condition_wait_runs_in_a_second_task_under_asyncio_wait_for() -> None:
    """The pattern that hung: ``asyncio.wait_for(condition.wait_for(...))`` anywhere in the code."""
    root = Path(__file__).resolve().parents[3]
    pattern = re.compile(r"asyncio\.wait_for\(\s*[\w.]*\.wait_for\(")
    found = [f"{path.relative_to(root)}:{text[:match.start()].count(chr(10)) + 1}"
             for folder in ("peer", "transport", "protocols", "crypto", "scripts")
             for path in sorted((root / folder).rglob("*.py"))
             for text in [path.read_text(encoding="utf-8")]
             for match in pattern.finditer(text)]
    assert found == [], f"use gossamer.peer.kit.conditions.wait_until instead: {found}"


def test_no_asyncio_wait_for_in_the_library() -> None:
    """Python 3.11's ``asyncio.wait_for`` can drop a cancellation that arrives as its awaitable
    completes; a WAN proxy relay went on into an hour of latency that way and held ``aclose`` for
    good. The library waits under ``asyncio.timeout`` instead (same task, cancellation kept)."""
    root = Path(__file__).resolve().parents[3]
    found = [f"{path.relative_to(root)}:{text[:match.start()].count(chr(10)) + 1}"
             for folder in ("peer", "transport", "protocols", "crypto")
             for path in sorted((root / folder).rglob("*.py"))
             for text in [path.read_text(encoding="utf-8")]
             for match in re.finditer(r"asyncio\.wait_for\(", text)]
    assert found == [], f"use asyncio.timeout instead: {found}"
