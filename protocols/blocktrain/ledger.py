"""``VersionLedger``: what happened to one block version (every update used, rejected with a reason,
or timed out). A stale update lands in the ledger of the version it was trained from; a second
refusal of a worker already used or refused there is kept apart (``refused_again``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gossamer.peer.kit.ledger import Exchange, History

MAX_LEDGERS = 256


@dataclass(kw_only=True)
class VersionLedger(Exchange):
    """What happened to block ``block`` while ``version`` was its current version.

    ``expected`` are the workers assigned to the block at any time while the version was open;
    ``closed`` says whether the version has been superseded (``next_version`` exists).
    """

    block: int
    version: int
    opened_at: float
    closed: bool = False
    closed_at: float | None = None
    deadline_extensions: int = 0
    train_loss: float | None = None
    update_norm: float | None = None
    deadline_s: float | None = None  # how long the version was allowed to wait for its updates
    slow: list[str] = field(default_factory=list)  # workers flagged fail-slow when it closed (not waited for)
    refused_again: list[tuple[str, str]] = field(default_factory=list)  # (worker, why): see ``reject``

    def reject(self, peer: str, reason: str) -> None:
        """``peer``'s update is refused. A worker this version already took an update from keeps
        it, and one it already refused keeps that refusal: the refusal of a later one (a duplicate,
        or stale once the version closed) goes to ``refused_again``. A worker that timed out and
        is heard late is rejected instead."""
        if peer in self.arrived or peer in self.rejected:
            self.refused_again.append((peer, reason))
            return
        super().reject(peer, reason)
        self.timed_out = [p for p in self.timed_out if p != peer]

    def close(self, *, used: list[str], now: float) -> None:
        """Seal the version: ``used`` updates went into the next one; expected silent workers timed out."""
        self.use(used)
        self.closed, self.closed_at = True, now
        self.settle()


def version_history() -> History[tuple[int, int], VersionLedger]:
    """Ledgers by (block, version), the most recent ``MAX_LEDGERS`` kept."""
    return History(maxlen=MAX_LEDGERS)
