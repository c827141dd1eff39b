"""``Inbox``: contributions other peers sent, per (kind, round, sender), bounded in rounds, senders
and bytes, with room reserved for the senders that count (``priority``); waiters wake on every
arrival and give up at their deadline (README.md of peer, "kit.inbox")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import torch

from gossamer.peer.kit.conditions import wait_until

Tensors = dict[str, torch.Tensor]
T = TypeVar("T")


def size_bytes(tensors: Tensors) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())


class Inbox(Generic[T]):
    """Bounded store of received contributions (tensors, or whatever a role stores per message,
    with its size given) with deadline-bounded waiting."""

    def __init__(self, *, window_rounds: int = 2, max_senders: int = 256, max_bytes: int | None = None,
                 reserved_fraction: float = 0.5) -> None:
        if not 0.0 <= reserved_fraction < 1.0:
            raise ValueError(f"reserved_fraction must be in [0, 1), got {reserved_fraction!r}")
        self._window = window_rounds
        self._max_senders = max_senders
        self.max_bytes = max_bytes
        self._reserved_fraction = reserved_fraction
        self._current = 0
        self._items: dict[tuple[str, int], dict[str, T]] = {}
        self._refused: dict[tuple[str, int], dict[str, str]] = {}
        self._sizes: dict[tuple[str, int, str], tuple[int, bool]] = {}  # (kind, round, sender) -> (bytes, priority)
        self._changed = asyncio.Condition()

    @property
    def window_rounds(self) -> int:
        return self._window

    @property
    def held_bytes(self) -> int:
        return sum(size for size, _priority in self._sizes.values())

    def refusal(self, kind: str, round: int, sender: str, *, size: int = 0, priority: bool = True) -> str | None:
        """Why a contribution would be refused now, or None if it would be accepted."""
        if round < self._current:
            return f"stale round {round} (at {self._current})"
        if round > self._current + self._window:
            return f"round {round} is too far ahead (at {self._current})"
        box = self._items.get((kind, round), {})
        if sender in box:
            return f"duplicate {kind} for round {round}"
        if len(box) >= self._max_senders:
            return f"too many {kind} contributions for round {round}"
        if self.max_bytes is not None:
            held = self.held_bytes if priority else sum(s for s, p in self._sizes.values() if not p)
            limit = self.max_bytes if priority else int(self.max_bytes * (1.0 - self._reserved_fraction))
            if held + size > limit:
                return f"inbox full ({held} of {limit} bytes held{'' if priority else ' for new senders'})"
        return None

    async def put(self, kind: str, round: int, sender: str, tensors: T, *, priority: bool = True,
                  size: int | None = None) -> str | None:
        """Store a contribution; returns the refusal reason instead when it is not accepted."""
        if size is None:  # a dict of tensors by default; a role storing something else gives its size
            size = size_bytes(tensors) if isinstance(tensors, dict) else 0
        reason = self.refusal(kind, round, sender, size=size, priority=priority)
        if reason is not None:
            return reason
        self._items.setdefault((kind, round), {})[sender] = tensors
        self._sizes[kind, round, sender] = (size, priority)
        async with self._changed:
            self._changed.notify_all()
        return None

    def note_refusal(self, kind: str, round: int, sender: str, reason: str) -> None:
        """Remember why ``sender``'s contribution for (kind, round) was turned away (by ``put``
        or by the role's own checks), for the round's ledger; one reason per sender is kept."""
        if not self._current <= round <= self._current + self._window:
            return  # a round nobody will settle: nothing to remember
        box = self._refused.setdefault((kind, round), {})
        if sender in box or len(box) < self._max_senders:
            box[sender] = reason[:200]

    def refused(self, kind: str, round: int) -> dict[str, str]:
        """Sender -> why, for the contributions to (kind, round) that were turned away."""
        return dict(self._refused.get((kind, round), {}))

    def senders(self, kind: str, round: int) -> frozenset[str]:
        """Who has sent for (kind, round) so far."""
        return frozenset(self._items.get((kind, round), {}))

    async def collect(self, kind: str, round: int, senders: Iterable[str], *, timeout_s: float,
                      wait_for: Iterable[str] | Callable[[], Iterable[str]] | None = None) -> dict[str, T]:
        """What ``senders`` sent for (kind, round), waiting until all of ``wait_for`` (all of
        ``senders`` when None; a callable is asked again at every ``wake`` and arrival, so a sender
        known to be gone can be dropped from it) arrived or ``timeout_s`` passed."""
        senders = set(senders)

        def have_all() -> bool:
            wanted = senders if wait_for is None else set(wait_for() if callable(wait_for) else wait_for)
            return wanted <= self._items.get((kind, round), {}).keys()

        if not have_all():
            await wait_until(self._changed, have_all, timeout_s=timeout_s)
        box = self._items.get((kind, round), {})
        return {sender: box[sender] for sender in senders if sender in box}

    async def wake(self) -> None:
        """Have every waiting ``collect`` ask its ``wait_for`` again (something outside changed)."""
        async with self._changed:
            self._changed.notify_all()

    def advance(self, current_round: int) -> None:
        """Move to ``current_round`` and forget everything older."""
        self._current = current_round
        for store in (self._items, self._refused):
            for key in [key for key in store if key[1] < current_round]:
                del store[key]
        for key in [key for key in self._sizes if key[1] < current_round]:
            del self._sizes[key]

