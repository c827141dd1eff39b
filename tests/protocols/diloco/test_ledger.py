"""A learner's round ledger: its summary is exactly the round event the plugin documents, and the
W2 mix's outcome, written into it, leaves every expected learner accounted for."""

from __future__ import annotations

import torch

from gossamer.protocols.diloco import EVENTS
from gossamer.protocols.diloco.core.aggregate import W2Outcome
from gossamer.protocols.diloco.ledger import RoundLedger


def test_the_summary_and_the_runs_length_are_the_round_events_fields() -> None:
    ledger = RoundLedger(round=3, learners=["a", "b", "c"])
    ledger.pseudo_gradients.expected = ["b", "c"]
    ledger.pseudo_gradients.settle(["b"])
    ledger.record_w2(W2Outcome({}, used=("b",)))

    summary = ledger.summary()

    assert set(summary) | {"rounds"} == set(EVENTS["round"].fields) and "rounds" not in summary
    assert (summary["pgrads_used"], summary["timed_out"], summary["partial"], summary["problems"]) == (1, ["c"], True, [])


def test_a_fallback_that_refuses_what_arrived_still_balances_the_ledger() -> None:
    ledger = RoundLedger(round=0, learners=["a", "b", "c", "d"])
    w2 = ledger.pseudo_gradients
    w2.expected = ["b", "c", "d"]
    w2.settle(["b", "c"], refused={"d": "stale round 0 (at 1)"})
    note = "aggregation fell back to the own pseudo-gradient: krum needs n > 2f + 2"

    ledger.record_w2(W2Outcome({"w": torch.zeros(1)}, refused={"b": note, "c": note}, note=note))

    assert w2.used == [] and w2.rejected == {"b": note, "c": note, "d": "stale round 0 (at 1)"}
    assert ledger.note == note and ledger.balance_problems() == [] and ledger.partial()
