"""A learner's round ledger: its two exchanges (the W1 parameter mix and the W2 pseudo-gradient
mix), each a ``kit.ledger.Exchange``, plus the round's losses, time and bytes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gossamer.peer.kit.ledger import Exchange


@dataclass
class RoundLedger:
    """Everything that happened in one outer round of a learner."""

    round: int
    learners: list[str] = field(default_factory=list)
    params: Exchange = field(default_factory=Exchange)
    pseudo_gradients: Exchange = field(default_factory=Exchange)
    train_loss: float = float("nan")
    heldout_loss: float = float("nan")
    compute_s: float = 0.0
    wall_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params.to_json(), "pseudo_gradients": self.pseudo_gradients.to_json()}
