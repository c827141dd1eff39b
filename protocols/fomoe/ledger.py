"""An expert host's round ledger: its three exchanges (the members' updates, their commits, and
the expert states it received when the placement changed), each a ``kit.ledger.Exchange``, plus
the round's losses, routing, placement, time and bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gossamer.peer.kit.ledger import Exchange


@dataclass
class RoundLedger:
    """Everything that happened in one round of an expert host."""

    round: int
    members: list[str] = field(default_factory=list)
    experts: list[int] = field(default_factory=list)
    """The experts this peer held in the round."""
    updates: Exchange = field(default_factory=Exchange)
    """Used: the agreed members' updates; rejected: malformed, or not every member got it."""
    commits: Exchange = field(default_factory=Exchange)
    transfers: Exchange = field(default_factory=Exchange)
    """Expert states received for the next round (expected: the sources of this peer's new experts)."""
    agreed: list[str] = field(default_factory=list)
    joiners: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    """Members of this round that are not members of the next."""
    next_experts: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    """Experts none of whose holders was an agreed member: restarted from the freshest copy."""
    idle_units: int = 0
    """(block, expert) units this peer holds that no holder ran a pair of (they kept their weights)."""
    train_loss: float = float("nan")
    heldout_loss: float = float("nan")
    skip_fraction: float = 0.0
    tokens: list[int] = field(default_factory=list)
    """Pairs run per expert in this round by the agreed members (column sums of their counts)."""
    update_bytes_sent: int = 0
    """Tensor bytes of this peer's update messages (what ``protocols.fomoe.core.update_bytes`` counts)."""
    bytes_sent: int = 0
    bytes_received: int = 0
    compute_s: float = 0.0
    wall_s: float = 0.0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
