"""How the TL++ orchestrator times its requests: ``paced`` runs a phase's requests to the nodes
together and cuts the late ones at the adaptive deadline (``core.pacing.NodePacing``), and
``within`` / ``request`` time one request, giving a deadline this process slept through (a
stopped process, a suspended VM) once more."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gossamer.peer.kit.secure_link import LinkMessage, SecureLinkError, SecureLinks
from gossamer.protocols.tlpp.core.pacing import NodePacing

T = TypeVar("T")
STALL_S = 1.0
"""A deadline's timer firing this much late means this process did not run (``within``)."""
BACKSTOP_S = 3600.0
"""The transport's own deadline under ``request``: only a stop this long mid-request outlasts ``within``."""


@dataclass
class Paced(Generic[T]):
    """A phase's outcome: each node's answer or exception (for one cut, a ``SecureLinkError`` that
    says it was late: its request was cancelled, its link closed), the time each call that ended
    by itself took, and how long each cut one had run."""

    results: dict[str, T | BaseException] = field(default_factory=dict)
    took_s: dict[str, float] = field(default_factory=dict)
    cut_s: dict[str, float] = field(default_factory=dict)

    def answered_s(self) -> dict[str, float]:
        """The time of each node that answered (neither cut nor failed)."""
        return {node: seconds for node, seconds in self.took_s.items()
                if node not in self.cut_s and not isinstance(self.results.get(node), BaseException)}


async def paced(calls: Mapping[str, Awaitable[T]], cutoff_s: float | None) -> Paced[T]:
    """Run one phase's calls together. With ``cutoff_s``, once it has passed and at least one call
    has answered (not failed), the calls still running are cancelled and answered as late;
    when none has answered by then, every call runs to its own end (its own timeout)."""
    started = time.monotonic()
    out: Paced[T] = Paced()

    async def timed(node: str, call: Awaitable[T]) -> T:
        try:
            return await call
        finally:
            out.took_s[node] = time.monotonic() - started

    tasks = {node: asyncio.ensure_future(timed(node, call)) for node, call in calls.items()}
    try:
        if tasks and cutoff_s is not None:
            done, pending = await asyncio.wait(tasks.values(), timeout=cutoff_s)
            if pending and any(task.exception() is None for task in done):
                for node, task in tasks.items():
                    if not task.done():
                        task.cancel()
                        out.cut_s[node] = time.monotonic() - started
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    finally:
        running = [task for task in tasks.values() if not task.done()]
        for task in running:  # we were cancelled ourselves: so are the calls
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    for node, task in tasks.items():
        if node in out.cut_s:
            out.took_s.pop(node, None)
            out.results[node] = SecureLinkError(
                f"late: no answer within the adaptive deadline of {cutoff_s:.2f} s (others answered; "
                "hyper.pacing = \"adaptive\")")
        elif task.exception() is not None:
            out.results[node] = task.exception()  # type: ignore[assignment]
        else:
            out.results[node] = task.result()
    return out


async def run_phase(pacing: NodePacing, phase: str, calls: Mapping[str, Awaitable[T]]) -> dict[str, T | BaseException]:
    """One phase's requests to the nodes, paced and measured: each node's answer or exception."""
    outcome = await paced(calls, pacing.cutoff_s(phase))
    pacing.record(phase, answered=outcome.answered_s(), cut=outcome.cut_s)
    return outcome.results


async def within(call: Awaitable[T], timeout_s: float) -> T:
    """``call``'s result, or TimeoutError once it ran ``timeout_s``; a deadline this process slept
    through (its timer ran over ``STALL_S`` late) is given once more: the answer may sit unread in
    a socket, and the time this process did not run is not the peer's."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call)
    try:
        for _ in range(2):
            due = loop.time() + timeout_s
            done, _pending = await asyncio.wait({task}, timeout=timeout_s)
            if done:
                return task.result()
            if loop.time() - due <= STALL_S:
                break
        raise TimeoutError(f"no response within {timeout_s} s")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def request(links: SecureLinks, peer: str, method: str, message: LinkMessage, *, timeout_s: float) -> LinkMessage:
    """``links.request`` timed by ``within``; SecureLinkError when it runs out (its link closed)."""
    try:
        return await within(links.request(peer, method, message, timeout_s=BACKSTOP_S), timeout_s)
    except TimeoutError as exc:
        raise SecureLinkError(f"link to peer {peer[:12]} failed during {message.op!r} (step {message.step}): "
                              f"{exc}") from None
