"""Accounting for every round of every protocol (``Exchange``) and a bounded ``History``: once
settled, every expected peer is in exactly one of ``used``, ``rejected`` (with the reason) or
``timed_out``; ``balance_problems`` says what breaks that (README.md of peer, "kit.ledger")."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar


@dataclass
class Exchange:
    """One exchange of one round: the peers expected to contribute and what became of each."""

    expected: list[str] = field(default_factory=list)
    arrived: list[str] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # peer -> why
    timed_out: list[str] = field(default_factory=list)
    send_failures: dict[str, str] = field(default_factory=dict)  # our own sends to peers that failed, and why

    def expect(self, peers: Iterable[str]) -> None:
        """Add peers expected to contribute (while the round is open)."""
        self.expected = sorted(set(self.expected) | set(peers))

    def arrive(self, peer: str) -> None:
        if peer not in self.arrived:
            self.arrived = sorted([*self.arrived, peer])

    def reject(self, peer: str, reason: str) -> None:
        """``peer``'s contribution is refused, with ``reason``; it is not used."""
        self.rejected[peer] = reason
        self.used = [p for p in self.used if p != peer]

    def use(self, peers: Iterable[str]) -> None:
        self.used = sorted(set(peers) - set(self.rejected))

    def settle(self, arrived: Iterable[str] | None = None, *, refused: Mapping[str, str] | None = None) -> None:
        """Close the exchange: ``arrived`` (if given) is what came in time; ``refused`` (peer -> why)
        the contributions of expected peers that were turned away when they came (e.g. by an
        inbox); every expected peer neither heard from nor refused timed out."""
        if arrived is not None:
            self.arrived = sorted(set(arrived))
        expected = set(self.expected)
        self.rejected.update({peer: why for peer, why in (refused or {}).items()
                              if peer in expected and peer not in self.arrived})
        heard = set(self.arrived) | set(self.rejected)
        self.timed_out = sorted(expected - heard)

    def balance_problems(self) -> list[str]:
        """What breaks the ledger's rules (see the module docstring); empty when it balances."""
        problems = []
        for name in ("expected", "arrived", "used", "timed_out"):
            values = getattr(self, name)
            if len(values) != len(set(values)):
                problems.append(f"{name} has duplicates: {values}")
        used, rejected, timed_out = set(self.used), set(self.rejected), set(self.timed_out)
        for a, b, name in ((used, rejected, "used and rejected"), (used, timed_out, "used and timed out"),
                           (rejected, timed_out, "rejected and timed out")):
            if a & b:
                problems.append(f"{sorted(a & b)} are both {name}")
        unaccounted = set(self.expected) - used - rejected - timed_out
        if unaccounted:
            problems.append(f"expected {sorted(unaccounted)} are neither used, rejected nor timed out")
        if not used <= set(self.arrived):
            problems.append(f"used {sorted(used - set(self.arrived))} never arrived")
        if timed_out & set(self.arrived):
            problems.append(f"{sorted(timed_out & set(self.arrived))} arrived but are counted as timed out")
        return problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "balance_problems": self.balance_problems()}


K = TypeVar("K", bound=Hashable)
L = TypeVar("L")


class History(Generic[K, L]):
    """The ``maxlen`` most recent ledgers, by key (a round, a (block, version), a step)."""

    def __init__(self, maxlen: int = 64) -> None:
        self._maxlen = maxlen
        self._ledgers: OrderedDict[K, L] = OrderedDict()

    def add(self, key: K, ledger: L) -> L:
        self._ledgers[key] = ledger
        self._ledgers.move_to_end(key)
        while len(self._ledgers) > self._maxlen:
            self._ledgers.popitem(last=False)
        return ledger

    def get(self, key: K) -> L | None:
        return self._ledgers.get(key)

    def values(self) -> list[L]:
        return list(self._ledgers.values())

    def __iter__(self) -> Iterator[L]:
        return iter(list(self._ledgers.values()))

    def last(self, count: int = 5) -> list[dict[str, Any]]:
        """The ``count`` most recent ledgers as JSON (``to_json`` of each)."""
        return [ledger.to_json() for ledger in list(self._ledgers.values())[-count:]]  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self._ledgers)
