"""``collect_from_live``: a wait for the round's messages ends as soon as every awaited sender has
sent or has left the live view, and returns what every sender of interest sent."""

from __future__ import annotations

import asyncio

import torch

from gossamer.peer.kit.conditions import wait_notified, wait_until
from gossamer.peer.kit.inbox import Inbox
from gossamer.peer.kit.rounds import collect_from_live


class View:
    """Who is live, and a condition notified whenever that changes (as a view refresh is)."""

    def __init__(self, live: set[str]) -> None:
        self.live, self.refreshed = live, asyncio.Condition()

    async def until_view(self, predicate, *, timeout_s: float) -> bool:
        return await wait_until(self.refreshed, predicate, timeout_s=timeout_s)

    async def leave(self, peer: str) -> None:
        self.live.discard(peer)
        async with self.refreshed:
            self.refreshed.notify_all()


def tensors(value: float) -> dict[str, torch.Tensor]:
    return {"x": torch.full((2,), value)}


async def collecting(inbox: Inbox, view: View, **kwargs) -> asyncio.Task:
    task = asyncio.create_task(collect_from_live(inbox, "pgrad", 0, ["a", "b", "c"], timeout_s=600,
                                                 is_live=lambda s: s in view.live, until_view=view.until_view,
                                                 **kwargs))
    for _ in range(10):  # let it reach its wait (passes of the loop, not time)
        await asyncio.sleep(0)
    assert not task.done()
    return task


async def test_a_sender_that_leaves_the_view_is_no_longer_waited_for() -> None:
    inbox: Inbox = Inbox()
    view = View({"a", "b", "c"})
    task = await collecting(inbox, view)
    await inbox.put("pgrad", 0, "a", tensors(1.0))
    await inbox.put("pgrad", 0, "c", tensors(3.0))
    await view.leave("b")  # b crashed: its record expired
    got = await task
    assert sorted(got) == ["a", "c"] and torch.equal(got["c"]["x"], tensors(3.0)["x"])


async def test_only_wait_for_is_awaited_and_every_sender_that_sent_is_returned() -> None:
    inbox: Inbox = Inbox()
    view = View({"a", "b", "c"})
    await inbox.put("pgrad", 0, "c", tensors(3.0))  # c is not awaited, but what it sent counts
    task = await collecting(inbox, view, wait_for=["a"])
    await inbox.put("pgrad", 0, "a", tensors(1.0))
    assert sorted(await task) == ["a", "c"]


async def test_at_the_deadline_it_returns_what_came() -> None:
    inbox: Inbox = Inbox()
    view = View({"a", "b"})
    await inbox.put("pgrad", 0, "a", tensors(1.0))
    got = await collect_from_live(inbox, "pgrad", 0, ["a", "b"], timeout_s=0.0, is_live=lambda s: s in view.live,
                                  until_view=view.until_view)
    assert sorted(got) == ["a"]
    assert await wait_notified(view.refreshed, timeout_s=0.0) is False  # nothing left holding the condition
