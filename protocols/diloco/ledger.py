"""A learner's round ledger: its two exchanges (the W1 parameter mix and the W2 pseudo-gradient
mix, each a ``kit.ledger.Exchange``), the round's losses, its time split (seconds of the learner's
clock) and its bytes; ``summary`` is the round event's fields, all from here. README.md, "A round,
step by step", says what each time and byte count covers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gossamer.peer.kit.ledger import Exchange
from gossamer.protocols.diloco.core.aggregate import W2Outcome


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
    w1_wait_s: float = 0.0
    w2_wait_s: float = 0.0
    w2_deadline_s: float = 0.0
    eval_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    note: str = ""
    slow: list[str] = field(default_factory=list)
    not_waited_for: list[str] = field(default_factory=list)

    def record_w2(self, outcome: W2Outcome) -> None:
        """Write the W2 mix's outcome into the settled pseudo-gradient exchange: its refusals (with
        their reasons), the neighbours it used, and its note."""
        for sender, why in outcome.refused.items():
            self.pseudo_gradients.reject(sender, why)
        self.pseudo_gradients.use(outcome.used)
        self.note = outcome.note

    def partial(self) -> bool:
        """Whether some expected contribution was not used (it timed out or was refused) or one of
        this learner's own sends failed."""
        return any(exchange.timed_out or exchange.rejected or exchange.send_failures
                   for exchange in (self.params, self.pseudo_gradients))

    def balance_problems(self) -> list[str]:
        """What breaks either exchange's accounting rules (``Exchange.balance_problems``)."""
        return [f"{name}: {problem}" for name, exchange in (("params", self.params),
                                                             ("pseudo_gradients", self.pseudo_gradients))
                for problem in exchange.balance_problems()]

    def summary(self) -> dict[str, Any]:
        """The ledger in short: the fields of the learner's ``round`` event, but ``rounds`` (the
        run's length, which the role adds)."""
        w2 = self.pseudo_gradients
        return {"round": self.round, "train_loss": self.train_loss, "heldout_loss": self.heldout_loss,
                "params_from": len(self.params.arrived), "pgrads_used": len(w2.used), "timed_out": w2.timed_out,
                "rejected": w2.rejected, "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "note": self.note, "compute_s": self.compute_s, "wall_s": self.wall_s, "w1_wait_s": self.w1_wait_s,
                "w2_wait_s": self.w2_wait_s, "eval_s": self.eval_s, "w2_deadline_s": self.w2_deadline_s,
                "slow": self.slow, "partial": self.partial(), "problems": self.balance_problems()}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params.to_json(), "pseudo_gradients": self.pseudo_gradients.to_json()}
