"""What a relay lets strangers hold, decided without I/O: ``Unproven`` counts connections that have
not yet proven anything (a control connection before its allocation, an attach connection before
its line) per address and in all, and ``Deadlines`` says which of them waited too long."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass


class Unproven:
    """At most ``per_address`` connections per address key and ``total`` in all."""

    def __init__(self, *, per_address: int, total: int) -> None:
        for name, value in (("per_address", per_address), ("total", total)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.per_address, self.total = per_address, total
        self._held: dict[str, int] = {}
        self.held = 0

    def take(self, key: str) -> bool:
        """Count one more from ``key``; False (nothing counted) at either cap."""
        if self.held >= self.total or self._held.get(key, 0) >= self.per_address:
            return False
        self._held[key] = self._held.get(key, 0) + 1
        self.held += 1
        return True

    def give(self, key: str) -> None:
        left = self._held.get(key, 0) - 1
        if left < 0:
            return
        if left:
            self._held[key] = left
        else:
            del self._held[key]
        self.held -= 1

    def of(self, key: str) -> int:
        return self._held.get(key, 0)


def once(action: Callable[[], None]) -> Callable[[], None]:
    """``action``, done on the first call only (a slot given back twice would be counted twice)."""
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            action()
    return call


@dataclass
class _Entry:
    since: float
    close: Callable[[], None]


class Deadlines:
    """Things that must be done within ``timeout_s`` of their start on ``clock``; ``expired`` closes
    (and forgets) those past it."""

    def __init__(self, timeout_s: float, *, clock: Callable[[], float]) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._clock = clock
        self._entries: dict[Hashable, _Entry] = {}

    def start(self, key: Hashable, close: Callable[[], None]) -> None:
        self._entries[key] = _Entry(self._clock(), close)

    def done(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def expire(self) -> int:
        """Close everything past its deadline; how many."""
        now = self._clock()
        late = [key for key, entry in self._entries.items() if now - entry.since >= self.timeout_s]
        for key in late:
            self._entries.pop(key).close()
        return len(late)

    def __len__(self) -> int:
        return len(self._entries)
