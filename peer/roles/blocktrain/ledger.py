"""Per-version accounting of the block coordinator: every update is used, rejected with a reason
(stale, malformed, too large, duplicate) or, for a worker that was expected and never sent one,
timed out. A stale update (trained from a version that has since closed) lands in the ledger of
the version it was trained from, so nothing is silently dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class VersionLedger:
    """What happened to block ``block`` while ``version`` was its current version.

    ``expected`` are the workers assigned to the block at any time while the version was open;
    ``closed`` says whether the version has been superseded (``next_version`` exists).
    """

    block: int
    version: int
    opened_at: float
    expected: list[str] = field(default_factory=list)
    arrived: list[str] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    timed_out: list[str] = field(default_factory=list)
    closed: bool = False
    closed_at: float | None = None
    deadline_extensions: int = 0
    train_loss: float | None = None
    update_norm: float | None = None

    def expect(self, workers: list[str]) -> None:
        """Add workers assigned to the block while this version is open."""
        self.expected = sorted(set(self.expected) | set(workers))

    def reject(self, sender: str, reason: str) -> None:
        self.rejected[sender] = reason

    def close(self, *, used: list[str], now: float) -> None:
        """Seal the version: ``used`` updates went into the next one; expected silent workers timed out."""
        self.used = sorted(used)
        self.closed, self.closed_at = True, now
        heard = set(self.arrived) | set(self.rejected)
        self.timed_out = sorted(set(self.expected) - heard)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LedgerBook:
    """Ledgers by (block, version), the ``maxlen`` most recent ones kept."""

    def __init__(self, maxlen: int = 256) -> None:
        self._maxlen = maxlen
        self._ledgers: OrderedDict[tuple[int, int], VersionLedger] = OrderedDict()

    def open(self, block: int, version: int, *, now: float) -> VersionLedger:
        ledger = VersionLedger(block=block, version=version, opened_at=now)
        self._ledgers[(block, version)] = ledger
        while len(self._ledgers) > self._maxlen:
            self._ledgers.popitem(last=False)
        return ledger

    def get(self, block: int, version: int) -> VersionLedger | None:
        return self._ledgers.get((block, version))

    def recent(self, count: int = 8) -> list[dict[str, Any]]:
        return [ledger.to_json() for ledger in list(self._ledgers.values())[-count:]]
