"""A learner's round ledger: its two exchanges (the W1 parameter mix and the W2 pseudo-gradient
mix), each a ``kit.ledger.Exchange``, plus the round's losses, time and bytes.

Time, in seconds of the learner's monotonic clock: ``wall_s`` is the whole round; ``compute_s``
the inner phase (H inner steps); ``w1_wait_s`` the wait after it for neighbours' parameters (at
most ``w1_grace_s``); ``w2_wait_s`` the blocking wait for pseudo-gradients (at most
``w2_deadline_s``); ``eval_s`` the held-out evaluation. What is left of ``wall_s`` is the
learner's own work on the event loop (snapshot, mixing, aggregation, outer step) and the wait for
its own sends. Bytes are safetensors bodies: ``bytes_sent`` delivered by this learner's sends,
``bytes_received`` accepted for this round by its end. ``slow``: the learners flagged fail-slow
after this round's W2 wait; ``not_waited_for``: the flagged ones its waits did not block on
(adaptive pacing).
"""

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
    w1_wait_s: float = 0.0
    w2_wait_s: float = 0.0
    w2_deadline_s: float = 0.0
    eval_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    note: str = ""
    slow: list[str] = field(default_factory=list)
    not_waited_for: list[str] = field(default_factory=list)

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

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params.to_json(), "pseudo_gradients": self.pseudo_gradients.to_json()}
