"""Contributions that other peers sent us, kept per (kind, round, sender), bounded.

Only rounds in ``[current, current + window_rounds]`` are accepted (older ones are stale, newer
ones too far ahead); one contribution per sender per (kind, round); at most ``max_senders`` per
(kind, round). Waiters are woken on every arrival and give up at their deadline: a round never
waits past it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Generic, TypeVar

import torch

Tensors = dict[str, torch.Tensor]
T = TypeVar("T")


class Inbox(Generic[T]):
    """Bounded store of received contributions (tensors, or whatever a role stores per message)
    with deadline-bounded waiting."""

    def __init__(self, *, window_rounds: int = 2, max_senders: int = 256) -> None:
        self._window = window_rounds
        self._max_senders = max_senders
        self._current = 0
        self._items: dict[tuple[str, int], dict[str, T]] = {}
        self._refused: dict[tuple[str, int], dict[str, str]] = {}
        self._changed = asyncio.Condition()

    def refusal(self, kind: str, round: int, sender: str) -> str | None:
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
        return None

    async def put(self, kind: str, round: int, sender: str, tensors: T) -> str | None:
        """Store a contribution; returns the refusal reason instead when it is not accepted."""
        reason = self.refusal(kind, round, sender)
        if reason is not None:
            return reason
        self._items.setdefault((kind, round), {})[sender] = tensors
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

    async def collect(self, kind: str, round: int, senders: Iterable[str], *, timeout_s: float) -> dict[str, T]:
        """What ``senders`` sent for (kind, round), waiting until all arrived or ``timeout_s`` passed."""
        wanted = set(senders)

        def have_all() -> bool:
            return wanted <= self._items.get((kind, round), {}).keys()

        if wanted and not have_all():
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(have_all), timeout=max(0.0, timeout_s))
                except TimeoutError:
                    pass
        box = self._items.get((kind, round), {})
        return {sender: box[sender] for sender in wanted if sender in box}

    def advance(self, current_round: int) -> None:
        """Move to ``current_round`` and forget everything older."""
        self._current = current_round
        for store in (self._items, self._refused):
            for key in [key for key in store if key[1] < current_round]:
                del store[key]
