"""What a long run must keep flat is measured from the process itself: asyncio tasks, open file
descriptors, resident memory and threads move when the process really gains or drops them."""

from __future__ import annotations

import asyncio
import os

from gossamer.peer.metrics import process_usage


async def test_process_usage_follows_tasks_and_file_descriptors() -> None:
    before = process_usage()
    release = asyncio.Event()
    tasks = [asyncio.create_task(release.wait()) for _ in range(5)]
    read_end, write_end = os.pipe()
    try:
        during = process_usage()
    finally:
        release.set()
        await asyncio.gather(*tasks)
        os.close(read_end)
        os.close(write_end)
    after = process_usage()

    assert during["asyncio_tasks"] == before["asyncio_tasks"] + 5 and after["asyncio_tasks"] == before["asyncio_tasks"]
    assert during["open_fds"] == before["open_fds"] + 2 and after["open_fds"] == before["open_fds"]
    assert before["rss_bytes"] > 0 and before["threads"] >= 1
