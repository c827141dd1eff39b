"""What a role that trains in rounds does on the network, whatever its protocol: sending one
signed message to each of several peers with every failure in the round's ledger (``send_each``,
``finish_sends``), and waiting for the peers' messages no longer than they can still come
(``collect_from_live``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from gossamer.peer.kit.inbox import Inbox
from gossamer.peer.kit.ledger import Exchange
from gossamer.peer.kit.messaging import SignedMessenger
from gossamer.peer.run.view import PeerView
from gossamer.transport.errors import TransportError

T = TypeVar("T")
UntilView = Callable[..., Awaitable[bool]]  # RoleContext.until_view(predicate, *, timeout_s)


async def send_each(messenger: SignedMessenger, view: PeerView, payloads: Mapping[str, Mapping[str, torch.Tensor]],
                    *, path: str, round: int, exchange: Exchange,
                    metadata: Mapping[str, dict[str, str]] | None = None) -> dict[str, int]:
    """PUT ``payloads[peer]`` (with ``metadata[peer]``, if any) to ``http://<peer's address><path>``
    for every peer, concurrently; returns the body bytes sent to each peer that took its message.
    A peer that is no longer live or whose transport failed goes to ``exchange.send_failures``
    with the reason; any other error propagates."""
    peers = list(payloads)
    results = await asyncio.gather(*(_send_one(messenger, view, peer, payloads[peer], path=path, round=round,
                                               metadata=(metadata or {}).get(peer)) for peer in peers),
                                   return_exceptions=True)
    sent: dict[str, int] = {}
    for peer, result in zip(peers, results, strict=True):
        if isinstance(result, int):
            sent[peer] = result
        elif isinstance(result, TransportError | LookupError):
            exchange.send_failures[peer] = str(result)[:200]
        elif isinstance(result, BaseException):
            raise result
    return sent


async def _send_one(messenger: SignedMessenger, view: PeerView, peer: str, tensors: Mapping[str, torch.Tensor], *,
                    path: str, round: int, metadata: dict[str, str] | None) -> int:
    live = view.get(peer)
    if live is None:
        raise LookupError(f"{peer[:12]} is no longer live")
    url = f"http://{live.record.http_addr}{path}"
    return await messenger.send(url, recipient=peer, round=round, tensors=tensors, metadata=metadata)


async def finish_sends(sending: Iterable[asyncio.Task[Any]], *, timeout_s: float) -> None:
    """Let the round's sends finish for at most ``timeout_s``, cancel the rest, and re-raise what
    a finished one raised."""
    tasks = list(sending)
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()


async def collect_from_live(inbox: Inbox[T], kind: str, round: int, senders: Iterable[str], *, timeout_s: float,
                            is_live: Callable[[str], bool], until_view: UntilView,
                            wait_for: Iterable[str] | None = None) -> dict[str, T]:
    """What ``senders`` sent for (kind, round): waits until each of ``wait_for`` (all of
    ``senders`` when None) has sent or has left the live view (a killed peer's record expires),
    or ``timeout_s`` passed, whichever comes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    senders = set(senders)
    wanted = senders if wait_for is None else set(wait_for)
    while True:
        live = {sender for sender in wanted if is_live(sender)}
        remaining = deadline - loop.time()
        if live <= inbox.senders(kind, round) or remaining <= 0:
            break
        waiters = [asyncio.create_task(inbox.collect(kind, round, live, timeout_s=remaining)),
                   asyncio.create_task(until_view(lambda live=live: {s for s in wanted if is_live(s)} != live,
                                                  timeout_s=remaining))]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
    return await inbox.collect(kind, round, senders, timeout_s=0.0)
