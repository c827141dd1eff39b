"""``StepLedger``: one per attempt of a step, applied or aborted: the coefficient exchange and the
gradient reduction as this shard saw them (each a balanced ``kit.ledger.Exchange``), the loss,
bytes and seconds, and for an aborted attempt why and whom it suspects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gossamer.peer.kit.ledger import Exchange


@dataclass
class StepLedger:
    """Everything one attempt of one step did on this shard."""

    step: int
    attempt: str
    leader: str
    members: list[str]
    index: int
    chunks: int
    context: int
    coefficients: Exchange = field(default_factory=Exchange)
    reduce: Exchange = field(default_factory=Exchange)
    loss: float | None = None  # the step's loss: every chunk's share summed (known from the update)
    chunk_loss: float | None = None  # this shard's share of it
    grad_norm: float | None = None
    clipped: dict[str, float] = field(default_factory=dict)  # on the leader: members whose share it scaled, norm before
    applied: bool = False
    aborted: str = ""
    suspects: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    compute_s: float = 0.0
    wall_s: float = 0.0

    def settle(self) -> None:
        """Close both exchanges: whatever was expected and never came timed out; what came was
        used if the step was applied, and discarded with it (rejected, saying so) if it aborted."""
        for exchange in (self.coefficients, self.reduce):
            exchange.settle()
            if self.applied:
                exchange.use(exchange.arrived)
                continue
            for peer in exchange.arrived:
                if peer not in exchange.rejected:
                    exchange.reject(peer, "discarded: the step aborted")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


LEDGER_FIELDS = tuple(StepLedger.__dataclass_fields__)
