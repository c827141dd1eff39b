"""Cancelling a peer's background tasks within a bound: each is cancelled, and the caller goes on after
``timeout_s`` even if one has not finished, naming those left in the log (a DHT store under way
once held a clean shutdown past its 20 s)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)
SETTLE_S = 5.0


async def cancel_all(tasks: Iterable[asyncio.Task], *, what: str, timeout_s: float = SETTLE_S) -> list[asyncio.Task]:
    """Cancel ``tasks`` and wait at most ``timeout_s`` for them to end; the ones still running."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    if not tasks:
        return []
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:  # retrieved, so none is reported as "never retrieved"
        if not task.cancelled():
            task.exception()
    if pending:
        log.warning("%s: %d task(s) still stopping %.0f s after being cancelled (%s); going on without them",
                    what, len(pending), timeout_s, ", ".join(sorted(task.get_name() for task in pending)))
    return list(pending)
