"""The inbox's waits: a collect waits only for ``wait_for`` (asked again on ``wake``, so a sender
known to be gone stops holding it) and returns everything its senders sent."""

from __future__ import annotations

import asyncio

import torch

from gossamer.peer.kit.inbox import Inbox

PART = {"w": torch.zeros(2)}


async def test_collect_waits_for_wait_for_only_and_returns_every_sender_that_sent() -> None:
    inbox = Inbox()
    await inbox.put("pgrad", 0, "slow", PART)
    waiting = {"a", "b"}
    collecting = asyncio.create_task(inbox.collect("pgrad", 0, ["a", "b", "slow"], timeout_s=600,
                                                   wait_for=lambda: sorted(waiting)))
    await inbox.put("pgrad", 0, "a", PART)
    assert not collecting.done()
    waiting.discard("b")  # b's record left the view
    await inbox.wake()

    assert sorted(await collecting) == ["a", "slow"]

