"""``cancel_all``: tasks that end when cancelled are waited for; one that does not end is left
after the bound and named, so a shutdown goes on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gossamer.peer.cancellation import cancel_all


async def test_cancelled_tasks_are_waited_for_and_their_errors_retrieved() -> None:
    async def failing() -> None:
        raise RuntimeError("boom")

    sleeper = asyncio.create_task(asyncio.Event().wait(), name="sleeper")
    failed = asyncio.create_task(failing(), name="failed")
    await asyncio.sleep(0)
    assert await cancel_all([sleeper, failed], what="test", timeout_s=600) == []
    assert sleeper.cancelled() and failed.done()


async def test_a_task_that_will_not_stop_is_left_after_the_bound_and_named(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await release.wait()  # ignores its cancellation until released

    task = asyncio.create_task(stubborn(), name="stubborn-lookup")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="gossamer.peer.cancellation"):
        left = await cancel_all([task], what="daemon", timeout_s=0.01)
    assert left == [task] and not task.done()
    assert "daemon: 1 task(s) still stopping" in caplog.text and "stubborn-lookup" in caplog.text
    release.set()
    await task


async def test_no_tasks_is_nothing_to_wait_for() -> None:
    assert await cancel_all([], what="test") == []
