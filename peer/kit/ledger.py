"""Per-round accounting: who was expected, who arrived, who was rejected (and why), who timed out.

Nothing is silently partial: every expected contribution of a round ends in exactly one of
arrived (and then used or rejected) or timed out, and the ledger says which.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ExchangeLedger:
    """One exchange (parameter mix or pseudo-gradient mix) of one round."""

    expected: list[str] = field(default_factory=list)
    arrived: list[str] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    timed_out: list[str] = field(default_factory=list)
    send_failures: dict[str, str] = field(default_factory=dict)

    def settle(self, arrived: list[str]) -> None:
        self.arrived = sorted(arrived)
        self.timed_out = sorted(set(self.expected) - set(arrived))


@dataclass
class RoundLedger:
    """Everything that happened in one outer round of a learner."""

    round: int
    learners: list[str] = field(default_factory=list)
    params: ExchangeLedger = field(default_factory=ExchangeLedger)
    pseudo_gradients: ExchangeLedger = field(default_factory=ExchangeLedger)
    train_loss: float = float("nan")
    heldout_loss: float = float("nan")
    compute_s: float = 0.0
    wall_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LedgerHistory:
    """The last ``maxlen`` round ledgers."""

    def __init__(self, maxlen: int = 64) -> None:
        self._rounds: deque[RoundLedger] = deque(maxlen=maxlen)

    def append(self, ledger: RoundLedger) -> None:
        self._rounds.append(ledger)

    def last(self, count: int = 5) -> list[dict[str, Any]]:
        return [ledger.to_json() for ledger in list(self._rounds)[-count:]]

    def __len__(self) -> int:
        return len(self._rounds)
