"""What one TL++ virtual batch did, as the orchestrator records it (``StepLedger``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gossamer.peer.kit.ledger import Exchange


@dataclass(kw_only=True)
class StepLedger(Exchange):
    """What happened in one virtual batch (the kit's ``Exchange`` over the batch's nodes):
    ``expected`` are the nodes planned into it (``planned``: their sample counts), ``arrived``
    those that answered the forward pass, ``used`` those whose gradient the step applied, and
    ``rejected`` those dropped, with ``phase: reason``; plus the loss and accuracy over the
    forwarded samples, whether a gradient was applied, and the bytes and time it took; the
    deadline of each phase's requests to the nodes (``deadline_s``: the ceiling with fixed pacing)
    and the nodes flagged fail-slow when it ended (``slow``; ``core.pacing``)."""

    step: int
    epoch: int
    index: int
    mode: str
    planned: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    loss: float = math.nan
    accuracy: float = math.nan
    applied: bool = False
    note: str = ""
    bytes_sent: int = 0
    bytes_received: int = 0
    wall_s: float = 0.0
    deadline_s: dict[str, float] = field(default_factory=dict)  # phase -> its requests' deadline
    slow: list[str] = field(default_factory=list)  # nodes flagged fail-slow when the step ended

    def drop(self, node: str, phase: str, reason: object) -> None:
        """``node`` is left out of the step from ``phase`` on, for ``reason``."""
        self.reject(node, f"{phase}: {reason}"[:300])

    def give_up(self, note: str) -> list[str]:
        """The step is given up before any gradient, for ``note`` (too few nodes, say): every
        expected node not dropped already is rejected with it, so the ledger still balances.
        Returns those nodes: the step's failure is not theirs."""
        self.note = note
        spared = [node for node in self.expected if node not in self.rejected]
        for node in spared:
            self.drop(node, "step", note)
        return spared
